"""benchmarks/device/gpu.py, the device script for a lent GPU, checked where no GPU is: the TF32 setting it uses must
be the one Lightning can read back, and its order and budget must put the checks no CPU can make first."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks" / "device"))
import gpu  # noqa: E402  (benchmarks/device/gpu.py)

FIRST = ["tf32-probe", "sync-audit", "ddp 2-rank", "ddp 16-mixed", "resume 16>bf16"]


@pytest.fixture
def torch_fp32_defaults():
    before = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    yield
    torch.set_float32_matmul_precision(before[0])
    torch.backends.cudnn.allow_tf32 = before[1]


@pytest.mark.parametrize(("mode", "lightning_reads"), [("tf32", "high"), ("ieee", "highest")])
def test_fp32_mode_reads_back_the_way_lightnings_cuda_accelerator_reads_it(
    mode: str, lightning_reads: str, torch_fp32_defaults
) -> None:
    """``CUDAAccelerator.setup_device`` calls ``torch.get_float32_matmul_precision()``; after the newer
    ``fp32_precision`` flags that call raises (torch refuses a mix of the APIs), so every TF32 row crashed."""
    gpu.set_fp32_precision(mode)
    assert torch.get_float32_matmul_precision() == lightning_reads
    assert gpu.tf32_state() == {"matmul": mode, "cudnn_conv": mode}


def _sections(tmp_path: Path, smoke: bool, cuda: bool) -> list:
    args = argparse.Namespace(cpu_smoke=smoke, sections="")
    settings = gpu.Settings.smoke() if smoke else gpu.Settings()
    return gpu.build_sections(args, settings, tmp_path, cuda)


def test_device_script_runs_the_checks_no_cpu_can_make_first_within_a_rerunnable_budget(
    tmp_path: Path,
) -> None:
    sections = _sections(tmp_path, smoke=False, cuda=True)
    assert [s.name for s in sections[: len(FIRST)]] == FIRST
    # 240 s of sections: with the install and the machine's start, a rerun fits in 15 device-minutes
    assert gpu.BUDGET_S <= 240 and sum(s.need for s in sections[: len(FIRST)]) <= gpu.BUDGET_S - gpu.MARGIN_S
    by_name = {s.name: s for s in sections}
    two = by_name["ddp 2-rank"]
    assert (
        two.argv[two.argv.index("--trainer.strategy", two.argv.index("ddp") + 1) + 1] == "gpu.SharedDeviceDDP"
    )
    assert two.spec["ranks"] == 2 and two.spec["backend"] == "gloo" and "cuda" in two.argv
    assert by_name["ddp 16-mixed"].spec["backend"] == "nccl"
    resume = by_name["resume 16>bf16"]
    assert resume.needs == "ddp 16-mixed" and "16-mixed" in resume.spec["first"]
    assert resume.spec["second"][-2:] == ["--ckpt_path", "last"] and "bf16-mixed" in resume.spec["second"]


def test_cpu_smoke_runs_every_first_section_on_the_cpu(tmp_path: Path) -> None:
    sections = {s.name: s for s in _sections(tmp_path, smoke=True, cuda=False)}
    assert all(not sections[name].skip for name in FIRST)
    assert "cpu" in sections["ddp 2-rank"].argv and sections["ddp 16-mixed"].spec["backend"] == "gloo"


def test_shared_device_ddp_puts_every_rank_on_one_device() -> None:
    strategy = gpu.SharedDeviceDDP(device="cpu")
    assert strategy.parallel_devices == [torch.device("cpu")] * 2
    assert strategy.process_group_backend == "gloo"
    assert gpu.SharedDeviceDDP(processes=2, device="cuda").parallel_devices == [torch.device("cuda", 0)] * 2


def test_tensorrt_section_is_a_row_naming_why_where_it_cannot_run(tmp_path: Path) -> None:
    """No tensorrt (the lent machine's case) or no GPU: the section is skipped with its reason, which gpu.md's
    TensorRT table shows; with both it reads the ``ddp 16-mixed`` fit's checkpoint and synthetic set."""
    from importlib import util

    section = {s.name: s for s in _sections(tmp_path, smoke=False, cuda=True)}["tensorrt"]
    assert section.needs == "ddp 16-mixed" and section.spec["root"] == str(tmp_path / "ddp_16-mixed")
    assert section.spec["synthetic_dir"] == str(tmp_path / "synthetic_320") and section.spec["size"] == 320
    if util.find_spec("tensorrt") is None:
        assert section.skip.startswith("skipped: tensorrt not installed")
    smoke = {s.name: s for s in _sections(tmp_path, smoke=True, cuda=False)}["tensorrt"]
    assert smoke.skip == "skipped: a TensorRT engine needs a CUDA GPU"
    record = gpu.run_section(smoke, time.monotonic() + 100, tmp_path)
    assert record["status"] == smoke.skip
    report = {"machine": gpu.machine(), "sections": [record], "cpu_smoke": True, "commit": "-", "budget_s": 240.0,
              "wall_s": 0.0, "started": "-"}  # fmt: skip
    last = gpu.render(report).strip().splitlines()[-1]
    assert [cell.strip() for cell in last.strip("|").split("|")] == ["-"] * 6 + [smoke.skip]


def test_tensorrt_engines_are_built_from_fixed_size_onnx_files_with_metadata(tmp_path: Path) -> None:
    """What the section hands TensorRT's parser: fp32 and fp16-weight ONNX files of the checkpoint at its size,
    batch axis free (the engine's profile spans 1 to the batch), with the metadata the engine's runtime reads."""
    onnx = pytest.importorskip("onnx")
    import tensorrt_engine

    from yolo11_lightning.tasks import create_model

    model = create_model("n", 3, task="pose", kpt_shape=(4, 3)).eval()
    files = tensorrt_engine.onnx_for_tensorrt(model, tmp_path, 64)
    assert sorted(files) == ["fp16", "fp32"]
    for precision, path in files.items():
        proto = onnx.load(str(path))
        dims = proto.graph.input[0].type.tensor_type.shape.dim
        assert [d.dim_param or d.dim_value for d in dims][1:] == [3, 64, 64] and dims[0].dim_param
        meta = {p.key: p.value for p in proto.metadata_props}
        assert (meta["task"], meta["imgsz"], meta["kpt_shape"]) == ("pose", "[64, 64]", "[4, 3]")
        halves = sum(t.data_type == onnx.TensorProto.FLOAT16 for t in proto.graph.initializer)
        assert (halves > 0) == (precision == "fp16"), precision
