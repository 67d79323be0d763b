"""One bad file among good ones, per task: symlink loops, captions in class folders, degenerate oriented boxes,
splits without labels, one-class roots. Each is named in one line by the load and by ``check-data`` (no traceback),
and no dataset folder is changed or created."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from data_files import pattern, write_image, write_labels, write_yaml

from yolo11_lightning.data import check_data
from yolo11_lightning.data.sources.split import dataset_config, load_split
from yolo11_lightning.data.sources.task_hint import dataset_task

BOX = "0 0.5 0.5 0.4 0.4"


def _yolo_set(root: Path, names: list[str], train: int = 3, val: int = 2) -> Path:
    for split, count in (("train", train), ("val", val)):
        for i in range(count):
            write_image(root / "images" / split / f"{split}{i}.png", pattern(32, 32, i))
            write_labels(root / "labels" / split / f"{split}{i}.txt", [BOX])
    return write_yaml(root / "data.yaml", {"path": str(root), "train": "images/train", "val": "images/val",
                                           "names": names})  # fmt: skip


def _class_root(root: Path, classes: tuple[str, ...] = ("circle", "square"), per_class: int = 2) -> Path:
    for split in ("train", "val"):
        for c, name in enumerate(classes):
            for i in range(per_class):
                write_image(root / split / name / f"{name}{i:02d}.png", pattern(24, 24, 10 * c + i))
    return root


def _check_data(dataset: Path, capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    code = check_data.main(["--dataset", str(dataset), "--no-images", "--no-cache", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_symlink_loops_in_a_yolo_folder_are_named_and_each_image_listed_once(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``cycle -> .``, ``sub/up -> ../..`` (loops) and ``dup.png -> train0.png`` (a file twice): each named in one
    line, every image once under its own path; a link to a folder outside the split is still followed."""
    yaml_path = _yolo_set(tmp_path / "set", ["a"])
    train = tmp_path / "set" / "images" / "train"
    write_image(train / "sub" / "deep.png", pattern(32, 32, 7))
    write_labels(tmp_path / "set" / "labels" / "train" / "sub" / "deep.txt", [BOX])
    write_image(tmp_path / "set" / "images" / "extra" / "far.png", pattern(32, 32, 8))
    os.symlink(".", train / "cycle")
    os.symlink("../..", train / "sub" / "up")
    os.symlink("train0.png", train / "dup.png")
    os.symlink("../extra", train / "more")
    records, report = load_split(dataset_config(yaml_path), "train", use_cache=False, verbose=False)
    listed = [os.path.relpath(r.path, train) for r in records]
    assert listed == ["train0.png", "train1.png", "train2.png", "sub/deep.png", "more/far.png"]
    assert report.num_boxes == 4  # far.png has no label: background, as any unlabelled image
    loops = [w for w in report.warnings if "(a loop): not followed" in w]
    assert sorted(w.split(":")[0] for w in loops) == [str(train / "cycle"), str(train / "sub" / "up")]
    assert f"{train / 'dup.png'}: the same file as {train / 'train0.png'}: listed once" in report.warnings
    code, out, err = _check_data(yaml_path, capsys)
    assert code == 0 and not err, err
    assert out.count("(a loop): not followed") == 2 and "train: 5 images (1 background), 4 boxes" in out, out


def test_symlink_loops_in_class_folders_keep_every_image_in_its_own_class(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``train/circle/cycle -> ..`` and ``train/cycle -> .``: no image is listed twice or under another class, and
    the loop at the split level is no class."""
    root = _class_root(tmp_path / "root")
    os.symlink("..", root / "train" / "circle" / "cycle")
    os.symlink(".", root / "train" / "cycle")
    config = dataset_config(root)
    assert config.names == ["circle", "square"]
    records, report = load_split(config, "train", use_cache=False, verbose=False)
    assert [(Path(r.path).name, int(r.classes[0])) for r in records] == [
        ("circle00.png", 0), ("circle01.png", 0), ("square00.png", 1), ("square01.png", 1),
    ]  # fmt: skip
    assert sum("(a loop): not followed" in w for w in report.warnings) == 2, report.warnings
    code, out, _ = _check_data(root, capsys)
    assert code == 0 and "train: 4 images, 4 class labels" in out, out


def test_a_caption_beside_an_image_of_a_class_folder_is_ignored_and_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    root = _class_root(tmp_path / "root")
    caption = root / "train" / "circle" / "circle00.txt"
    caption.write_text("a red circle on grey\n")
    (root / "train" / "square" / "notes.json").write_text("{}")
    assert dataset_task(root).task == "classify"
    config = dataset_config(root)
    records, report = load_split(config, "train", use_cache=False, verbose=False)
    assert len(records) == 4
    assert [w for w in report.warnings if "that are not images" in w] == [
        f"{root / 'train'}: ignored 2 files that are not images in its class folders (e.g. {caption})"
    ]
    code, out, _ = _check_data(root, capsys)
    assert code == 0 and "train: 4 images, 4 class labels" in out, out
