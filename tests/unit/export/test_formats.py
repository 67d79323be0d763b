"""The export formats beside ONNX (issue 43): each task's TorchScript and OpenVINO files run by our runtimes give the
PyTorch model's raw outputs, carry the metadata the reference's loader reads, and bad input is one line.

One YOLO11n per task with non-trivial BatchNorm statistics (so every output channel varies with the image) is
exported at 64 px to each format once (a module fixture); the parity checks run a batch of 3 random images.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

os.environ["YOLO_OFFLINE"] = "1"  # before any import of the reference package

import numpy as np
import pytest
import torch
import yaml

from yolo11_lightning.export.formats import FORMATS, export_file, get_format, missing_extra
from yolo11_lightning.export.onnx import onnx_tolerance
from yolo11_lightning.model_files.exported_files import open_exported
from yolo11_lightning.model_files.weights import save_weights
from yolo11_lightning.tasks import TASKS, create_model

pytest.importorskip("onnx")
pytest.importorskip("openvino")

SIZE = 64
NAMES = ["circle", "square", "triangle"]
KPT_SHAPE = (4, 3)
FP32 = ("torchscript", "openvino")


def _model(task: str):
    torch.manual_seed(0)
    options = {"kpt_shape": KPT_SHAPE} if task == "pose" else {}
    model = create_model("n", len(NAMES), task=task, **options)
    model.names = list(NAMES)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.3, 0.3)
                m.running_var.uniform_(0.5, 2.0)
                m.bias.uniform_(-0.2, 0.2)
    return model.eval()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, SimpleNamespace]:
    """Per task: the model and its torchscript and openvino exports (openvino-fp16 for detection and segmentation)."""
    root = tmp_path_factory.mktemp("formats")
    made = {}
    for task in TASKS:
        model = _model(task)
        paths = {
            name: export_file(get_format(name), model, root / f"{task}{FORMATS[name].suffix}", (SIZE, SIZE))
            for name in (*FP32, *(["openvino-fp16"] if task in ("detect", "segment") else []))
        }
        made[task] = SimpleNamespace(model=model, **{k.replace("-", "_"): v for k, v in paths.items()})
    return made


@pytest.mark.parametrize("task", list(TASKS))
def test_each_format_gives_the_models_outputs(files: dict[str, SimpleNamespace], task: str) -> None:
    made = files[task]
    images = torch.rand(3, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = made.model(images)
    expected = list(expected) if isinstance(expected, tuple) else [expected]
    tolerance = onnx_tolerance(made.model, images)
    runs = [("torchscript", made.torchscript), ("openvino", made.openvino)]
    runs += [("fp16", made.openvino_fp16)] if hasattr(made, "openvino_fp16") else []
    for name, path in runs:
        runner = open_exported(path, len(NAMES), task=None)
        assert (runner.task, runner.names, runner.input_shape) == (task, NAMES, (SIZE, SIZE)), name
        assert runner.kpt_shape == (KPT_SHAPE if task == "pose" else None)
        got = runner(images)
        got = list(got) if isinstance(got, tuple) else [got]
        assert [g.shape for g in got] == [e.shape for e in expected], name
        for g, e in zip(got, expected):
            # fp16 weights: a relative error of about 1e-3 of the output's range
            allowed = tolerance if name != "fp16" else 3e-3 * float(e.abs().max()) + 1e-3
            assert float((g - e).abs().max()) <= allowed, f"{task} {name}"
        assert float(expected[0].std()) > 1e-3  # the outputs vary: the comparison means something


def test_metadata_is_where_the_reference_loader_reads_it(files: dict[str, SimpleNamespace]) -> None:
    """TorchScript: the archive's config.txt (JSON); OpenVINO: metadata.yaml beside the .xml, in a
    ``<stem>_openvino_model`` folder; both parsed as the reference's AutoBackend parses them."""
    from ultralytics.nn.autobackend import AutoBackend

    pose = files["pose"]
    extra = {"config.txt": ""}
    torch.jit.load(str(pose.torchscript), _extra_files=extra)
    meta = json.loads(extra["config.txt"])
    assert (meta["task"], meta["imgsz"], meta["kpt_shape"], meta["stride"]) == ("pose", [64, 64], [4, 3], 32)
    folder = pose.openvino
    assert folder.name == "pose_openvino_model" and sorted(p.name for p in folder.iterdir()) == [
        "metadata.yaml", "pose.bin", "pose.xml"]  # fmt: skip
    assert yaml.safe_load((folder / "metadata.yaml").read_text())["names"] == dict(enumerate(NAMES))
    for path in (pose.torchscript, folder):
        backend = AutoBackend(str(path), device=torch.device("cpu"))
        assert (backend.task, backend.names, backend.kpt_shape, backend.imgsz, backend.stride) == (
            "pose", dict(enumerate(NAMES)), [4, 3], [64, 64], 32), path  # fmt: skip


def test_unknown_format_lists_the_known_ones(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from yolo11_lightning.cli.main import main

    weights = save_weights(_model("detect"), tmp_path / "m.pth", image_size=SIZE)
    assert main(["export", "--ckpt_path", str(weights), "--format", "coreml"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "error: unknown export format 'coreml'; known: onnx, onnx-fp16, onnx-int8, torchscript, openvino, "
        "openvino-fp16, openvino-int8, executorch, weights\n"
    )


def test_a_missing_runtime_names_its_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from yolo11_lightning.cli.main import main

    weights = save_weights(_model("detect"), tmp_path / "m.pth", image_size=SIZE)
    monkeypatch.setitem(sys.modules, "openvino", None)  # `import openvino` fails, as when not installed
    monkeypatch.setitem(sys.modules, "nncf", None)
    assert main(["export", "--ckpt_path", str(weights), "--format", "openvino"]) == 1
    assert (
        capsys.readouterr().err == 'error: export needs openvino: pip install "yolo11_lightning[openvino]"\n'
    )
    assert not (tmp_path / "m_openvino_model").exists()
    assert (
        missing_extra(FORMATS["openvino-int8"])
        == 'export needs openvino: pip install "yolo11_lightning[int8]"'
    )
    assert missing_extra(FORMATS["torchscript"]) is None
    monkeypatch.setitem(sys.modules, "executorch", None)
    assert main(["export", "--ckpt_path", str(weights), "--format", "executorch"]) == 1
    assert (
        capsys.readouterr().err
        == 'error: export needs executorch: pip install "yolo11_lightning[executorch]"\n'
    )
    assert not (tmp_path / "m.pte").exists()
    with pytest.raises(
        ImportError,
        match=r'running .*m_openvino_model needs openvino: pip install "yolo11_lightning\[openvino\]"',
    ):
        open_exported(tmp_path / "m_openvino_model")
    (tmp_path / "m.pte").write_bytes(b"")
    with pytest.raises(
        ImportError,
        match=r'running .*m\.pte needs executorch: pip install "yolo11_lightning\[executorch\]"',
    ):
        open_exported(tmp_path / "m.pte")


def test_int8_calibration_without_a_readable_image_names_the_split(tmp_path: Path, capsys) -> None:
    from data_files import write_yaml

    from yolo11_lightning.cli.main import main

    for split in ("train", "val"):
        folder = tmp_path / "images" / split
        folder.mkdir(parents=True)
        (folder / "broken.png").write_bytes(b"not an image")
        (tmp_path / "labels" / split).mkdir(parents=True)
        (tmp_path / "labels" / split / "broken.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    data = write_yaml(tmp_path / "data.yaml", {"path": str(tmp_path), "train": "images/train", "val": "images/val",
                                               "names": dict(enumerate(NAMES))})  # fmt: skip
    weights = save_weights(_model("detect"), tmp_path / "m.pth", image_size=SIZE)
    code = main(
        ["export", "--ckpt_path", str(weights), "--format", "onnx-int8", "--calibration-data", str(data)]
    )
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1, err
    assert err.startswith(f"error: {data}: split `train`") and "calibrate INT8" in err, err
    assert not (tmp_path / "m_int8.onnx").exists()


def test_int8_without_calibration_data_says_what_to_give(tmp_path: Path, capsys) -> None:
    from yolo11_lightning.cli.main import main

    weights = save_weights(_model("detect"), tmp_path / "m.pth", image_size=SIZE)
    assert main(["export", "--ckpt_path", str(weights), "--format", "openvino-int8"]) == 1
    assert "--calibration-data DATA_YAML" in capsys.readouterr().err


def test_exported_outputs_keep_their_dtype_contract(files: dict[str, SimpleNamespace]) -> None:
    """float32 out, on the images' device, for every runtime (the validator and the writer take them as is)."""
    images = torch.rand(1, 3, SIZE, SIZE)
    for path in (files["segment"].torchscript, files["segment"].openvino_fp16):
        predictions, protos = open_exported(path, task="segment")(images)
        assert predictions.dtype == protos.dtype == torch.float32
        assert isinstance(predictions.numpy(), np.ndarray)


def test_benchmark_row_of_a_missing_runtime_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from yolo11_lightning.cli.main import main

    weights = save_weights(_model("detect"), tmp_path / "m.pth", image_size=SIZE)
    monkeypatch.setitem(sys.modules, "openvino", None)
    monkeypatch.setitem(sys.modules, "executorch", None)
    args = ["benchmark", "--model", str(weights), "--data", "unused.yaml", "--formats",
            "openvino,openvino-int8,executorch", "--runs", "1", "--out", str(tmp_path / "bench")]  # fmt: skip
    assert main(args) == 0
    rows = (tmp_path / "bench" / "benchmark.csv").read_text().splitlines()
    assert rows[0].startswith("format,size_mb,latency_ms_b1,latency_ms_b8,metric,value,difference,note")
    assert rows[2] == 'openvino,,,,,,,"export needs openvino: pip install ""yolo11_lightning[openvino]"""'
    assert rows[3].startswith("openvino-int8,") and "yolo11_lightning[int8]" in rows[3]
    assert (
        rows[4] == 'executorch,,,,,,,"export needs executorch: pip install ""yolo11_lightning[executorch]"""'
    )
    assert (tmp_path / "bench" / "benchmark.png").is_file() and "Traceback" not in capsys.readouterr().err
