"""``yolo11-lightning check-data``: report, pictures, and an exit status that says whether training can start."""

from __future__ import annotations

from pathlib import Path

import cv2
import pytest
from data_files import pattern, write_image, write_labels, write_yaml

from yolo11_lightning.cli.check_data import main
from yolo11_lightning.cli.main import main as cli_main
from yolo11_lightning.synthetic.shapes import make_synthetic_dataset


def test_good_dataset_exits_0_and_writes_pictures(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    yaml_path = make_synthetic_dataset(tmp_path / "ds", num_train=8, num_val=4, image_size=64)
    label = tmp_path / "ds" / "labels" / "train" / "train_00000.txt"
    label.write_text(label.read_text() + "9 0.5 0.5 0.1 0.1\n")  # one bad row: a warning, not a failure
    out = tmp_path / "out"
    assert (
        cli_main(
            ["check-data", "--dataset", str(yaml_path), "--out", str(out), "--imgsz", "64", "--samples", "4"]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert f"warning: {label}:" in printed and "class 9 out of range" in printed
    assert "train: 8 images" in printed and "val: 4 images" in printed
    expected = ["train_classes", "train_boxes", "val_classes", "val_boxes", "train_preview", "val_preview"]
    for name in expected:
        image = cv2.imread(str(out / f"{name}.png"))
        assert image is not None and image.shape[0] > 32 and image.std() > 0, name
    preview = cv2.imread(str(out / "train_preview.png"))
    assert preview.shape[:2] == (64, 4 * 64)  # 4 samples of 64 px, one row


def test_unusable_dataset_exits_1_with_a_clear_message(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_image(tmp_path / "images" / "train" / "a.png", pattern(16, 16))
    write_labels(tmp_path / "labels" / "train" / "a.txt", ["0 0.5 0.5 0.5 0.5"])
    (tmp_path / "images" / "val").mkdir(parents=True)
    (tmp_path / "images" / "val" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really")
    yaml_path = write_yaml(
        tmp_path / "d.yaml", {"train": "images/train", "val": "images/val", "names": ["x"]}
    )
    assert main(["--dataset", str(yaml_path), "--no-images"]) == 1
    err = capsys.readouterr().err
    assert "split `val` has no usable image" in err and "broken.jpg" in err
    assert "cannot be trained on" in err


def test_bad_yaml_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    yaml_path = write_yaml(tmp_path / "d.yaml", {"train": "nowhere", "names": ["x"]})
    assert main(["--dataset", str(yaml_path), "--no-images"]) == 1
    assert "key `train`" in capsys.readouterr().err


def test_missing_val_split_is_unusable(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_image(tmp_path / "images" / "a.png", pattern(16, 16))
    yaml_path = write_yaml(tmp_path / "d.yaml", {"train": "images", "names": ["x"]})
    assert main(["--dataset", str(yaml_path), "--no-images"]) == 1
    assert "required split `val` is not defined" in capsys.readouterr().err
