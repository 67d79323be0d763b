"""Every kind of bad input is skipped with one warning naming file, line and reason; good data all kept."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import cv2
import numpy as np
import pytest
from data_files import jpeg_with_orientation, pattern, write_image, write_labels, write_yaml

from yolo11_lightning.data.images.io import image_size, read_image
from yolo11_lightning.data.images.limits import ImageReadError
from yolo11_lightning.data.sources.checks import CLIP_TOLERANCE
from yolo11_lightning.data.sources.config import DatasetError, load_dataset_config
from yolo11_lightning.data.sources.split import load_split

# (line text, expected reason fragment or None when the row is kept)
GOOD_IMAGE_ROWS = [
    ("0 0.5 0.5 0.2 0.2", None),
    ("1 0.5 0.5", "expected 5 values"),
    ("0 0.5 0.5 0.2 0.2 0.1", "expected 5 values"),
    ("x 0.5 0.5 0.2 0.2", "not a number: 'x'"),
    ("0 nan 0.5 0.2 0.2", "not a finite number"),
    ("3 0.5 0.5 0.2 0.2", "class 3 out of range"),
    ("-1 0.5 0.5 0.2 0.2", "negative class -1"),
    ("1.5 0.5 0.5 0.2 0.2", "class 1.5 is not an integer"),
    ("0 0.5 0.5 0 0.2", "zero or negative box size"),
    ("0 0.5 0.5 -0.1 0.2", "zero or negative box size"),
    ("1 0.995 0.5 0.02 0.2", None),  # right edge 1.005: clipped
    ("1 0.5 1.5 0.2 0.2", "coordinate 1.5 outside [0, 1]"),
    ("0 0.5 0.5 0.2 0.2", "duplicate of line 1"),
    ("2 0.1 0.1 0.3 0.1 0.2 0.4", None),  # polygon: box = its extent
    ("", None),  # blank lines are fine
    ("0 0.1 0.1 0.3 0.1 0.2", "expected 5 values"),
    ("2 0.5 0.5 0.2 1.004", None),  # height 1.004 within tolerance: clipped
    ("0 0.5 0.5 0.2 0.2 0.3 0.4 0.5", "expected 5 values"),
]
GOOD_IMAGE_CLASSES = [0, 1, 2, 2]
GOOD_IMAGE_BOXES = [
    [0.5, 0.5, 0.2, 0.2],
    [0.9925, 0.5, 0.015, 0.2],
    [0.2, 0.25, 0.2, 0.3],
    [0.5, 0.5, 0.2, 1.0],
]


@pytest.fixture
def messy_dataset(tmp_path: Path) -> Path:
    images, labels = tmp_path / "images" / "train", tmp_path / "labels" / "train"
    write_image(images / "good.jpg", pattern(32, 48))
    write_labels(labels / "good.txt", [line for line, _ in GOOD_IMAGE_ROWS])

    (images / "zero.jpg").write_bytes(b"")
    jpg = cv2.imencode(".jpg", pattern(32, 32, 1))[1].tobytes()
    (images / "trunc.jpg").write_bytes(jpg[: len(jpg) // 2])
    (images / "text.jpg").write_text("this is not an image")
    png = cv2.imencode(".png", pattern(32, 32, 2))[1].tobytes()
    (images / "trunc.png").write_bytes(png[: len(png) // 2])
    for name in ("zero", "trunc", "text"):
        write_labels(labels / f"{name}.txt", ["0 0.5 0.5 0.2 0.2"])

    write_image(images / "gray.png", pattern(20, 30)[:, :, 0])
    rgba = np.dstack([pattern(20, 30), np.full((20, 30), 128, np.uint8)])
    write_image(images / "rgba.png", cv2.cvtColor(rgba, cv2.COLOR_RGBA2BGRA))
    write_image(images / "deep.png", np.full((16, 24), 40000, np.uint16))
    for name in ("gray", "rgba", "deep"):
        write_labels(labels / f"{name}.txt", ["1 0.5 0.5 0.5 0.5"])

    stored = pattern(24, 40, 3)  # stored 24 rows x 40 columns; EXIF 6 = displayed rotated 90° clockwise
    stored[:4, :4] = 255  # a white corner: top-left when stored, top-right when displayed
    (images / "rot6.jpg").write_bytes(jpeg_with_orientation(stored, 6))
    write_labels(labels / "rot6.txt", ["2 0.25 0.75 0.2 0.1"])  # labels live in the displayed frame

    write_image(images / "bg.jpg", pattern(16, 16, 4))  # no label file: background
    write_image(images / "empty_label.jpg", pattern(16, 16, 5))
    write_labels(labels / "empty_label.txt", [])
    write_image(images / "binary_label.jpg", pattern(16, 16, 6))
    (labels / "binary_label.txt").write_bytes(b"\xff\xfe\x00garbage\x9c")
    return write_yaml(
        tmp_path / "data.yaml", {"train": "images/train", "val": "images/train", "names": ["a", "b", "c"]}
    )


def _by_name(records):
    return {Path(r.path).name: r for r in records}


def test_bad_images_and_rows_are_skipped_with_one_warning_each(messy_dataset: Path) -> None:
    config = load_dataset_config(messy_dataset)
    records, report = load_split(config, "train", use_cache=False)
    recs = _by_name(records)
    labels = messy_dataset.parent / "labels" / "train"
    images = messy_dataset.parent / "images" / "train"

    # Good images all there, with exactly their good rows.
    assert set(recs) == {
        "good.jpg",
        "gray.png",
        "rgba.png",
        "deep.png",
        "rot6.jpg",
        "bg.jpg",
        "empty_label.jpg",
    }
    good = recs["good.jpg"]
    assert (good.height, good.width) == (32, 48)
    np.testing.assert_array_equal(good.classes, GOOD_IMAGE_CLASSES)
    np.testing.assert_allclose(good.boxes, GOOD_IMAGE_BOXES, atol=1e-6)
    assert len(recs["bg.jpg"].classes) == 0 and len(recs["empty_label.jpg"].classes) == 0

    # One warning per bad row: "<label file>:<line>: <reason>".
    expected_rows = [(i, why) for i, (_, why) in enumerate(GOOD_IMAGE_ROWS, 1) if why]
    row_warnings = [w for w in report.warnings if w.startswith(f"{labels / 'good.txt'}:")]
    assert len(row_warnings) == len(expected_rows)
    for (line, why), warning in zip(expected_rows, row_warnings):
        assert warning.startswith(f"{labels / 'good.txt'}:{line}: "), warning
        assert why in warning, (why, warning)

    # One warning per bad image: "<image>: <reason>".
    expected_images = {
        "zero.jpg": "empty file",
        "trunc.jpg": "truncated JPEG",
        "text.jpg": "not a readable image",
        "trunc.png": "corrupt or truncated PNG",
        "binary_label.jpg": "unreadable",
    }
    for name, why in expected_images.items():
        hits = [w for w in report.warnings if w.startswith(f"{images / name}: ")]
        assert len(hits) == 1 and why in hits[0], (name, hits)

    assert report.num_images == 7
    assert report.num_skipped_images == len(expected_images)
    assert report.num_skipped_rows == len(expected_rows)
    assert report.num_background == 2
    assert report.num_clipped_rows == 2
    assert report.num_boxes == 4 + 3 + 1
    assert len(report.warnings) == len(expected_images) + len(expected_rows)
    summary = report.summary()
    assert "7 images" in summary and "skipped 5 images and 13 label rows" in summary


def test_converted_images_decode_as_their_records_say(messy_dataset: Path) -> None:
    records, _ = load_split(load_dataset_config(messy_dataset), "train", use_cache=False)
    for rec in records:
        img = read_image(rec.path)
        assert img.dtype == np.uint8 and img.shape == (rec.height, rec.width, 3), rec.path
        assert image_size(rec.path) == (rec.height, rec.width)
    recs = _by_name(records)
    gray = read_image(recs["gray.png"].path)
    assert (gray[..., 0] == gray[..., 1]).all() and (gray[..., 1] == gray[..., 2]).all()
    assert (read_image(recs["deep.png"].path) == 40000 >> 8).all()  # 16-bit scaled to 8-bit

    rot = recs["rot6.jpg"]  # EXIF rotation honoured: displayed frame is 40 rows x 24 columns
    assert (rot.height, rot.width) == (40, 24)
    np.testing.assert_allclose(rot.boxes, [[0.25, 0.75, 0.2, 0.1]], atol=1e-6)
    img = read_image(rot.path)
    assert img[:4, -4:].mean() > 200 and img[:4, :4].mean() < 200  # the white corner moved to the top right


def test_near_square_rotated_jpeg_size(tmp_path: Path) -> None:
    # 42x41 and 41x42 have the same 1/8-scale shape: the probe must fall back to a full decode.
    path = tmp_path / "r.jpg"
    path.write_bytes(jpeg_with_orientation(pattern(42, 41), 6))
    assert image_size(str(path)) == (41, 42) == read_image(str(path)).shape[:2]
    path.write_bytes(jpeg_with_orientation(pattern(42, 41), 3))  # 180°: no swap
    assert image_size(str(path)) == (42, 41) == read_image(str(path)).shape[:2]


@pytest.mark.parametrize(
    ("content", "reason"),
    # The GIF claims 1 x 1 pixels (bytes 6-9), then garbage: within the pixel limit, so the decoder refuses it.
    [
        (b"", "empty file"),
        (b"GIF89a\x01\x00\x01\x00 not really", "not a readable image"),
        (None, "cannot read file"),
    ],
)
def test_read_image_errors_name_the_file(tmp_path: Path, content: bytes | None, reason: str) -> None:
    path = tmp_path / "x.jpg"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ImageReadError, match=reason) as err:
        read_image(str(path))
    assert str(err.value).startswith(str(path))


def test_truncated_jpeg_is_refused_by_read_image(tmp_path: Path) -> None:
    data = cv2.imencode(".jpg", pattern(64, 64))[1].tobytes()
    path = tmp_path / "t.jpg"
    path.write_bytes(data[:-100])
    with pytest.raises(ImageReadError, match="truncated JPEG"):
        read_image(str(path))
    path.write_bytes(data + b"trailing bytes after the end marker are harmless")
    assert read_image(str(path)).shape == (64, 64, 3)


def test_warnings_are_logged_once_each(messy_dataset: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = load_dataset_config(messy_dataset)
    with caplog.at_level(logging.WARNING, logger="yolo11_lightning.data"):
        _, report = load_split(config, "train")
        load_split(config, "train")  # from the cache: same warnings, not logged again
    logged = [r.getMessage() for r in caplog.records if r.name == "yolo11_lightning.data"]
    assert sorted(logged) == sorted(report.warnings)


def test_split_without_usable_image_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "a.jpg").write_bytes(b"")
    (tmp_path / "images" / "b.png").write_text("nope")
    cfg = write_yaml(tmp_path / "d.yaml", {"train": "images", "val": "images", "names": ["x"]})
    with pytest.raises(DatasetError, match=r"split `val` has no usable image") as err:
        load_split(load_dataset_config(cfg), "val", use_cache=False)
    assert "a.jpg: empty file" in str(err.value) and str(cfg) in str(err.value)


def test_txt_list_with_missing_and_repeated_images(tmp_path: Path) -> None:
    write_image(tmp_path / "images" / "a.jpg", pattern(16, 16))
    write_labels(tmp_path / "labels" / "a.txt", ["0 0.5 0.5 0.5 0.5"])
    (tmp_path / "list.txt").write_text("# comment\n./images/a.jpg\nimages/missing.jpg\n\nimages/a.jpg\n")
    cfg = write_yaml(tmp_path / "d.yaml", {"train": "list.txt", "val": "list.txt", "names": ["x"]})
    records, report = load_split(load_dataset_config(cfg), "train", use_cache=False)
    assert [Path(r.path).name for r in records] == ["a.jpg"]
    assert report.num_skipped_images == 1
    assert any(
        w.startswith(str(tmp_path / "images" / "missing.jpg")) and "cannot read" in w for w in report.warnings
    )
    assert any("listed more than once" in w for w in report.warnings)


@pytest.fixture
def messy_coco(tmp_path: Path) -> Path:
    write_image(tmp_path / "img1.jpg", pattern(32, 64))
    write_image(tmp_path / "img2.jpg", pattern(16, 16, 1))
    data = {
        "images": [
            {"id": 1, "file_name": "img1.jpg", "width": 64, "height": 32},
            {"id": 2, "file_name": "img2.jpg", "width": 16, "height": 16},
            {"id": 3, "file_name": "missing.jpg", "width": 16, "height": 16},
            {"id": 1, "file_name": "img2.jpg"},
            {"id": 5},
        ],
        "categories": [{"id": 7, "name": "b"}, {"id": 3, "name": "a"}, {"id": 12, "name": "c"}],
        "annotations": [
            {"id": 1, "image_id": 1, "category_id": 7, "bbox": [8, 4, 16, 8]},
            {"id": 2, "image_id": 1, "category_id": 12, "bbox": [0, 0, 64, 32], "iscrowd": 1},
            {"id": 3, "image_id": 1, "category_id": 99, "bbox": [8, 4, 16, 8]},
            {"id": 4, "image_id": 77, "category_id": 7, "bbox": [8, 4, 16, 8]},
            {"id": 5, "image_id": 1, "category_id": 3, "bbox": [10, 10, -5, 5]},
            {"id": 6, "image_id": 1, "category_id": 3, "bbox": [60, 0, 10, 10]},
            {"id": 7, "image_id": 1, "category_id": 3, "bbox": "oops"},
            {"id": 8, "image_id": 1, "category_id": 7, "bbox": [8, 4, 16, 8]},
            {"id": 9, "image_id": 1, "category_id": 3, "bbox": [0, 0, 64.3, 32]},
        ],
    }
    (tmp_path / "ann.json").write_text(json.dumps(data))
    return write_yaml(tmp_path / "coco.yaml", {"train": "ann.json", "val": "ann.json"})


def test_coco_bad_annotations_and_images(messy_coco: Path) -> None:
    config = load_dataset_config(messy_coco)
    assert config.names == ["a", "b", "c"]  # categories sorted by id: 3, 7, 12
    records, report = load_split(config, "train", use_cache=False)
    recs = _by_name(records)
    assert list(recs) == ["img1.jpg", "img2.jpg"]
    np.testing.assert_array_equal(recs["img1.jpg"].classes, [1, 0])
    np.testing.assert_allclose(
        recs["img1.jpg"].boxes, [[0.25, 0.25, 0.25, 0.25], [0.5, 0.5, 1.0, 1.0]], atol=1e-6
    )
    assert len(recs["img2.jpg"].classes) == 0  # no annotations: background

    json_path = messy_coco.parent / "ann.json"
    expected_rows = {
        3: "unknown category_id 99",
        4: "unknown image_id 77",
        5: "zero or negative box size",
        6: "outside [0, 1]",
        7: "bbox must be 4 numbers",
        8: "duplicate of annotation id 1",
    }
    for ann_id, why in expected_rows.items():
        hits = [w for w in report.warnings if w.startswith(f"{json_path}: annotation id {ann_id}: ")]
        assert len(hits) == 1 and why in hits[0], (ann_id, hits)
    assert report.num_skipped_rows == len(expected_rows)
    assert report.num_skipped_images == 3  # missing file, duplicate id, no file_name
    assert any(w.startswith(str(messy_coco.parent / "missing.jpg")) for w in report.warnings)
    assert report.num_crowd == 1 and report.num_background == 1 and report.num_clipped_rows == 1


def test_coco_category_not_in_names_is_a_clear_error(messy_coco: Path) -> None:
    cfg = write_yaml(messy_coco, {"train": "ann.json", "val": "ann.json", "names": ["a", "b"]})
    with pytest.raises(DatasetError, match=r"ann.json: categories \['c'\] are not among"):
        load_split(load_dataset_config(cfg), "train", use_cache=False)


def test_coco_image_folder_named_in_yaml(tmp_path: Path) -> None:
    write_image(tmp_path / "val2017" / "a.jpg", pattern(16, 32))
    ann = {
        "images": [{"id": 1, "file_name": "a.jpg", "width": 32, "height": 16}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 16, 8]}],
        "categories": [{"id": 1, "name": "x"}],
    }
    (tmp_path / "annotations").mkdir()
    (tmp_path / "annotations" / "inst.json").write_text(json.dumps(ann))
    plain = write_yaml(
        tmp_path / "plain.yaml", {"train": "annotations/inst.json", "val": "annotations/inst.json"}
    )
    with pytest.raises(DatasetError, match=r"images: <folder>"):  # not found: the error says how to fix it
        load_split(load_dataset_config(plain), "val", use_cache=False)
    entry = {"json": "annotations/inst.json", "images": "val2017"}
    named = write_yaml(tmp_path / "named.yaml", {"train": entry, "val": [entry]})
    records, _ = load_split(load_dataset_config(named), "val", use_cache=False)
    assert len(records) == 1 and records[0].path == str(tmp_path / "val2017" / "a.jpg")
    np.testing.assert_allclose(records[0].boxes, [[0.25, 0.25, 0.5, 0.5]])


def test_clip_tolerance_is_small() -> None:
    assert 0 < CLIP_TOLERANCE <= 0.02  # rounding slack only; the rows above rely on it being >= 0.005
