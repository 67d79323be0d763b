"""Geometric and colour transforms: drawn objects stay inside their transformed boxes; oracle checks."""

from __future__ import annotations

import os

import cv2
import numpy as np
import pytest

from yolo11_lightning.data.augment.color import augment_hsv
from yolo11_lightning.data.augment.pipeline import AugmentConfig, Labelled, augment_train_sample
from yolo11_lightning.data.augment.transforms import (
    FILL_VALUE,
    flip_lr,
    flip_ud,
    letterbox,
    mosaic4,
    random_affine_matrix,
    resize_long_side,
)
from yolo11_lightning.structures.boxes import box_candidates, transform_boxes, xywhn_to_xyxy, xyxy_to_xywhn
from yolo11_lightning.structures.instances import Instances

os.environ["YOLO_OFFLINE"] = "1"

BACKGROUND = (40, 150, 40)
# One colour per image/class, far from the background, the grey fill and each other.
COLOURS = [(230, 30, 30), (30, 30, 230), (240, 240, 40), (230, 40, 230)]
SIZE = 128
NO_COLOUR = {"hsv_h": 0.0, "hsv_s": 0.0, "hsv_v": 0.0}


def drawn_images(rng: np.random.Generator, ellipse: bool) -> list[Labelled]:
    """Four images of random sizes, one solid object each (class k, colour k) with its exact box."""
    out = []
    for k in range(4):
        h, w = (int(v) for v in rng.integers(80, 130, 2))
        img = np.full((h, w, 3), BACKGROUND, np.uint8)
        bw, bh = (int(v) for v in rng.integers(32, 60, 2))
        x1, y1 = int(rng.integers(0, w - bw)), int(rng.integers(0, h - bh))
        if ellipse:
            cv2.ellipse(img, ((x1 + bw / 2, y1 + bh / 2), (bw, bh), 0), COLOURS[k], -1, lineType=cv2.LINE_8)
            ys, xs = np.nonzero((img == COLOURS[k]).all(-1))  # exact pixel extent of the drawn ellipse
            box = [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]
        else:
            img[y1 : y1 + bh, x1 : x1 + bw] = COLOURS[k]
            box = [x1, y1, x1 + bw, y1 + bh]
        resized, r = resize_long_side(img, SIZE)
        out.append(Labelled(resized, Instances(np.array([box], np.float32) * np.float32(r), np.array([k]))))
    return out


def object_extent(image: np.ndarray, k: int) -> tuple[np.ndarray | None, int]:
    """Pixel extent [x1, y1, x2, y2) of the pixels nearest to colour k (among all colours present)."""
    palette = np.array([*COLOURS, BACKGROUND, (FILL_VALUE,) * 3], np.float32)
    dist = ((image[..., None, :].astype(np.float32) - palette) ** 2).sum(-1)
    ys, xs = np.nonzero(dist.argmin(-1) == k)
    if len(xs) == 0:
        return None, 0
    return np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], np.float32), len(xs)


def iou(a: np.ndarray, b: np.ndarray) -> float:
    inter = np.clip(np.minimum(a[2:], b[2:]) - np.maximum(a[:2], b[:2]), 0, None).prod()
    return float(inter / ((a[2:] - a[:2]).prod() + (b[2:] - b[:2]).prod() - inter))


def check_boxes_fit_objects(out: Labelled) -> int:
    """Every kept box matches its object's visible pixels; no big visible object lost its box."""
    checked = 0
    size = out.image.shape[0]
    for k in range(4):
        extent, area = object_extent(out.image, k)
        rows = out.boxes[out.classes == k]
        if extent is None:
            assert len(rows) == 0, f"class {k} has a box but no visible pixels"
            continue
        side = extent[2:] - extent[:2]
        if len(rows) == 0:
            assert area < 300 or side.min() < 12, (
                f"object {k} is clearly visible ({area} px) but lost its box"
            )
            continue
        box = rows[0]
        touches_border = (box[:2] <= 1).any() or (box[2:] >= size - 1).any()
        # +-1 px of interpolation at the edges is within IoU 0.9 from about 24 px on.
        if side.min() >= 24 and not touches_border:
            assert iou(box, extent) >= 0.9, f"class {k}: box {box} vs drawn extent {extent}"
            checked += 1
    return checked


@pytest.mark.parametrize(
    ("ellipse", "geometry"),
    [
        (False, {"degrees": 0.0, "shear": 0.0}),  # mosaic + translate/scale + flips, rectangles
        (True, {"degrees": 0.0, "shear": 0.0}),  # same with ellipses
        (False, {"degrees": 15.0, "shear": 3.0, "perspective": 0.0005}),  # rotation, shear, perspective
    ],
)
@pytest.mark.parametrize("mix", [True, False])  # mosaic on / off ("close mosaic" path)
def test_drawn_objects_stay_inside_their_transformed_boxes(ellipse, geometry, mix):
    cfg = AugmentConfig(mosaic=1.0, fliplr=0.5, flipud=0.5, **NO_COLOUR, **geometry)
    checked = 0
    for seed in range(10):
        parts = drawn_images(np.random.default_rng(seed), ellipse)
        rng = np.random.default_rng(seed)
        out = augment_train_sample(0, parts.__getitem__, lambda r, k: [1, 2, 3][:k], rng, cfg, SIZE, mix)
        assert out.image.shape == (SIZE, SIZE, 3) and out.image.dtype == np.uint8
        assert out.boxes.dtype == np.float32 and out.boxes.shape == (len(out.classes), 4)
        assert ((out.boxes >= 0) & (out.boxes <= SIZE)).all(), "boxes are clipped to the image"
        if not mix:
            assert set(out.classes.tolist()) <= {0}, "without mosaic only the sample's own objects appear"
        checked += check_boxes_fit_objects(out)
    assert checked >= 5, "too few objects were checked for the test to mean anything"


def test_flips_mirror_boxes_with_the_image():
    img = np.full((50, 80, 3), BACKGROUND, np.uint8)
    img[5:20, 10:30] = COLOURS[0]
    box = np.array([[10, 5, 30, 20]], np.float32)
    for flip in (flip_lr, flip_ud):
        out, boxes = flip(img, box)
        extent, _ = object_extent(out, 0)
        np.testing.assert_array_equal(boxes[0], extent)


def test_mosaic_places_tiles_around_the_centre_and_clips_boxes():
    rng = np.random.default_rng(0)
    tiles = [np.full((64, 48, 3), 10 * (k + 1), np.uint8) for k in range(4)]
    boxes = [np.array([[0, 0, 48, 64]], np.float32)] * 4
    canvas, out, classes = mosaic4(tiles, boxes, [np.array([k]) for k in range(4)], 64, rng)
    assert canvas.shape == (128, 128, 3)
    yc, xc = (int(v) for v in np.random.default_rng(0).uniform(32, 96, 2))
    assert canvas[yc - 1, xc - 1, 0] == 10 and canvas[yc - 1, xc, 0] == 20
    assert canvas[yc, xc - 1, 0] == 30 and canvas[yc, xc, 0] == 40
    # Each whole-tile box becomes the tile's visible rectangle on the canvas.
    for k, box in zip(classes, out):
        ys, xs = np.nonzero(canvas[..., 0] == 10 * (k + 1))
        np.testing.assert_array_equal(box, [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1])


def test_letterbox_geometry_and_scaleup_switch():
    img = np.zeros((30, 60, 3), np.uint8)
    out, r, (left, top) = letterbox(img, 64)
    assert out.shape == (64, 64, 3) and r == pytest.approx(64 / 60)
    assert (
        (left, top) == (0, 16) and (out[:top] == FILL_VALUE).all() and (out[top + 32 :] == FILL_VALUE).all()
    )
    small, r, (left, top) = letterbox(img, 128, scaleup=False)
    assert r == 1.0 and small.shape == (128, 128, 3) and (left, top) == (34, 49)
    np.testing.assert_array_equal(small[top : top + 30, left : left + 60], img)


def test_box_format_round_trip_and_corner_transform():
    boxes = np.array([[0.5, 0.5, 0.2, 0.4], [0.1, 0.9, 0.2, 0.2]], np.float32)
    np.testing.assert_allclose(xyxy_to_xywhn(xywhn_to_xyxy(boxes, 80, 60), 80, 60), boxes, atol=1e-6)
    matrix, _ = random_affine_matrix(np.random.default_rng(1), (100, 80), (64, 64), degrees=30, shear=5)
    xyxy = xywhn_to_xyxy(boxes, 100, 80)
    got = transform_boxes(xyxy, matrix)
    for box, row in zip(xyxy, got):  # one box at a time, corner by corner
        corners = np.array([[x, y, 1] for x in box[[0, 2]] for y in box[[1, 3]]]) @ matrix.T
        np.testing.assert_allclose(row, [*corners[:, :2].min(0), *corners[:, :2].max(0)], rtol=1e-5)


def test_box_candidates_drop_degenerate_boxes():
    before = np.array([[0, 0, 10, 10]] * 4, np.float32)
    after = np.array([[0, 0, 10, 10], [0, 0, 1.5, 10], [0, 0, 3, 3], [0, 0, 9, 9]], np.float32)
    np.testing.assert_array_equal(box_candidates(before, after), [True, False, False, True])
    wide = np.array([[0, 0, 1000, 1000]], np.float32), np.array([[0, 0, 500, 4.9]], np.float32)
    assert not box_candidates(*wide)[0]  # aspect ratio > 100


def test_hsv_is_deterministic_and_keeps_greys_grey():
    img = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    img[:4] = 100  # a grey band: zero saturation stays zero, hue cannot tint it
    a = augment_hsv(img, np.random.default_rng(5), 0.015, 0.7, 0.4)
    b = augment_hsv(img, np.random.default_rng(5), 0.015, 0.7, 0.4)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, img)
    assert (a[:4] == a[:4, :, :1]).all(), "grey pixels got tinted"
    np.testing.assert_array_equal(augment_hsv(img, np.random.default_rng(5), 0, 0, 0), img)


def test_mixup_keeps_labels_of_both_samples():
    parts = drawn_images(np.random.default_rng(0), ellipse=False)
    cfg = AugmentConfig(mosaic=0.0, mixup=1.0, **NO_COLOUR, fliplr=0.0)
    out = augment_train_sample(
        0, parts.__getitem__, lambda r, k: [3][:k], np.random.default_rng(0), cfg, SIZE
    )
    assert set(out.classes.tolist()) == {0, 3}


def test_augment_config_names_the_bad_key():
    with pytest.raises(ValueError, match="fliplr"):
        AugmentConfig(fliplr=1.5)
    with pytest.raises(ValueError, match="scale"):
        AugmentConfig(scale=1.0)


def test_letterbox_matches_the_reference_pixels():
    augment = pytest.importorskip("ultralytics.data.augment")
    img = np.random.default_rng(0).integers(0, 256, (45, 77, 3), dtype=np.uint8)
    for size, scaleup in [(64, True), (128, False), (96, True)]:
        ref = augment.LetterBox(new_shape=(size, size), scaleup=scaleup)(image=img)
        np.testing.assert_array_equal(letterbox(img, size, scaleup=scaleup)[0], ref)


def test_box_candidates_match_the_reference():
    augment = pytest.importorskip("ultralytics.data.augment")
    rng = np.random.default_rng(0)
    before = np.sort(rng.uniform(0, 50, (200, 4)), axis=1)[:, [0, 1, 2, 3]].astype(np.float32)
    before = np.concatenate([before[:, :2], before[:, :2] + rng.uniform(1, 30, (200, 2))], 1)
    after = before * rng.uniform(0.05, 1.2, (200, 4))
    after[:, 2:] = np.maximum(after[:, 2:], after[:, :2])
    ref = augment.RandomPerspective.box_candidates(before.T, after.T)
    np.testing.assert_array_equal(box_candidates(before, after), ref)
