"""Segmentation data groundwork: polygons parsed, checked and cached; geometry and masks as the reference's.

The oracle (``ultralytics``, imported with YOLO_OFFLINE=1) checks resampling, boxes from warped polygons and
the mask rasteriser / overlap encoding; faster_coco_eval checks the RLE decoder.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from data_files import pattern, write_image, write_labels, write_yaml

from yolo11_lightning.cli import check_data
from yolo11_lightning.data.sources.config import load_dataset_config
from yolo11_lightning.data.sources.rle import decode_rle
from yolo11_lightning.data.sources.split import load_split
from yolo11_lightning.structures.batch import collate_detection
from yolo11_lightning.structures.polygons import (
    apply_matrix,
    boxes_from_polygons,
    flip_horizontal,
    flip_vertical,
    letterbox_polygons,
    merge_parts,
    resample,
    resample_all,
    to_pixels,
    with_box_outlines,
)
from yolo11_lightning.structures.records import ImageRecord
from yolo11_lightning.synthetic import command as synthetic
from yolo11_lightning.synthetic.shapes import make_synthetic_dataset
from yolo11_lightning.tasks.segment.batch import collate_segmentation
from yolo11_lightning.tasks.segment.masks import instance_masks, overlap_mask, polygon_mask, rasterize

os.environ.setdefault("YOLO_OFFLINE", "1")


def _random_polygons(rng: np.random.Generator, n: int, height: int, width: int, margin: float = 10.0):
    """n star-shaped outlines (k, 2) float32 in pixels, some partly outside the image."""
    out = []
    for _ in range(n):
        k = int(rng.integers(3, 14))
        centre = rng.uniform(-margin, [width + margin, height + margin])
        angles = np.sort(rng.uniform(0, 2 * np.pi, k))
        radius = rng.uniform(3, 0.4 * max(height, width)) * rng.uniform(0.3, 1.0, k)
        out.append(np.stack([centre[0] + radius * np.cos(angles), centre[1] + radius * np.sin(angles)], 1))
    return [p.astype(np.float32) for p in out]


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(bool), b.astype(bool)
    return (a & b).sum() / max((a | b).sum(), 1)


# ----------------------------------------------------------------------------------- geometry vs oracle
def test_resample_equals_the_reference() -> None:
    from ultralytics.utils.ops import resample_segments

    rng = np.random.default_rng(0)
    polygons = [*_random_polygons(rng, 6, 64, 64), rng.uniform(0, 64, (1000, 2)).astype(np.float32)]
    polygons.append(rng.uniform(0, 64, (1500, 2)).astype(np.float32))  # longer than n: fewer points
    for n in (1000, 37):
        expected = resample_segments([p.copy() for p in polygons], n)
        for polygon, ref in zip(polygons, expected):
            np.testing.assert_array_equal(resample(polygon, n), ref)
    stacked = resample_all([*polygons[:-1], rng.uniform(0, 9, (1200, 2))])
    assert stacked.shape == (8, 1201, 2)  # the longest outline's count + 1, the reference's rule
    assert resample_all([]).shape == (0, 1000, 2)


def test_warped_polygons_give_the_reference_boxes_and_clipping() -> None:
    from ultralytics.data.augment import RandomPerspective

    rng = np.random.default_rng(1)
    width, height = 96, 64
    oracle = RandomPerspective()
    oracle.size = (width, height)
    for trial in range(6):
        points = resample_all(_random_polygons(rng, 5, height, width, margin=40), 100)
        angle, scale = rng.uniform(-0.6, 0.6), rng.uniform(0.5, 1.5)
        matrix = np.eye(3)
        matrix[:2] = cv2.getRotationMatrix2D((width / 2, height / 2), math.degrees(angle), scale)
        matrix[2, :2] = rng.uniform(-1e-3, 1e-3, 2) if trial % 2 else 0  # perspective on odd trials
        warped = apply_matrix(points, matrix)
        boxes, clipped = boxes_from_polygons(warped, width, height)
        ref_boxes, ref_segments = oracle.apply_segments(points.copy(), matrix.astype(np.float32))
        np.testing.assert_allclose(boxes, ref_boxes, atol=1e-3)
        np.testing.assert_allclose(clipped, ref_segments, atol=1e-3)
    assert (boxes[:, 2:] >= boxes[:, :2]).all()


def test_flips_and_letterbox() -> None:
    rng = np.random.default_rng(2)
    points = resample_all(_random_polygons(rng, 3, 40, 60), 50)
    np.testing.assert_allclose(flip_horizontal(flip_horizontal(points, 60), 60), points, atol=1e-5)
    flipped = flip_vertical(points, 40)
    np.testing.assert_allclose(flipped[..., 1], 40 - points[..., 1], atol=1e-5)
    np.testing.assert_array_equal(flipped[..., 0], points[..., 0])
    # A box from a flipped polygon is the flipped box.
    box, _ = boxes_from_polygons(points.clip(0, [60, 40]), 60, 40)
    fbox, _ = boxes_from_polygons(flip_horizontal(points.clip(0, [60, 40]), 60), 60, 40)
    np.testing.assert_allclose(fbox[:, [0, 2]], 60 - box[:, [2, 0]], atol=1e-4)
    lb = letterbox_polygons(points, 0.5, (3.0, 7.0))
    np.testing.assert_allclose(lb, points * 0.5 + [3.0, 7.0], atol=1e-5)
    assert to_pixels([np.array([[0.5, 0.25]])], 60, 40)[0].tolist() == [[30.0, 10.0]]
    filled = with_box_outlines([points[0], np.zeros((0, 2))], np.array([[0, 0, 0, 0], [1, 2, 5, 9]]))
    assert np.array_equal(filled[0], points[0]) and filled[1].tolist() == [[1, 2], [5, 2], [5, 9], [1, 9]]
    with pytest.raises(ValueError, match="empty polygon"):
        resample(np.zeros((0, 2)), 10)


def test_merged_parts_fill_every_part() -> None:
    squares = [
        np.array([[x, y], [x + 8, y], [x + 8, y + 8], [x, y + 8]], np.float32)
        for x, y in [(2, 2), (30, 4), (12, 30)]
    ]
    merged = merge_parts(squares)
    assert len(merged) == 12 + 2 * 2 + 1
    union = np.zeros((48, 48), np.uint8)
    for square in squares:
        union |= polygon_mask(square, 48, 48, ratio=1)
    filled = polygon_mask(merged, 48, 48, ratio=1)
    assert (filled >= union).all()  # every part filled
    assert (filled & ~union).sum() < 60  # plus only the two 1-pixel bridges (about 20 and 15 pixels long)


# ----------------------------------------------------------------------------------- masks
@pytest.mark.parametrize(("height", "width", "ratio"), [(64, 96, 4), (160, 128, 4), (64, 64, 1), (61, 90, 4)])
def test_instance_masks_equal_the_reference(height: int, width: int, ratio: int) -> None:
    from ultralytics.data.utils import polygons2masks

    rng = np.random.default_rng(height + width)
    polygons = list(resample_all(_random_polygons(rng, 6, height, width)))
    expected = polygons2masks((height, width), polygons, color=1, downsample_ratio=ratio)
    mine = instance_masks(polygons, height, width, ratio)
    assert mine.dtype == np.uint8 and mine.shape == (6, height // ratio, width // ratio)
    np.testing.assert_array_equal(mine, expected)


def test_overlap_encoding_equals_the_reference() -> None:
    from ultralytics.data.utils import polygons2masks_overlap

    rng = np.random.default_rng(3)
    exact = 0
    for trial in range(30):
        height, width = (64, 96) if trial % 2 else (96, 64)
        polygons = list(resample_all(_random_polygons(rng, int(rng.integers(1, 9)), height, width)))
        ref_map, ref_order = polygons2masks_overlap((height, width), polygons, downsample_ratio=4)
        index_map, order = overlap_mask(polygons, height, width)
        assert index_map.dtype == np.uint8 and index_map.shape == (height // 4, width // 4)
        areas = instance_masks(polygons, height, width).reshape(len(polygons), -1).sum(1)
        if len(set(areas.tolist())) == len(areas) and areas.min() > 0:
            np.testing.assert_array_equal(index_map, ref_map)
            np.testing.assert_array_equal(order, ref_order)
            exact += 1
        else:
            # Ties and empty masks: the reference's order is its sort's (empty masks first, ties unstable),
            # ours is stable with empty masks last; each instance still owns the same pixels.
            for instance in range(len(polygons)):
                ours = index_map == 1 + int(np.flatnonzero(order == instance)[0])
                theirs = ref_map == 1 + int(np.flatnonzero(ref_order == instance)[0])
                if areas[instance] == 0 or len(set(areas.tolist())) == len(areas):
                    np.testing.assert_array_equal(ours, theirs)
            assert (areas[order][:-1] >= areas[order][1:]).all()  # larger first
    assert exact >= 10
    many = [
        np.array([[i % 20 * 4, i // 20 * 4], [i % 20 * 4 + 3, i // 20 * 4], [i % 20 * 4, i // 20 * 4 + 3]])
        for i in range(300)
    ]
    big_map, _ = overlap_mask(many, 80, 80, ratio=1)
    assert big_map.dtype == np.int32 and big_map.max() == 300


def test_rasterised_masks_match_analytic_shapes() -> None:
    height, width = 128, 160
    cy, cx, r = 60.0, 70.0, 37.0
    t = np.arange(720) * 2 * np.pi / 720
    circle = np.stack([cx + r * np.cos(t), cy + r * np.sin(t)], 1)
    rect = np.array([[100, 12], [152, 12], [152, 60], [100, 60]], np.float64)
    masks, order = rasterize([circle, rect], height, width, overlap=False)
    assert order.tolist() == [0, 1] and masks.shape == (2, 32, 40)
    yy, xx = (np.mgrid[0:32, 0:40] + 0.5) * 4  # mask pixel centres in image pixels
    assert _iou(masks[0], (xx - cx) ** 2 + (yy - cy) ** 2 <= r**2) > 0.9
    assert _iou(masks[1], (xx >= 100) & (xx <= 152) & (yy >= 12) & (yy <= 60)) > 0.9
    index_map, order = rasterize([rect, circle], height, width)
    assert order.tolist() == [1, 0]  # the circle (larger) first
    assert set(np.unique(index_map).tolist()) == {0, 1, 2}
    assert abs((index_map == 1).sum() / (np.pi * (r / 4) ** 2) - 1) < 0.1


# ----------------------------------------------------------------------------------- RLE
def test_rle_decoder_equals_faster_coco_eval() -> None:
    from faster_coco_eval.core import mask as coco_mask

    rng = np.random.default_rng(4)
    for _ in range(10):
        h, w = (int(v) for v in rng.integers(3, 50, 2))
        mask = (rng.random((h, w)) < rng.uniform(0.05, 0.95)).astype(np.uint8)
        rle = coco_mask.encode(np.asfortranarray(mask))
        counts = rle["counts"].decode() if isinstance(rle["counts"], bytes) else rle["counts"]
        np.testing.assert_array_equal(decode_rle({"size": [h, w], "counts": counts}), mask)
        flat = np.concatenate([[0], mask.T.reshape(-1), [2]])
        edges = np.flatnonzero(np.diff(flat) != 0)
        runs = np.diff(np.concatenate([[0], edges])).tolist()  # uncompressed: as crowd annotations
        np.testing.assert_array_equal(decode_rle({"size": [h, w], "counts": runs}), mask)
    with pytest.raises(ValueError, match="cover 5 pixels"):
        decode_rle({"size": [2, 3], "counts": [2, 3]})


# ----------------------------------------------------------------------------------- sources + check-data
SEG_ROWS = [
    ("0 0.1 0.1 0.6 0.1 0.35 0.7", None),  # triangle
    ("1 0.7 0.7 0.2 0.2", None),  # a box row: no polygon
    ("1 0.1 0.8 0.3 0.8 0.3 0.95 0.1 0.95 0.2", "odd number of coordinates (9)"),
    ("0 0.5 0.5", "at least 3 points, got 1"),
    ("0 0.1 0.1 0.5 0.1 1.5 0.4", "coordinate 1.5 outside [0, 1]"),
    ("1 0.1 0.2 0.3 0.4 0.5 0.6", "zero area"),  # collinear: its box kept, the polygon dropped
]


def _seg_dataset(tmp_path: Path) -> Path:
    write_image(tmp_path / "images" / "a.png", pattern(40, 60))
    write_labels(tmp_path / "labels" / "a.txt", [row for row, _ in SEG_ROWS])
    return write_yaml(tmp_path / "d.yaml", {"train": "images", "val": "images", "names": ["a", "b"]})


def test_yolo_seg_rows_become_polygons_and_check_data_names_bad_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    yaml_path = _seg_dataset(tmp_path)
    (rec,), report = load_split(load_dataset_config(yaml_path), "train", use_cache=False)
    assert rec.classes.tolist() == [0, 1, 1]
    assert rec.segment_sizes.tolist() == [3, 0, 0]
    np.testing.assert_allclose(rec.polygons[0], [[0.1, 0.1], [0.6, 0.1], [0.35, 0.7]], atol=1e-6)
    assert report.num_polygons == 1 and report.num_bad_polygons == 1 and report.num_skipped_rows == 3

    assert check_data.main(["--dataset", str(yaml_path), "--no-images", "--no-cache"]) == 0
    printed = capsys.readouterr().out
    label = tmp_path / "labels" / "a.txt"
    for line_no, (_, why) in enumerate(SEG_ROWS, 1):
        if why is not None:
            assert f"{label}:{line_no}: " in printed and why in printed, (line_no, printed)
    assert "box kept without a polygon" in printed and "(1 with polygons)" in printed


def test_coco_segmentation_polygons_and_rle(tmp_path: Path) -> None:
    from faster_coco_eval.core import mask as coco_mask

    h, w = 40, 60
    write_image(tmp_path / "images" / "a.png", pattern(h, w))
    blob = np.zeros((h, w), np.uint8)
    cv2.circle(blob, (40, 20), 9, 1, -1)
    rle = coco_mask.encode(np.asfortranarray(blob))
    compressed = {"size": [h, w], "counts": rle["counts"].decode()}

    def ann(i, seg, bbox=(1.0, 1.0, 20.0, 20.0), **extra):
        return {"id": i, "image_id": 1, "category_id": 1, "bbox": list(bbox), "segmentation": seg, **extra}

    anns = [
        ann(1, [[2, 2, 20, 2, 11, 18]]),  # one polygon
        ann(2, [[30, 25, 38, 25, 38, 33, 30, 33], [45, 28, 55, 28, 55, 38]], (30, 25, 25, 13)),  # two parts
        ann(3, compressed, (31, 11, 19, 19)),  # compressed RLE
        ann(4, [[1, 1, 5, 1]], (1, 20, 5, 5)),  # 2 points: box kept, polygon dropped
        ann(5, {"size": [h + 1, w], "counts": [h * w + w]}, (5, 5, 5, 5)),  # RLE of another size
        ann(6, {"size": [h, w], "counts": [0, h * w]}, (0, 0, 60, 40), iscrowd=1),  # crowd: skipped
        ann(7, [], (10, 30, 5, 5)),  # no segmentation: no polygon
    ]
    data = {
        "images": [{"id": 1, "file_name": "a.png", "width": w, "height": h}],
        "annotations": anns,
        "categories": [{"id": 1, "name": "thing"}],
    }
    (tmp_path / "train.json").write_text(json.dumps(data))
    yaml_path = write_yaml(
        tmp_path / "c.yaml", {"train": "train.json", "val": "train.json", "names": ["thing"]}
    )
    (rec,), report = load_split(load_dataset_config(yaml_path), "train", use_cache=False)
    assert len(rec.classes) == 6 and report.num_crowd == 1
    assert rec.segment_sizes[[3, 4, 5]].tolist() == [0, 0, 0]
    assert report.num_polygons == 3 and report.num_bad_polygons == 2
    warnings = "\n".join(report.warnings)
    assert "annotation id 4: segmentation polygon needs at least 3 points, got 2" in warnings
    assert "annotation id 5: segmentation RLE size 60x41 is not the image's 60x40" in warnings
    pixels = to_pixels(rec.polygons, w, h)
    np.testing.assert_allclose(pixels[0], [[2, 2], [20, 2], [11, 18]], atol=1e-4)
    parts = polygon_mask(pixels[1], h, w, ratio=1)
    assert parts[28, 34] and parts[32, 52] and not parts[20, 45]  # both parts filled, not between
    assert _iou(polygon_mask(pixels[2], h, w, ratio=1), blob) > 0.85


def test_cache_keeps_polygons_and_rebuilds_old_formats(tmp_path: Path) -> None:
    config = load_dataset_config(_seg_dataset(tmp_path))
    (first,), report = load_split(config, "train")
    (again,), cached = load_split(config, "train")
    assert cached.from_cache and cached.num_polygons == report.num_polygons == 1
    np.testing.assert_array_equal(again.segments, first.segments)
    np.testing.assert_array_equal(again.segment_sizes, first.segment_sizes)
    # A cache of the previous format (no polygons) is rebuilt, not misread.
    path = Path(cached.cache_path)
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files if not k.startswith("segment")}
    meta = json.loads(arrays["meta"].tobytes())
    arrays["meta"] = np.frombuffer(json.dumps({**meta, "version": 1}).encode(), np.uint8)
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    (rebuilt,), fresh = load_split(config, "train")
    assert not fresh.from_cache and rebuilt.segment_sizes.tolist() == [3, 0, 0]


def test_record_polygon_sizes_must_match() -> None:
    rec = ImageRecord("x.png", 4, 4, [0, 1], np.zeros((2, 4)), np.zeros((3, 2)), [3, 0])
    assert [len(p) for p in rec.polygons] == [3, 0] and rec.num_polygons == 1
    assert ImageRecord("y.png", 4, 4, [0], np.zeros((1, 4))).segment_sizes.tolist() == [0]
    with pytest.raises(ValueError, match="polygon sizes"):
        ImageRecord("z.png", 4, 4, [0], np.zeros((1, 4)), np.zeros((3, 2)), [4])


# ----------------------------------------------------------------------------------- batch
def _sample(i: int, n: int, overlap: bool, missing: bool = False) -> dict:
    labels = torch.rand(n, 5)
    masks = (
        torch.full((8, 8), i + 1, dtype=torch.uint8) if overlap else torch.ones(n, 8, 8, dtype=torch.uint8)
    )
    return {
        "image": torch.zeros(3, 32, 32, dtype=torch.uint8), "labels": labels, "index": i, "path": f"{i}.png",
        "orig_size": (32, 32), "scale": 1.0, "pad": (0.0, 0.0), "masks": masks, "missing": missing,
    }  # fmt: skip


def test_collate_segmentation() -> None:
    samples = [_sample(0, 2, True), _sample(1, 0, True, missing=True), _sample(2, 3, True)]
    batch = collate_segmentation(samples)
    detection = collate_detection(samples)
    for key, value in detection.items():
        same = torch.equal(value, batch[key]) if isinstance(value, torch.Tensor) else value == batch[key]
        assert same, key
    assert batch["mask_overlap"] and batch["masks"].shape == (2, 8, 8) and batch["masks"].dtype == torch.uint8
    assert batch["masks"][:, 0, 0].tolist() == [1, 3]  # the missing sample's mask left out with it

    per_instance = collate_segmentation([_sample(0, 2, False), _sample(1, 0, False), _sample(2, 3, False)])
    assert not per_instance["mask_overlap"] and per_instance["masks"].shape == (5, 8, 8)
    assert len(per_instance["targets"]) == 5
    empty = collate_segmentation([_sample(0, 1, True, missing=True)])
    assert empty["masks"].shape == (0, 8, 8) and empty["images"].shape[0] == 0
    with pytest.raises(ValueError, match="all be"):
        collate_segmentation([_sample(0, 1, True), _sample(1, 1, False)])


# ----------------------------------------------------------------------------------- synthetic
def test_synthetic_segment_set_has_exact_polygons(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert synthetic.main(["--out", str(tmp_path / "s"), "--task", "segment", "--train", "6", "--val", "2",
                           "--size", "64", "96", "--classes", "8", "--coco"]) == 0  # fmt: skip
    assert capsys.readouterr().out.strip().endswith("coco.yaml")
    config = load_dataset_config(tmp_path / "s" / "data.yaml")
    records, report = load_split(config, "train", use_cache=False)
    coco_records, coco_report = load_split(
        load_dataset_config(tmp_path / "s" / "coco.yaml"), "train", use_cache=False
    )
    assert report.warnings == coco_report.warnings == []
    assert report.num_polygons == report.num_boxes > len(records)
    ious = []
    for rec, coco_rec in zip(records, coco_records):
        np.testing.assert_allclose(rec.segments, coco_rec.segments, atol=1e-6)
        np.testing.assert_allclose(rec.boxes, coco_rec.boxes, atol=1e-6)
        drawn = cv2.imread(rec.path).max(2) > 150  # bright shapes on a dark background
        filled = np.zeros_like(drawn)
        for polygon in to_pixels(rec.polygons, rec.width, rec.height):
            filled |= polygon_mask(polygon, rec.height, rec.width, ratio=1).astype(bool)
        ious.append(_iou(filled, drawn))
    assert min(ious) > 0.85, ious  # the reference's rasteriser (truncating) against the painted pixels
    out = tmp_path / "check"
    args = [
        "--dataset",
        str(tmp_path / "s" / "data.yaml"),
        "--out",
        str(out),
        "--imgsz",
        "64",
        "--samples",
        "2",
    ]
    assert check_data.main(args) == 0
    preview = cv2.imread(str(out / "val_preview.png"))
    assert preview is not None and (preview == 255).all(2).any()  # the polygon outlines (white)
    again = make_synthetic_dataset(tmp_path / "t", 6, 2, (64, 96), 8, task="segment")
    assert (again.parent / "labels" / "train" / "train_00003.txt").read_bytes() == (
        tmp_path / "s" / "labels" / "train" / "train_00003.txt"
    ).read_bytes()


def test_detection_synthetic_set_is_unchanged(tmp_path: Path) -> None:
    """Labels, json and decoded pixels of a small detection set, hashed before segmentation existed."""
    out = tmp_path / "d"
    make_synthetic_dataset(out, num_train=3, num_val=2, image_size=(40, 56), num_classes=8, seed=3, coco=True)
    h = hashlib.sha1()
    for path in sorted(out.rglob("*")):
        if path.is_file():
            h.update(str(path.relative_to(out)).encode())
            h.update(
                cv2.imread(str(path), cv2.IMREAD_UNCHANGED).tobytes()
                if path.suffix == ".png"
                else path.read_bytes()
            )
    assert h.hexdigest() == "302be03f3fc5d3447381c96dc7fb17d448155217"
