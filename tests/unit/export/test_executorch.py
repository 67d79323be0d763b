"""ExecuTorch (``.pte``, XNNPACK) export (issue 43): the program carries its metadata, runs any batch through
our runtime with the PyTorch model's outputs, scores the checkpoint's metric within 0.001 and predicts what
the checkpoint predicts. Skipped where the ``executorch`` extra is not installed (it is not in ``dev``).

Two tiny YOLO11n, a detector and a classifier, made image-driven (BatchNorm statistics of the validation
images themselves; the classifier's logits spread), each exported once at 64 px (a module fixture: lowering to
XNNPACK takes most of this file's time). The detector's validation labels are its own detections, every other
one shifted, so mAP sits inside (0, 1) and moves with any box or score change.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml
from data_files import pattern, write_image, write_labels, write_yaml

from yolo11_lightning.export.check import compare
from yolo11_lightning.export.formats import FORMATS, export_file, output_path
from yolo11_lightning.model_files.exported_files import open_exported
from yolo11_lightning.nn.yolo11 import YOLO11
from yolo11_lightning.predict.command import predict
from yolo11_lightning.tasks import create_model

pytest.importorskip("executorch.runtime", reason="the executorch extra is not installed")

SIZE = 64
NAMES = ["circle", "square", "triangle"]


def _image_driven(model: YOLO11, images: torch.Tensor) -> YOLO11:
    """BatchNorm statistics of ``images``: every channel varies from image to image."""
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None
    with torch.no_grad():
        model.train()(images)
    return model.eval()


def _batch(paths: list[Path]) -> torch.Tensor:
    import cv2

    arrays = [cv2.cvtColor(cv2.imread(str(p)), cv2.COLOR_BGR2RGB) for p in paths]
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).float() / 255


def _detect_dataset(model: YOLO11, root: Path) -> Path:
    """Square images labelled with ``model``'s own confident detections (every other box shifted)."""
    images = [
        write_image(root / "images" / "val" / f"im{i}.png", pattern(SIZE, SIZE, seed=i)) for i in range(8)
    ]
    _image_driven(model, _batch(images))
    with torch.no_grad():  # class logits spread, so a few boxes per image pass the 0.25 threshold
        for conv in model.head.cv3:
            conv[-1].bias.normal_(-2.0, 1.5)
    predict(
        model, root / "images" / "val", root / "found", image_size=SIZE, save_media=False, progress_bar=False
    )
    rows = json.loads((root / "found" / "predictions.json").read_text())
    rng = np.random.default_rng(0)
    for image in images:
        lines = []
        for j, r in enumerate(
            sorted((r for r in rows if r["file_name"] == image.name), key=lambda r: -r["score"])
        ):
            x, y, w, h = r["bbox"]
            x += rng.uniform(-0.2, 0.2) * w if j % 2 else 0.0
            cx, cy = min(max(x + w / 2, 0.0), SIZE) / SIZE, (y + h / 2) / SIZE
            lines.append(f"{int(r['category_id'])} {cx:.6f} {cy:.6f} {w / SIZE:.6f} {h / SIZE:.6f}")
        assert lines, f"{image.name}: the model detects nothing to label"
        write_labels(root / "labels" / "val" / f"{image.stem}.txt", list(dict.fromkeys(lines))[:10])
    split = {"path": str(root), "train": "images/val", "val": "images/val", "names": dict(enumerate(NAMES))}
    return write_yaml(root / "data.yaml", split)


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, SimpleNamespace]:
    """Per task (detect, classify): the model, its dataset and its ``.pte``."""
    from yolo11_lightning.synthetic.classes import make_classes_dataset

    root = tmp_path_factory.mktemp("executorch")
    fmt = FORMATS["executorch"]
    torch.manual_seed(0)
    detector = create_model("n", len(NAMES), task="detect")
    detector.names = list(NAMES)
    detect_data = _detect_dataset(detector, root / "detect")
    classify_data = make_classes_dataset(
        root / "classify", num_train=3, num_val=6, image_size=SIZE, num_classes=3
    )
    classifier = create_model("n", len(NAMES), task="classify")
    classifier.names = list(yaml.safe_load(classify_data.read_text())["names"])  # the data set's order
    _image_driven(classifier, _batch(sorted((root / "classify" / "val").rglob("*.png"))))
    torch.nn.init.normal_(classifier.head.linear.weight, std=0.2)  # logits of a few units: not saturated
    made = {}
    for task, model, data in (("detect", detector, detect_data), ("classify", classifier, classify_data)):
        path = export_file(fmt, model, output_path(fmt, root / f"{task}.pt"), (SIZE, SIZE))
        made[task] = SimpleNamespace(model=model, data=data, path=path, root=root)
    return made


def test_program_carries_its_metadata_and_runs_any_batch(programs: dict[str, SimpleNamespace]) -> None:
    """One file: ``metadata`` (task, names, size) read back; a batch of 3 (the program is planned for batch 1)
    gives the model's outputs, each image's own."""
    for task, made in programs.items():
        # its own validation images: outputs away from saturation
        images = _batch(sorted(made.data.parent.rglob("val/**/*.png"))[:3])
        assert made.path.name == f"{task}.pte" and made.path.is_file()
        runner = open_exported(made.path, len(NAMES), task=None)
        assert (runner.task, runner.names, runner.input_shape, runner.runtime) == (
            task, made.model.names, (SIZE, SIZE), "ExecuTorch")  # fmt: skip
        with torch.no_grad():
            expected = made.model(images)
        got = runner(images)
        assert got.shape == expected.shape and got.dtype == torch.float32
        # each image's own outputs, stacked in order (the program runs one image per call)
        assert float((got[0] - got[2]).abs().max()) > 1e-3
        assert float((got - expected).abs().max()) <= 1e-3 * max(1.0, float(expected.abs().max())), task


def test_validate_scores_the_program_like_the_checkpoint(programs: dict[str, SimpleNamespace]) -> None:
    """fp32 through XNNPACK: mAP50-95 (detect) and top-1 (classify) within 0.001 of the checkpoint's."""
    for task, made in programs.items():
        check = compare(made.model, made.path, str(made.data), (SIZE, SIZE), dynamic=False, batch_size=4,
                        num_workers=0, accelerator="cpu", label="executorch")  # fmt: skip
        metric, gap = check.worst_difference()
        print(f"{task}:\n{check.table()}")
        assert gap <= 1e-3, f"{task} {metric}: {check.table()}"
        if task == "detect":
            assert 0.2 < check.checkpoint["mAP50-95"] < 0.95


def test_predict_runs_the_program_with_the_checkpoints_output(
    programs: dict[str, SimpleNamespace], tmp_path: Path
) -> None:
    made = programs["detect"]
    runs = {}
    for name, model in (("torch", made.model), ("executorch", made.path)):
        predict(model, made.root / "detect" / "images" / "val", tmp_path / name, image_size=SIZE,
                save_media=False, progress_bar=False)  # fmt: skip
        rows = json.loads((tmp_path / name / "predictions.json").read_text())
        runs[name] = sorted((r["file_name"], r["category_id"], *np.round(r["bbox"], 1), round(r["score"], 3))
                            for r in rows)  # fmt: skip
    assert runs["executorch"] == runs["torch"] and len(runs["torch"]) >= 8


def test_a_file_that_is_not_a_program_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "broken.pte"
    bad.write_bytes(b"not a program" * 8)
    with pytest.raises(ValueError, match=r"broken\.pte: not a readable ExecuTorch program") as e:
        open_exported(bad)
    assert "\n" not in str(e.value)
