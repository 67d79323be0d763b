"""Dataset yaml parsing, YOLO vs COCO equivalence, and the label cache."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from data_files import jpeg_with_orientation, pattern, write_image, write_labels, write_yaml

from yolo11_lightning.data.sources import cache as cache_module
from yolo11_lightning.data.sources import split as sources
from yolo11_lightning.data.sources import yolo as yolo_source
from yolo11_lightning.data.sources.config import DatasetConfig, DatasetError, load_dataset_config
from yolo11_lightning.data.sources.split import load_split
from yolo11_lightning.data.sources.yolo import label_path_for
from yolo11_lightning.synthetic.shapes import make_synthetic_coco, make_synthetic_dataset


def assert_same_records(a, b) -> None:
    assert [r.path for r in a] == [r.path for r in b]
    for ra, rb in zip(a, b):
        assert (ra.height, ra.width) == (rb.height, rb.width), ra.path
        np.testing.assert_array_equal(ra.classes, rb.classes, err_msg=ra.path)
        np.testing.assert_allclose(ra.boxes, rb.boxes, atol=1e-6, err_msg=ra.path)


# ----------------------------------------------------------------------------------- dataset yaml
def test_yaml_paths_names_and_entry_kinds(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    write_image(root / "images" / "a" / "x.jpg", pattern(8, 8))
    (root / "lists").mkdir()
    (root / "lists" / "val.txt").write_text("../images/a/x.jpg\n")
    cfg = write_yaml(
        tmp_path / "cfg" / "d.yaml",
        {
            "path": "../ds",
            "train": ["images/a", "lists/val.txt"],
            "val": "lists/val.txt",
            "names": {1: "b", 0: "a"},
        },
    )
    config = load_dataset_config(cfg)
    assert config.root == root.resolve() and config.yaml_path == cfg.resolve()
    assert config.names == ["a", "b"] and config.num_classes == 2
    assert config.splits == {"train": [str(root / "images" / "a"), str(root / "lists" / "val.txt")],
                             "val": [str(root / "lists" / "val.txt")]}  # fmt: skip
    records, _ = load_split(config, "train", use_cache=False)
    assert [r.path for r in records] == [str(root / "images" / "a" / "x.jpg")]  # listed twice, used once
    with pytest.raises(DatasetError, match=r"split `test` is not defined"):
        load_split(config, "test")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"train": "images", "val": "images"}, r"key `names` is missing"),
        ({"train": "images", "val": "nowhere", "names": ["a"]}, r"key `val`: .*nowhere does not exist"),
        ({"train": "images", "names": {0: "a", 2: "c"}}, r"key `names`: `names` ids must be 0..1"),
        ({"names": ["a"]}, r"no split defined"),
        ({"path": "missing_root", "train": "images", "names": ["a"]}, r"key `path`"),
        ({"train": "images", "names": ["a", "b"], "nc": 3}, r"key `nc` is 3"),
    ],
)
def test_yaml_errors_name_file_and_key(tmp_path: Path, content: dict, message: str) -> None:
    (tmp_path / "images").mkdir()
    cfg = write_yaml(tmp_path / "bad.yaml", content)
    with pytest.raises(DatasetError, match=message) as err:
        load_dataset_config(cfg)
    assert str(cfg) in str(err.value)


def test_unreadable_yaml(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="cannot read dataset yaml"):
        load_dataset_config(tmp_path / "absent.yaml")
    (tmp_path / "x.yaml").write_text("train: [unclosed\n")
    with pytest.raises(DatasetError, match="invalid yaml"):
        load_dataset_config(tmp_path / "x.yaml")


def test_label_path_mapping() -> None:
    sep = os.sep
    assert (
        label_path_for(f"{sep}d{sep}images{sep}tr{sep}images{sep}a.b.JPG")
        == f"{sep}d{sep}images{sep}tr{sep}labels{sep}a.b.txt"
    )
    assert label_path_for(f"{sep}d{sep}pics{sep}a.png") == f"{sep}d{sep}pics{sep}a.txt"


def test_a_yolo_split_of_subfolders_is_told_from_an_image_folder_without_walking_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``images/train/000/...`` looks like class folders until its first image's label rows are read: that one
    image decides, not a walk of every image (at 100k images two walks and 100k ``relpath`` calls, before the
    YOLO reader walked them again). An unlabelled first image leaves the decision to the walk, as before."""
    from yolo11_lightning.data.sources import imagefolder
    from yolo11_lightning.data.sources.listing import ImageListing

    train = tmp_path / "images" / "train"
    for sub, name in (("000", "a"), ("000", "b"), ("001", "c")):
        write_image(train / sub / f"{name}.jpg", pattern(16, 16))
        write_labels(Path(label_path_for(str(train / sub / f"{name}.jpg"))), ["0 0.5 0.5 0.2 0.2"])
    walk = ImageListing.walk
    with monkeypatch.context() as m:
        m.setattr(ImageListing, "walk", lambda self, top: pytest.fail(f"walked {top}"))
        assert imagefolder.class_folders(train) is None
        assert imagefolder.open_entry(str(train), set()) is None
    assert ImageListing.walk is walk
    config = write_yaml(tmp_path / "d.yaml", {"path": str(tmp_path), "train": "images/train", "names": ["x"]})
    records, _ = load_split(load_dataset_config(config), "train", use_cache=False, verbose=False)
    assert [Path(r.path).name for r in records] == ["a.jpg", "b.jpg", "c.jpg"]
    # The first image of 000 without labels, a later class's with rows: still no ImageFolder (the walk decides).
    (tmp_path / "labels" / "train" / "000" / "a.txt").unlink()
    (tmp_path / "labels" / "train" / "000" / "b.txt").unlink()
    assert imagefolder.class_folders(train) is None
    # Without any label file it is an ImageFolder whose classes are the subfolders, links and all.
    for sub in ("000", "001"):
        for f in (tmp_path / "labels" / "train" / sub).iterdir():
            f.unlink()
    os.symlink(train / "001", train / "000" / "0link")  # a folder link sorted before 000's images
    assert imagefolder.class_folders(train) == ["000", "001"]


# ----------------------------------------------------------------------------------- YOLO vs COCO
def test_same_images_as_yolo_txt_and_coco_json_give_same_records(tmp_path: Path) -> None:
    coco_yaml = make_synthetic_coco(
        tmp_path, num_train=12, num_val=4, image_size=(48, 64), num_classes=4, seed=3, min_objects=0
    )
    yolo = load_dataset_config(tmp_path / "data.yaml")
    coco = load_dataset_config(coco_yaml)
    assert coco.names == yolo.names  # from the json categories (ids 1, 3, 5, 7), sorted by id
    cats = json.loads((tmp_path / "train.json").read_text())["categories"]
    assert [c["id"] for c in cats] != list(range(len(cats)))  # the json really is non-contiguous
    backgrounds = 0
    for split in ("train", "val"):
        a, report_a = load_split(yolo, split, use_cache=False)
        b, report_b = load_split(coco, split, use_cache=False)
        assert_same_records(a, b)
        assert sum(len(r.classes) for r in a) > len(a)  # several objects per image: a real comparison
        assert report_a.num_background == report_b.num_background
        assert report_a.warnings == report_b.warnings == []
        backgrounds += report_a.num_background
    assert backgrounds > 0  # images without annotations (COCO) == empty label files (YOLO)


def test_polygon_rows_give_their_extent(tmp_path: Path) -> None:
    write_image(tmp_path / "images" / "p.png", pattern(10, 20))
    write_labels(tmp_path / "labels" / "p.txt", ["1 0.2 0.3 0.6 0.1 0.5 0.9 0.3 0.5"])
    cfg = write_yaml(tmp_path / "d.yaml", {"train": "images", "val": "images", "names": ["a", "b"]})
    (rec,), _ = load_split(load_dataset_config(cfg), "val", use_cache=False)
    np.testing.assert_allclose(rec.boxes, [[0.4, 0.5, 0.4, 0.8]], atol=1e-6)


# ----------------------------------------------------------------------------------- label cache
@pytest.fixture
def small_dataset(tmp_path: Path) -> DatasetConfig:
    return load_dataset_config(
        make_synthetic_dataset(tmp_path / "ds", num_train=6, num_val=3, image_size=32, seed=1)
    )


def _count_parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    original = yolo_source.check_images

    def counting(images: list[str], *args):
        calls.extend(images)
        return original(images, *args)

    monkeypatch.setattr(yolo_source, "check_images", counting)
    return calls


def test_second_load_hits_the_cache(small_dataset: DatasetConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    first, report1 = load_split(small_dataset, "train")
    assert not report1.from_cache and report1.cache_path
    assert Path(report1.cache_path).is_file()
    assert Path(report1.cache_path).parent == small_dataset.root / "labels"  # beside the labels

    def fail(*args, **kwargs):
        raise AssertionError("parsed again despite a valid cache")

    monkeypatch.setattr(yolo_source, "check_images", fail)
    second, report2 = load_split(small_dataset, "train")
    assert report2.from_cache
    assert_same_records(first, second)
    assert report2.num_images == report1.num_images and report2.num_boxes == report1.num_boxes


def test_cache_keeps_the_warnings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_image(tmp_path / "images" / "a.png", pattern(8, 8))
    write_labels(tmp_path / "labels" / "a.txt", ["0 0.5 0.5 0.5 0.5", "7 0.5 0.5 0.5 0.5"])
    (tmp_path / "images" / "b.png").write_bytes(b"")
    config = load_dataset_config(write_yaml(tmp_path / "d.yaml", {"train": "images", "names": ["x"]}))
    _, fresh = load_split(config, "train")
    calls = _count_parses(monkeypatch)
    _, cached = load_split(config, "train")
    assert calls == [] and cached.from_cache
    assert cached.warnings == fresh.warnings and len(fresh.warnings) == 2
    assert (cached.num_skipped_images, cached.num_skipped_rows) == (1, 1)


def test_touching_a_label_file_invalidates(
    small_dataset: DatasetConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    records, _ = load_split(small_dataset, "train")
    label = Path(label_path_for(records[2].path))
    label.write_text("0 0.5 0.5 0.25 0.25\n")
    os.utime(label, ns=(label.stat().st_atime_ns, label.stat().st_mtime_ns + 10**9))  # coarse-mtime safe
    calls = _count_parses(monkeypatch)
    again, report = load_split(small_dataset, "train")
    assert not report.from_cache and len(calls) == len(records)
    np.testing.assert_allclose(again[2].boxes, [[0.5, 0.5, 0.25, 0.25]])

    write_image(Path(records[0].path).parent / "zz_new.png", pattern(32, 32))  # a new image too
    calls.clear()
    more, report = load_split(small_dataset, "train")
    assert not report.from_cache and len(more) == len(records) + 1


def test_changed_names_invalidate(small_dataset: DatasetConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    load_split(small_dataset, "val")
    calls = _count_parses(monkeypatch)
    small_dataset.names = [*small_dataset.names, "extra"]
    _, report = load_split(small_dataset, "val")
    assert calls and not report.from_cache


def test_read_only_dataset_falls_back_to_cache_dir(
    small_dataset: DatasetConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = small_dataset.root
    original = cache_module.save_cache

    def read_only_dataset(path: Path, *args, **kwargs):
        if root in Path(path).parents:  # what a read-only mount answers (chmod does not stop root)
            raise PermissionError(13, "Read-only file system", str(path))
        return original(path, *args, **kwargs)

    monkeypatch.setattr(sources, "save_cache", read_only_dataset)
    records, report = load_split(small_dataset, "train", cache_dir=tmp_path / "cache")
    assert Path(report.cache_path).parent == tmp_path / "cache"
    assert not list(root.rglob("*.cache.npz"))

    calls = _count_parses(monkeypatch)
    again, report2 = load_split(small_dataset, "train", cache_dir=tmp_path / "cache")
    assert calls == [] and report2.from_cache and report2.cache_path == report.cache_path
    assert_same_records(records, again)


def test_corrupt_cache_is_rebuilt(small_dataset: DatasetConfig) -> None:
    records, report = load_split(small_dataset, "val")
    Path(report.cache_path).write_bytes(b"PK\x03\x04 not a zip")
    again, report2 = load_split(small_dataset, "val")
    assert not report2.from_cache
    assert_same_records(records, again)
    assert load_split(small_dataset, "val")[1].from_cache


def test_coco_cache_tracks_images_named_in_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = load_dataset_config(make_synthetic_coco(tmp_path, num_train=4, num_val=2, image_size=32))
    records, report = load_split(config, "val")
    assert Path(report.cache_path).parent == tmp_path  # beside the json
    assert load_split(config, "val")[1].from_cache
    image = Path(records[0].path)
    image.write_bytes(b"")  # an image the json names breaks: the cache must notice
    os.utime(image, ns=(image.stat().st_atime_ns, image.stat().st_mtime_ns + 10**9))
    again, report2 = load_split(config, "val")
    assert not report2.from_cache and report2.num_skipped_images == 1 and len(again) == len(records) - 1


def test_no_cache_mode_writes_nothing(small_dataset: DatasetConfig) -> None:
    _, report = load_split(small_dataset, "train", use_cache=False)
    assert report.cache_path is None and not list(small_dataset.root.rglob("*.cache.npz"))


def test_cache_file_is_not_a_pickle(small_dataset: DatasetConfig) -> None:
    _, report = load_split(small_dataset, "train")
    with np.load(report.cache_path, allow_pickle=False) as z:  # would raise on object arrays
        assert {"meta", "paths", "path_ends", "sizes", "label_ends", "classes", "boxes"} <= set(z.files)
        assert all(z[k].dtype != object for k in z.files)


def test_records_match_the_reference_label_reader(tmp_path: Path) -> None:
    """Clean labels (boxes, polygons, an EXIF-rotated JPEG) read as the reference reads them."""
    os.environ["YOLO_OFFLINE"] = "1"
    pytest.importorskip("ultralytics")
    from ultralytics.data.utils import verify_image_label

    config = load_dataset_config(
        make_synthetic_dataset(tmp_path, num_train=6, num_val=1, image_size=(40, 56))
    )
    images = tmp_path / "images" / "train"
    (images / "rot.jpg").write_bytes(jpeg_with_orientation(pattern(24, 40), 6))
    write_labels(tmp_path / "labels" / "train" / "rot.txt", ["1 0.3 0.6 0.2 0.4"])
    # Polygons in a file of their own: the reference reads a 5-number row as a 2-point polygon when
    # the same file also holds polygons; we read every row by its own length (a 5-number row is a box).
    write_image(images / "poly.png", pattern(30, 20))
    write_labels(tmp_path / "labels" / "train" / "poly.txt", ["2 0.1 0.2 0.5 0.25 0.3 0.7 0.2 0.6"])
    records, report = load_split(config, "train", use_cache=False)
    assert report.warnings == [] and len(records) == 8
    for rec in records:
        out = verify_image_label(
            (rec.path, label_path_for(rec.path), "", False, config.num_classes, 0, 0, False)
        )
        assert out[-1] == "" and out[2] == (rec.height, rec.width), out[-1]
        np.testing.assert_array_equal(rec.classes, out[1][:, 0].astype(np.int64))
        np.testing.assert_allclose(rec.boxes, out[1][:, 1:], atol=1e-6)
