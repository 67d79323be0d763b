"""The synthetic dataset: deterministic, and its boxes are exactly the drawn shapes' extents."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import yaml

from yolo11_lightning.synthetic import command as synthetic
from yolo11_lightning.synthetic.painter import SYNTHETIC_CLASS_NAMES
from yolo11_lightning.synthetic.shapes import make_synthetic_dataset, synthetic_class_names


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _label_boxes(label: Path, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    rows = np.loadtxt(label, ndmin=2).reshape(-1, 5)
    cx, cy, w, h = rows[:, 1] * width, rows[:, 2] * height, rows[:, 3] * width, rows[:, 4] * height
    return rows[:, 0].astype(int), np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1)


def test_deterministic_given_the_seed(tmp_path: Path) -> None:
    a = make_synthetic_dataset(tmp_path / "a", num_train=5, num_val=2, image_size=48, seed=7)
    b = make_synthetic_dataset(tmp_path / "b", num_train=5, num_val=2, image_size=48, seed=7)
    c = make_synthetic_dataset(tmp_path / "c", num_train=5, num_val=2, image_size=48, seed=8)
    fa, fb, fc = _files(a.parent), _files(b.parent), _files(c.parent)
    assert fa == fb
    assert {k: v for k, v in fa.items() if k.endswith(".png")} != {
        k: v for k, v in fc.items() if k.endswith(".png")
    }
    # Image i depends on (seed, split, i) only: more images do not change the first ones.
    d = make_synthetic_dataset(tmp_path / "d", num_train=7, num_val=2, image_size=48, seed=7)
    fd = _files(d.parent)
    assert all(fd[k] == v for k, v in fa.items() if k.startswith(("images", "labels")))


def test_boxes_are_the_exact_extent_of_the_drawn_shapes(tmp_path: Path) -> None:
    yaml_path = make_synthetic_dataset(tmp_path, num_train=24, num_val=4, image_size=(72, 96), num_classes=8)
    images = sorted((tmp_path / "images" / "train").glob("*.png"))
    assert len(images) == 24
    seen_classes = set()
    for image_path in images:
        bgr = cv2.imread(str(image_path))
        assert bgr.shape == (72, 96, 3)
        # Shapes are bright (max channel >= ~190), the background dark (<= ~100): separate by threshold.
        shape_pixels = bgr.max(2) > 150
        classes, boxes = _label_boxes(tmp_path / "labels" / "train" / f"{image_path.stem}.txt", 72, 96)
        seen_classes.update(classes.tolist())
        covered = np.zeros_like(shape_pixels)
        for x1, y1, x2, y2 in boxes:
            assert np.allclose([x1, y1, x2, y2], np.round([x1, y1, x2, y2]), atol=1e-6)  # pixel edges
            x1, y1, x2, y2 = (round(v) for v in (x1, y1, x2, y2))
            inside = shape_pixels[y1:y2, x1:x2]
            ys, xs = np.nonzero(inside)
            # extent of the drawn pixels == the box
            assert (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1) == (0, 0, x2 - x1, y2 - y1), image_path
            covered[y1:y2, x1:x2] = True
        assert not (shape_pixels & ~covered).any(), f"{image_path}: drawn pixels outside every box"
    assert seen_classes == set(range(8))
    assert yaml.safe_load(yaml_path.read_text())["names"] == list(SYNTHETIC_CLASS_NAMES)


def test_existing_dataset_with_same_parameters_is_reused(tmp_path: Path) -> None:
    path = make_synthetic_dataset(tmp_path, num_train=3, num_val=1, image_size=32)
    label = next((tmp_path / "labels" / "train").glob("*.txt"))
    mtime = label.stat().st_mtime_ns
    assert make_synthetic_dataset(tmp_path, num_train=3, num_val=1, image_size=32) == path
    assert label.stat().st_mtime_ns == mtime  # untouched: label caches stay valid
    (tmp_path / "images" / "val" / "val_00000.png").unlink()  # damaged folder: regenerated
    make_synthetic_dataset(tmp_path, num_train=3, num_val=1, image_size=32)
    assert (tmp_path / "images" / "val" / "val_00000.png").is_file()
    before = _files(tmp_path / "images")
    make_synthetic_dataset(tmp_path, num_train=2, num_val=1, image_size=32, seed=5)  # other parameters
    after = _files(tmp_path / "images")
    assert sorted(after) == ["train/train_00000.png", "train/train_00001.png", "val/val_00000.png"]
    assert after["train/train_00000.png"] != before["train/train_00000.png"]


def test_cli_writes_a_dataset(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert synthetic.main(["--out", str(tmp_path), "--train", "3", "--val", "2", "--size", "40", "56"]) == 0
    printed = Path(capsys.readouterr().out.strip())
    assert printed == tmp_path / "data.yaml"
    assert len(list((tmp_path / "images" / "val").glob("*.png"))) == 2
    assert cv2.imread(str(next((tmp_path / "images" / "train").glob("*.png")))).shape == (40, 56, 3)


def test_class_names_and_limits(tmp_path: Path) -> None:
    assert synthetic_class_names(3) == ["rectangle", "ellipse", "triangle"]
    with pytest.raises(ValueError, match="num_classes"):
        make_synthetic_dataset(tmp_path, num_classes=len(SYNTHETIC_CLASS_NAMES) + 1)


# ------------------------------------------------------------------------------------ the hard set
def test_hard_set_is_deterministic_non_square_and_its_labels_parse(tmp_path: Path) -> None:
    from yolo11_lightning.data.sources.config import load_dataset_config
    from yolo11_lightning.synthetic.hard import HARD_CLASS_NAMES, make_hard_synthetic_dataset

    a = make_hard_synthetic_dataset(tmp_path / "a", num_train=12, num_val=2, image_size=(48, 80), seed=3)
    b = make_hard_synthetic_dataset(tmp_path / "b", num_train=14, num_val=2, image_size=(48, 80), seed=3)
    c = make_hard_synthetic_dataset(tmp_path / "c", num_train=12, num_val=2, image_size=(48, 80), seed=4)
    fa, fb, fc = _files(a.parent), _files(b.parent), _files(c.parent)
    # image i depends on (seed, split, i) only
    assert all(fb[k] == v for k, v in fa.items() if k.startswith(("images", "labels")))
    assert {k: v for k, v in fa.items() if k.endswith(".png")} != {
        k: v for k, v in fc.items() if k.endswith(".png")
    }
    assert load_dataset_config(a).names == list(HARD_CLASS_NAMES)
    counts, overlaps = [], 0
    for image_path in sorted((tmp_path / "b" / "images" / "train").glob("*.png")):
        assert cv2.imread(str(image_path)).shape == (48, 80, 3)
        classes, boxes = _label_boxes(tmp_path / "b" / "labels" / "train" / f"{image_path.stem}.txt", 48, 80)
        assert ((classes >= 0) & (classes < len(HARD_CLASS_NAMES))).all()
        assert (
            (boxes[:, :2] >= 0).all()
            and (boxes[:, 2] <= 80 + 1e-6).all()
            and (boxes[:, 3] <= 48 + 1e-6).all()
        )
        assert (boxes[:, 2:] > boxes[:, :2]).all()
        counts.append(len(boxes))
        for i in range(len(boxes)):
            for j in range(i):
                lo, hi = np.maximum(boxes[i, :2], boxes[j, :2]), np.minimum(boxes[i, 2:], boxes[j, 2:])
                overlaps += bool((hi > lo).all())
    assert min(counts) >= 1 and max(counts) <= 7 and max(counts) >= 3
    assert overlaps > 0  # overlapping (occluded) objects keep their boxes


def test_synthetic_cli_hard_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        synthetic.main(["--out", str(tmp_path), "--hard", "--train", "2", "--val", "1", "--size", "40", "64"])
        == 0
    )
    assert capsys.readouterr().out.strip() == str(tmp_path / "data.yaml")
    assert cv2.imread(str(tmp_path / "images" / "val" / "val_00000.png")).shape == (40, 64, 3)
    with pytest.raises(SystemExit):
        synthetic.main(["--out", str(tmp_path), "--hard", "--coco"])
