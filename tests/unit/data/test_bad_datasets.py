"""One bad file among good ones, per task: symlink loops, captions in class folders, degenerate oriented boxes,
splits without labels, one-class roots. Each is named in one line by the load and by ``check-data`` (no traceback),
and no dataset folder is changed or created."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from data_files import pattern, write_image, write_labels, write_yaml

from yolo11_lightning.cli import check_data
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


OBB_GOOD = "0 0.2 0.2 0.6 0.2 0.6 0.5 0.2 0.5"
OBB_ROWS = [  # (row, reason or None when kept)
    (OBB_GOOD, None),
    ("1 0.1 0.1 0.4 0.4 0.7 0.7 0.8 0.8", "degenerate oriented box: zero area (its corners lie on one line)"),
    ("1 0.1 0.1 0.4 0.1 0.4 0.1 0.1 0.4", "degenerate oriented box: corners 2 and 3 are the same point"),
    ("1 0.3 0.3 0.3 0.3 0.3 0.3 0.3 0.3", "zero or negative box size (w=0, h=0)"),  # a bad box row first
    ("1 0.1 0.2 0.5 0.6 0.3 0.4", "polygon has zero area (its points lie on one line)"),
    ("2 0.5 0.5 0.2 0.2", None),  # a box row: an axis-aligned oriented box
]


def test_degenerate_oriented_boxes_are_dropped_and_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """For the obb task a row of collinear or repeated corners (or any zero-area outline) is dropped, not kept as
    the axis-aligned box around it (a phantom 0.6 x 0.6 target), named once and counted in the summary; the same
    rows stay boxes for detection, as before."""
    import dataclasses

    from yolo11_lightning.training.datamodule import YOLODataModule

    yaml_path = _yolo_set(tmp_path / "set", ["a", "b", "c"])
    label = tmp_path / "set" / "labels" / "val" / "val0.txt"
    write_labels(label, [row for row, _ in OBB_ROWS])
    config = dataclasses.replace(dataset_config(yaml_path), outline_labels=True)
    records, report = load_split(config, "val", use_cache=False, verbose=False)
    assert records[0].classes.tolist() == [0, 2]
    assert report.num_bad_outlines == 3 and report.num_skipped_rows == 1
    expected = [f"{label}:{i}: {why}" for i, (_, why) in enumerate(OBB_ROWS, 1) if why]
    assert sorted(w.removesuffix("; row dropped") for w in report.warnings if str(label) in w) == sorted(
        expected
    )
    assert "skipped 0 images and 1 label rows, 3 degenerate oriented boxes dropped" in report.summary()
    boxes, _ = load_split(dataset_config(yaml_path), "val", use_cache=False, verbose=False)
    assert len(boxes[0].classes) == 5  # detection keeps the polygons' boxes

    data = YOLODataModule(str(yaml_path), task="obb", image_size=64, batch_size=2, num_workers=0)
    data.setup("validate")
    sample = data.datasets["val"][0]
    assert len(sample["rboxes"]) == 2, sample["rboxes"]  # the training targets: no phantom box

    code, out, err = _check_data(yaml_path, capsys, "--task", "obb")
    assert code == 0 and not err, err
    named = [line for line in out.splitlines() if str(label) in line]
    assert len(named) == 5 and sum(line.endswith("row dropped") for line in named) == 3, (
        out
    )  # + the box row's
    assert (
        "val: 2 images (0 background), 3 boxes (1 with polygons); skipped 0 images and 1 label rows, "
        "3 degenerate oriented boxes dropped" in out
    )


def test_a_split_without_labels_is_refused_on_every_rank_and_no_folder_is_created(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """An unlabelled val is refused in one line naming the split and its folder, on rank 0 and on rank 1 alike
    (so the ranks' agreement stops them together), before any epoch; ``check-data`` exits 1 with the same line.
    The label cache goes to the cache folder: the dataset gets no ``labels/`` folder."""
    from types import SimpleNamespace

    from yolo11_lightning.data.sources.config import DatasetError
    from yolo11_lightning.training.datamodule import YOLODataModule

    root = tmp_path / "set"
    yaml_path = _yolo_set(root, ["a"])
    for path in sorted((root / "labels").rglob("*.txt")):
        path.unlink()
    for split in ("train", "val"):
        (root / "labels" / split).rmdir()
    (root / "labels").rmdir()
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    message = rf"split `val` \({root / 'images' / 'val'}\): no labels: none of its 2 images has one"
    for rank in (0, 1):
        data = YOLODataModule(
            str(yaml_path),
            image_size=64,
            batch_size=2,
            num_workers=0,
            label_cache_dir=str(tmp_path / "cache"),
        )
        data.trainer = SimpleNamespace(
            world_size=2, global_rank=rank, num_devices=2
        )  # no strategy, no collective
        with pytest.raises(DatasetError, match=message):
            data.setup("fit")
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before  # no labels/ folder, no cache file
    assert list((tmp_path / "cache").glob("*.npz"))  # the caches went to the cache folder
    data = YOLODataModule(str(yaml_path), image_size=64, batch_size=2, num_workers=0)
    data.setup("predict")  # prediction needs no labels
    code, out, err = _check_data(yaml_path, capsys)
    assert code == 1 and "no labels: none of its 2 images has one" in err, err
    assert "Traceback" not in out + err


def test_a_one_class_root_is_refused_and_a_box_set_for_classify_on_every_rank(tmp_path: Path) -> None:
    """One class folder trains to top-1 1.0 whatever the model says: refused in one line; so is a root whose train
    split has images of one class only. The refusals happen on every rank (before, rank 1 went on to the next
    split and waited for rank 0, which had stopped)."""
    from types import SimpleNamespace

    from yolo11_lightning.data.sources.config import DatasetError
    from yolo11_lightning.training.datamodule import YOLODataModule

    one = _class_root(tmp_path / "one", ("circle",))
    half = _class_root(tmp_path / "half")
    for image in (half / "train" / "square").iterdir():
        image.unlink()
    boxes = _yolo_set(tmp_path / "boxes", ["a", "b"])
    write_labels(tmp_path / "boxes" / "labels" / "train" / "train1.txt", [BOX, "1 0.2 0.2 0.1 0.1"])
    cases = [
        (one, r"split `train` \(.*\): one class folder \(circle\): a classifier needs two classes"),
        (half, r"split `train` \(.*\): only class `circle` of 2 has images"),
        (boxes, r"split `train` \(.*\): 1 of 3 images have 2 labels, not one class"),
    ]
    for dataset, message in cases:
        for rank in (0, 1):
            data = YOLODataModule(str(dataset), task="classify", image_size=32, batch_size=2, num_workers=0,
                                  label_cache_dir=str(tmp_path / "cache"))  # fmt: skip
            data.trainer = SimpleNamespace(world_size=2, global_rank=rank, num_devices=2)
            with pytest.raises(DatasetError, match=message):
                data.setup("fit")
