"""Export: ONNX parity with PyTorch at several batch sizes, weights-only round trip without Lightning, and
the EMA weights (not the raw ones) taken out of a real training checkpoint."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from yolo11_lightning import YOLO11
from yolo11_lightning.export.command import _parity_check, main
from yolo11_lightning.export.formats import FORMATS
from yolo11_lightning.export.onnx import export_onnx, onnx_max_abs_diff, onnx_tolerance
from yolo11_lightning.model_files.weights import load_model, save_weights

REPO = Path(__file__).resolve().parents[3]


def _model(num_classes: int = 3, seed: int = 0) -> YOLO11:
    """A YOLO11n with non-trivial BatchNorm statistics and biases (so BN folding and every bias matter)."""
    torch.manual_seed(seed)
    model = YOLO11("n", num_classes, names=[f"class_{i}" for i in range(num_classes)])
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.3, 0.3)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
    return model.eval()


def test_onnx_matches_pytorch_at_any_batch_size(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    model = _model()
    path = export_onnx(model, tmp_path / "m.onnx", image_size=(64, 96))  # non-square: catches H/W mix-ups
    for batch in (1, 3):  # exported with batch 1: 3 proves the batch axis is dynamic
        images = torch.rand(batch, 3, 64, 96, generator=torch.Generator().manual_seed(batch))
        assert onnx_max_abs_diff(model, path, images) <= onnx_tolerance(model, images)  # 1e-4 + float32 steps
    proto = onnx.load(str(path))
    meta = {p.key: p.value for p in proto.metadata_props}
    assert json.loads(meta["class_names"]) == model.names and json.loads(meta["image_size"]) == [64, 96]
    # The reference loader's parsing: int() for stride/batch/channels, ast.literal_eval for the rest.
    assert (int(meta["stride"]), int(meta["batch"]), int(meta["channels"]), meta["task"]) == (
        32,
        1,
        3,
        "detect",
    )
    assert ast.literal_eval(meta["names"]) == dict(enumerate(model.names))
    assert ast.literal_eval(meta["imgsz"]) == [64, 96]
    assert ast.literal_eval(meta["args"]) == {
        "batch": 1,
        "dynamic": False,
        "half": False,
        "nms": False,
        "opset": 17,
    }
    dims = [[d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim] for v in (*proto.graph.input,
                                                                                        *proto.graph.output)]  # fmt: skip
    assert dims == [["batch", 3, 64, 96], ["batch", 7, 126]]
    with pytest.raises(ValueError, match="multiples of 32"):
        export_onnx(model, tmp_path / "bad.onnx", image_size=70)


def test_weights_round_trip_loads_without_lightning(tmp_path: Path) -> None:
    model = _model(num_classes=5, seed=1)
    path = save_weights(model, tmp_path / "w" / "model.pth")
    images = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(images)
    torch.save(images, tmp_path / "x.pt")
    # A fresh interpreter: the file alone rebuilds the model, and Lightning is never imported.
    code = (
        "import sys, torch\n"
        "from yolo11_lightning import load_model\n"
        f"m = load_model({str(path)!r})\n"
        f"x = torch.load({str(tmp_path / 'x.pt')!r})\n"
        "with torch.no_grad():\n"
        f"    torch.save(m(x), {str(tmp_path / 'y.pt')!r})\n"
        "print(m.scale, m.num_classes, ','.join(m.names), 'lightning' in sys.modules)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["n", "5", ",".join(model.names), "False"]
    # Same weights; only the CPU kernels' thread split (reduction order) may differ between processes.
    torch.testing.assert_close(torch.load(tmp_path / "y.pt"), expected, rtol=1e-5, atol=1e-5)
    # The payload is plain data: weights_only loading accepts it.
    assert torch.load(path, weights_only=True)["scale"] == "n"


def test_load_model_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"missing\.ckpt"):
        load_model(tmp_path / "missing.ckpt")
    text = tmp_path / "notes.ckpt"
    text.write_text("not a checkpoint")
    with pytest.raises(ValueError, match=r"notes\.ckpt"):
        load_model(text)
    foreign = tmp_path / "foreign.pth"
    torch.save({"format": "something-else/1", "state_dict": {}}, foreign)
    with pytest.raises(ValueError, match=r"foreign\.pth.*format"):
        load_model(foreign)
    assert main(["--ckpt_path", str(tmp_path / "missing.ckpt")]) == 1


def test_load_model_reads_reference_release_file(tmp_path: Path) -> None:
    pytest.importorskip("ultralytics")
    from model_oracle import reference_model, save_like_release

    ref = reference_model("n", 4, seed=3)
    path = save_like_release(ref, tmp_path / "yolo11n.pt", {i: f"c{i}" for i in range(4)})
    model = load_model(path)
    assert (model.scale, model.num_classes, model.names, model.training) == (
        "n",
        4,
        ["c0", "c1", "c2", "c3"],
        False,
    )


@pytest.fixture(scope="module")
def trained_checkpoint(tmp_path_factory: pytest.TempPathFactory, tiny_dataset: Path) -> Path:
    """A real Lightning checkpoint after 3 optimiser steps with EMA on (EMA != raw weights)."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    from yolo11_lightning import YOLO11Module, YOLODataModule

    root = tmp_path_factory.mktemp("ema_run")
    data = YOLODataModule(str(tiny_dataset), batch_size=4, image_size=64, num_workers=0, pin_memory=False)
    # nominal_batch = batch: one optimiser step (and one EMA update) per batch.
    module = YOLO11Module("n", data.num_classes, data.class_names, nominal_batch=4, log_images=0)
    # Saved by ModelCheckpoint during training, as in real runs (at the end of fit, WeightAveraging copies the
    # average into the model, after which raw and EMA weights coincide).
    saver = ModelCheckpoint(dirpath=root, filename="trained")
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=1, limit_train_batches=3, limit_val_batches=1, logger=False,
        callbacks=[saver], enable_progress_bar=False, enable_model_summary=False, default_root_dir=root,
    )  # fmt: skip
    trainer.fit(module, datamodule=data)
    return root / "trained.ckpt"


def test_export_writes_the_ema_weights(trained_checkpoint: Path, tmp_path: Path) -> None:
    checkpoint = torch.load(trained_checkpoint, map_location="cpu", weights_only=True)
    ema, raw = checkpoint["state_dict"], checkpoint["current_model_state"]
    assert any(not torch.equal(ema[k], raw[k]) for k in ema), "training made no EMA/raw difference to test"
    out = tmp_path / "exported.pth"
    assert main(["--ckpt_path", str(trained_checkpoint), "--format", "weights", "--out", str(out)]) == 0
    exported = load_model(out).state_dict()
    assert exported.keys() == {k[len("model.") :] for k in ema}
    for key, value in exported.items():
        assert torch.equal(value, ema[f"model.{key}"].float()), key
    names = torch.load(trained_checkpoint, weights_only=True)["hyper_parameters"]["class_names"]
    assert load_model(out).names == names


def test_export_command_onnx_checks_parity(trained_checkpoint: Path, tmp_path: Path, capsys) -> None:
    pytest.importorskip("onnxruntime")
    from yolo11_lightning.cli.main import main as cli_main

    out = tmp_path / "model.onnx"
    args = ["export", "--ckpt_path", str(trained_checkpoint), "--format", "onnx", "--image-size", "64"]
    assert cli_main([*args, "--out", str(out)]) == 0
    assert out.is_file() and "max |diff|" in capsys.readouterr().out
    assert os.path.getsize(out) > 1_000_000  # the weights are in the graph (YOLO11n: ~2.6M params)


def test_checkpoint_io_reads_real_checkpoints_through_the_guard(
    trained_checkpoint: Path, tmp_path: Path
) -> None:
    from yolo11_lightning.model_files.reference import CheckpointError
    from yolo11_lightning.training.checkpointing import AtomicCheckpointIO

    ours = AtomicCheckpointIO().load_checkpoint(trained_checkpoint)
    theirs = torch.load(trained_checkpoint, map_location="cpu", weights_only=True)
    assert ours.keys() == theirs.keys() and ours["state_dict"].keys() == theirs["state_dict"].keys()
    for key, value in theirs["state_dict"].items():
        assert torch.equal(ours["state_dict"][key], value), key
    assert ours["hyper_parameters"] == theirs["hyper_parameters"]
    half = tmp_path / "half.ckpt"
    half.write_bytes(trained_checkpoint.read_bytes()[: trained_checkpoint.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=r"half\.ckpt: not a readable torch checkpoint \(truncated"):
        AtomicCheckpointIO().load_checkpoint(half)
    with pytest.raises(FileNotFoundError, match=r"missing\.ckpt"):
        AtomicCheckpointIO().load_checkpoint(tmp_path / "missing.ckpt")


def test_checkpoint_io_names_a_reference_file(tmp_path: Path) -> None:
    pytest.importorskip("ultralytics")
    from model_oracle import reference_model, save_like_release

    from yolo11_lightning.model_files.torch_file import ModelObjectsError
    from yolo11_lightning.training.checkpointing import AtomicCheckpointIO

    path = save_like_release(reference_model("n", 4), tmp_path / "yolo11n.pt")
    with pytest.raises(
        ModelObjectsError, match=r"yolo11n\.pt: holds pickled model objects \(a reference \.pt"
    ):
        AtomicCheckpointIO().load_checkpoint(path)


def test_export_and_predict_default_to_the_trained_size(
    trained_checkpoint: Path, tiny_dataset: Path, tmp_path: Path, capsys
) -> None:
    """A real checkpoint trained at 64 px: export writes a weights file that remembers 64 and a 64-px ONNX file
    from it, and predict on the ONNX file runs at 64, each saying which size it used and why."""
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from yolo11_lightning.cli.main import main as cli_main
    from yolo11_lightning.model_files.image_size import file_image_size

    assert file_image_size(trained_checkpoint) == 64  # Lightning's datamodule_hyper_parameters
    weights = tmp_path / "model.pth"
    assert main(["--ckpt_path", str(trained_checkpoint), "--format", "weights", "--out", str(weights)]) == 0
    assert file_image_size(weights) == 64
    out = tmp_path / "model.onnx"
    assert main(["--ckpt_path", str(weights), "--out", str(out), "--no-check"]) == 0
    said = capsys.readouterr().out
    assert "image size 64: the size the model was trained at (--image-size to change)" in said
    assert ", input 64," in said
    props = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
    assert ast.literal_eval(props["imgsz"]) == [64, 64]
    image = sorted((tiny_dataset.parent / "images" / "val").glob("*.png"))[0]
    args = ["predict", "--ckpt_path", str(out), "--source", str(image), "--out", str(tmp_path / "p")]
    assert cli_main([*args, "--device", "cpu", "--no-save"]) == 0  # a fixed 64-px file: 640 would fail
    assert "image size 64: the size the model was trained at" in capsys.readouterr().out


def test_a_missing_onnx_extra_is_one_line(
    tiny_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """After `pip install -e .` (no onnx): export names the extra in one line instead of torch's 40-line
    traceback and writes nothing; without onnxruntime the parity check and an .onnx file say the same."""
    pytest.importorskip("onnxruntime")
    from yolo11_lightning.cli.main import main as cli_main
    from yolo11_lightning.extras import MissingExtraError

    weights = save_weights(_model(), tmp_path / "model.pth", image_size=64)
    out = tmp_path / "model.onnx"
    extra = 'pip install "yolo11_lightning[onnx]"'
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "onnx", None)  # `import onnx` raises ImportError, as when not installed
        assert cli_main(["export", "--ckpt_path", str(weights), "--out", str(out)]) == 1
        said = capsys.readouterr()
        assert said.err == f"error: export needs onnx: {extra}\n" and not out.exists()
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    assert _parity_check(_model(), FORMATS["onnx"], out, (64, 64), dynamic=False)  # skipped, and says why
    assert f"parity check skipped: running {out} needs onnxruntime: {extra}" in capsys.readouterr().out
    out.write_bytes(b"an exported graph")  # onnxruntime is asked for before the file is read
    image = sorted((tiny_dataset.parent / "images" / "val").glob("*.png"))[0]
    args = ["predict", "--ckpt_path", str(out), "--source", str(image), "--out", str(tmp_path / "p")]
    assert cli_main(args) == 1
    assert capsys.readouterr().err == f"error: running {out} needs onnxruntime: {extra}\n"
    with pytest.raises(MissingExtraError):  # `validate --model.weights x.onnx`: the CLI prints it as one line
        from yolo11_lightning.model_files.onnx_runtime import OnnxDetector

        OnnxDetector(out)
