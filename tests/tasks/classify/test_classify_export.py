"""Prediction and ONNX export of a classifier: top-5 json and drawings, and a file the reference's ONNX client runs.

A YOLO11n-cls of 3 classes with spread-out class logits (its head's linear layer redrawn, so the probabilities are
far from uniform) is written as a weights file, exported by ``yolo11-lightning export`` (64 px, ``--check-data`` on a
tiny ImageFolder) and run by the oracle's ``YOLO("model.onnx", task="classify")``: its probabilities equal our
PyTorch model's on our evaluation transform of the same files (which equals the oracle's, test_classify_data).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path
from types import SimpleNamespace

os.environ["YOLO_OFFLINE"] = "1"  # before any import of the reference package

import cv2
import numpy as np
import pytest
import torch

from yolo11_lightning.export.command import main as export_main
from yolo11_lightning.model_files.weights import save_weights
from yolo11_lightning.nn.yolo11 import YOLO11
from yolo11_lightning.predict.command import predict
from yolo11_lightning.tasks import create_model
from yolo11_lightning.tasks.classify.augment import ClassifyTransform

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

SIZE = 64
NAMES = ["ellipse", "rectangle", "triangle"]


def _probabilities(model: YOLO11, paths: list[Path], inputs_only: bool = False) -> torch.Tensor:
    """The model's probabilities (B, nc) on our evaluation transform of the files (or those inputs)."""
    transform = ClassifyTransform(SIZE)
    images = [transform(cv2.cvtColor(cv2.imread(str(p)), cv2.COLOR_BGR2RGB)) for p in paths]
    batch = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float() / 255
    if inputs_only:
        return batch
    with torch.no_grad():
        return model.eval()(batch)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    from yolo11_lightning.synthetic.classes import make_classes_dataset

    root = tmp_path_factory.mktemp("cls_export")
    data = root / "data"
    make_classes_dataset(data, num_train=6, num_val=6, image_size=80, num_classes=3)
    torch.manual_seed(0)
    model = create_model("n", 3, task="classify")
    model.names = list(NAMES)
    images = sorted((data / "val").rglob("*.png"))
    for (
        m
    ) in model.modules():  # BatchNorm statistics of these images: features that differ from image to image
        if isinstance(m, torch.nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None
    with torch.no_grad():
        model.train()(_probabilities(model, images, inputs_only=True))
    torch.nn.init.normal_(model.head.linear.weight, std=0.2)  # logits of a few units: not saturated
    weights = save_weights(model, root / "cls.pth")
    onnx = root / "cls.onnx"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = export_main(["--ckpt_path", str(weights), "--image-size", str(SIZE), "--out", str(onnx),
                            "--check-data", str(data), "--num-workers", "0", "--accelerator", "cpu"])  # fmt: skip
    return SimpleNamespace(
        root=root, data=data, model=model, onnx=onnx, code=code, images=images, printed=printed.getvalue()
    )


def test_export_check_data_reports_top1_top5(exported: SimpleNamespace) -> None:
    """The file's metadata and outputs, and ``--check-data``: top-1 / top-5 of the checkpoint and of the file."""
    import onnx

    assert exported.code == 0, exported.printed
    proto = onnx.load(str(exported.onnx))
    meta = {p.key: p.value for p in proto.metadata_props}
    assert meta["task"] == "classify" and meta["imgsz"] == f"[{SIZE}, {SIZE}]"
    (output,) = proto.graph.output
    assert [d.dim_value or d.dim_param for d in output.type.tensor_type.shape.dim] == ["batch", 3]
    lines = exported.printed.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split() == ["top1", "top5"])
    checkpoint, from_file, difference = (lines[header + k].split() for k in (1, 2, 3))
    assert checkpoint[0] == "checkpoint" and from_file[0] == "onnx" and checkpoint[1:] == from_file[1:]
    assert difference[1:] == ["+0.0000", "+0.0000"]


def test_oracle_onnx_client_gives_our_probabilities(exported: SimpleNamespace) -> None:
    from ultralytics import YOLO

    theirs = YOLO(str(exported.onnx), task="classify").predict(
        [str(p) for p in exported.images], imgsz=SIZE, verbose=False
    )
    import onnxruntime

    ours = _probabilities(exported.model, exported.images)
    # Far from uniform, and not the same answer for every image: the comparison means something.
    assert (ours - 1 / 3).abs().max() > 0.3 and ours.argmax(1).unique().numel() > 1
    session = onnxruntime.InferenceSession(str(exported.onnx), providers=["CPUExecutionProvider"])
    inputs = _probabilities(exported.model, exported.images, inputs_only=True).numpy()
    from_file = torch.from_numpy(session.run(None, {session.get_inputs()[0].name: inputs})[0])
    for result, expected, run in zip(theirs, ours, from_file):
        assert result.names == dict(enumerate(NAMES))
        # The client's preprocessing and reading of our file: the file's own output, to float precision.
        torch.testing.assert_close(result.probs.data.float().cpu(), run, atol=1e-6, rtol=0)
        # ONNX Runtime against PyTorch in float32: 1.7e-5 to 3.5e-5 measured on these weights (kernel order).
        torch.testing.assert_close(result.probs.data.float().cpu(), expected, atol=1e-4, rtol=0)


def test_predict_writes_top5_json_and_drawings(exported: SimpleNamespace, tmp_path: Path) -> None:
    source = exported.data / "val" / "rectangle"
    files = sorted(source.glob("*.png"))
    writer = predict(exported.model, source, tmp_path / "out", image_size=SIZE, progress_bar=False)
    rows = json.loads((tmp_path / "out" / "predictions.json").read_text())
    assert writer.num_images == len(files) == len(rows) > 0
    expected = _probabilities(exported.model, files)
    for row, probs in zip(sorted(rows, key=lambda r: r["file_name"]), expected):
        top = probs.argsort(descending=True).tolist()
        assert [r["category_id"] for r in row["top5"]] == top
        assert [r["category_name"] for r in row["top5"]] == [NAMES[c] for c in top]
        assert row["top5"][0]["score"] == pytest.approx(probs[top[0]].item(), abs=1e-4)  # json: 5 decimals
        drawn = cv2.imread(str(tmp_path / "out" / row["file_name"]))
        assert drawn is not None and not np.array_equal(drawn, cv2.imread(str(source / row["file_name"])))


def test_a_classifier_the_reference_trained_loads_with_its_pickled_transforms(tmp_path: Path) -> None:
    """The reference's trainer keeps the classifier's preprocessing (torchvision transforms) in ``model.transforms``
    of ``last.pt`` / ``best.pt``: the guarded reader reads them as inert stand-ins and the weights load."""
    from model_oracle import reference_task_model, save_like_release
    from ultralytics.data.augment import classify_transforms

    from yolo11_lightning.model_files.weights import load_model

    reference = reference_task_model("classify", "n", 3)
    reference.transforms = classify_transforms(SIZE)
    path = save_like_release(reference, tmp_path / "trained.pt", names=dict(enumerate(NAMES)))
    model = load_model(path, task=None)
    assert (model.task, model.num_classes, model.names) == ("classify", 3, NAMES)
    torch.testing.assert_close(
        model.state_dict()["head.linear.weight"], reference.model[10].linear.weight.detach().half().float()
    )
