"""The training augmentation pipeline and its hyper-parameters.

Order, as the reference: mosaic of 4 (or letterbox) -> random affine back to ``size`` -> mixup ->
HSV -> vertical flip -> horizontal flip. Every random number comes from the generator passed in,
so a sample's augmentation is a function of the generator's seed alone (the Dataset seeds it from
``(seed, epoch, index)``), whatever the number of workers, ranks or nodes.

Segmentation samples (``Labelled.polygons`` set) carry one resampled outline per box through the same
steps and the same random draws: mosaic moves and clips them to the canvas, the affine warps them with
the matrix the image warp realised and re-derives the boxes from them (``polygons.boxes_from_polygons``),
mixup concatenates and the flips mirror them. Detection samples (``polygons`` None) take exactly the
code path they took before polygons existed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import NamedTuple

import numpy as np

from yolo11_lightning.data.augment.color import augment_hsv
from yolo11_lightning.data.augment.transforms import (
    affine_boxes,
    box_candidates,
    clip_boxes,
    flip_lr,
    flip_ud,
    letterbox_fit,
    mixup,
    mosaic_offsets,
    random_affine_matrix,
    tile_boxes,
    warp_tiles,
)
from yolo11_lightning.data.polygons import (
    apply_matrix,
    boxes_from_polygons,
    flip_horizontal,
    flip_vertical,
    resample,
)


@dataclass(frozen=True)
class AugmentConfig:
    """Augmentation hyper-parameters; defaults are the reference's training recipe.

    Attributes:
        mosaic: probability of a 4-image mosaic (else letterbox).
        mixup: probability of blending with a second augmented sample.
        degrees: rotation range +/- degrees.
        translate: centre shift range +/- fraction of the output size.
        scale: zoom range 1 +/- scale.
        shear: shear range +/- degrees.
        perspective: perspective coefficient range +/- (0.001 is already strong).
        fliplr, flipud: flip probabilities.
        hsv_h, hsv_s, hsv_v: HSV gains (hue as a fraction of a turn).
    """

    mosaic: float = 1.0
    mixup: float = 0.0
    degrees: float = 0.0
    translate: float = 0.1
    scale: float = 0.5
    shear: float = 0.0
    perspective: float = 0.0
    fliplr: float = 0.5
    flipud: float = 0.0
    hsv_h: float = 0.015
    hsv_s: float = 0.7
    hsv_v: float = 0.4

    def __post_init__(self) -> None:
        for name in ("mosaic", "mixup", "fliplr", "flipud", "hsv_h", "hsv_s", "hsv_v", "translate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"AugmentConfig.{name} must be in [0, 1], got {value}")
        if not 0.0 <= self.scale < 1.0:
            raise ValueError(f"AugmentConfig.scale must be in [0, 1) (zoom 1 +/- scale), got {self.scale}")
        for name in ("degrees", "shear", "perspective"):
            if getattr(self, name) < 0:
                raise ValueError(f"AugmentConfig.{name} must be >= 0, got {getattr(self, name)}")

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


class Labelled(NamedTuple):
    """An image with its boxes (and, for segmentation, one outline per box).

    Attributes:
        image: (H, W, 3) uint8 RGB.
        boxes: (n, 4) float32 xyxy in pixels of ``image``.
        classes: (n,) int64.
        polygons: (n, M, 2) float32 outlines ``x, y`` in pixels of ``image``, row i the outline of box i
            (every outline resampled to one point count M); None for detection.
    """

    image: np.ndarray
    boxes: np.ndarray
    classes: np.ndarray
    polygons: np.ndarray | None = None


# Box filter after the warp for segmentation samples: an instance is kept when its polygon-derived box
# keeps more than this share of its zoomed box area (the reference's 0.01 with segments, 0.1 without).
SEGMENT_MIN_AREA_RATIO = 0.01


def stack_outlines(polygons: Sequence[np.ndarray]) -> np.ndarray:
    """(n_k, M_k, 2) outline arrays -> one (sum n_k, max M_k, 2) float32 array (shorter ones resampled).

    The reference's rule when instances of different point counts meet (mosaic, mixup).
    """
    m = max(p.shape[1] for p in polygons)
    parts = [
        p
        if p.shape[1] == m
        else np.stack([resample(q, m) for q in p] or [np.zeros((m, 2), np.float32)])[: len(p)]
        for p in polygons
    ]
    return np.concatenate(parts).astype(np.float32, copy=False)


def _tile_polygons(parts: Sequence[Labelled], offsets: Sequence[tuple[int, int]], canvas_wh: tuple[int, int]):
    """Mosaic tiles' outlines moved to the canvas and clipped to it, filtered like ``tile_boxes``' boxes."""
    moved = [p.polygons + np.array(o, np.float32) for p, o in zip(parts, offsets)]
    polygons = stack_outlines(moved)
    polygons = np.stack([polygons[..., 0].clip(0, canvas_wh[0]), polygons[..., 1].clip(0, canvas_wh[1])], -1)
    boxes = [p.boxes + np.array([ox, oy, ox, oy], dtype=np.float32) for p, (ox, oy) in zip(parts, offsets)]
    boxes = clip_boxes(np.concatenate(boxes), *canvas_wh)
    keep = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])  # tile_boxes' rule, row for row
    return polygons[keep]


def _affine_polygons(
    polygons: np.ndarray, boxes: np.ndarray, classes: np.ndarray, matrix: np.ndarray, zoom: float, size: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Outlines through ``matrix``; boxes re-derived from them; rows filtered (``SEGMENT_MIN_AREA_RATIO``).

    Returns (boxes (k, 4), classes (k,), polygons (k, M, 2)) of the kept instances, rows aligned.
    """
    warped = apply_matrix(polygons, matrix)
    new_boxes, clipped = boxes_from_polygons(warped, size, size)
    keep = box_candidates(boxes * zoom, new_boxes, min_area_ratio=SEGMENT_MIN_AREA_RATIO)
    return new_boxes[keep], classes[keep], clipped[keep]


LoadFn = Callable[[int], Labelled]
"""Dataset index -> the image resized so its long side is the output size, with its boxes."""
PickFn = Callable[[np.random.Generator, int], Sequence[int]]
"""(generator, k) -> k dataset indices to mix in (mosaic partners, mixup partner)."""


def _geometric(
    index: int, load: LoadFn, pick: PickFn, rng: np.random.Generator, cfg: AugmentConfig, size: int, mix: bool
) -> Labelled:
    """Mosaic (or letterbox) then random affine to (size, size).

    The tiles are never painted on a full canvas when the affine only zooms and shifts (the default
    geometry): ``warp_tiles`` resizes the canvas window the output sees, and the boxes go through the
    matrix it realised.
    """
    if mix and rng.random() < cfg.mosaic:
        parts = [load(i) for i in (index, *pick(rng, 3))]
        tiles = [p.image for p in parts]
        offsets = mosaic_offsets([t.shape[:2] for t in tiles], size, rng)
        canvas_wh = (2 * size, 2 * size)
        boxes, classes = tile_boxes([p.boxes for p in parts], [p.classes for p in parts], offsets, canvas_wh)
        polygons = None if parts[0].polygons is None else _tile_polygons(parts, offsets, canvas_wh)
    else:
        item = load(index)
        image, r, (left, top) = letterbox_fit(item.image, (size, size))
        tiles, offsets, canvas_wh = [image], [(left, top)], (size, size)
        boxes = item.boxes * np.float32(r) + np.array([left, top, left, top], dtype=np.float32)
        classes = item.classes
        polygons = None
        if item.polygons is not None:
            polygons = item.polygons * np.float32(r) + np.array([left, top], dtype=np.float32)
    matrix, zoom = random_affine_matrix(
        rng,
        in_wh=canvas_wh,
        out_wh=(size, size),
        degrees=cfg.degrees,
        translate=cfg.translate,
        scale=cfg.scale,
        shear=cfg.shear,
        perspective=cfg.perspective,
    )
    image, matrix = warp_tiles(tiles, offsets, canvas_wh, matrix, (size, size))
    if polygons is None:
        return Labelled(image, *affine_boxes(boxes, classes, matrix, zoom, (size, size)))
    return Labelled(image, *_affine_polygons(polygons, boxes, classes, matrix, zoom, size))


def augment_train_sample(
    index: int,
    load: LoadFn,
    pick: PickFn,
    rng: np.random.Generator,
    cfg: AugmentConfig,
    size: int,
    mix: bool = True,
) -> Labelled:
    """One training sample of (size, size) pixels.

    Args:
        index: dataset index of the main image.
        load: reads an image resized to long side ``size`` (see ``LoadFn``).
        pick: chooses partner indices for mosaic and mixup.
        rng: this sample's generator; the only source of randomness.
        cfg: hyper-parameters.
        size: output side in pixels.
        mix: False switches mosaic and mixup off (the last epochs, "close mosaic").
    """
    sample = _geometric(index, load, pick, rng, cfg, size, mix)
    if mix and rng.random() < cfg.mixup:
        other = _geometric(pick(rng, 1)[0], load, pick, rng, cfg, size, mix)
        sample = Labelled(
            mixup(sample.image, other.image, rng),
            np.concatenate([sample.boxes, other.boxes]),
            np.concatenate([sample.classes, other.classes]),
            None if sample.polygons is None else stack_outlines([sample.polygons, other.polygons]),
        )
    image, boxes = augment_hsv(sample.image, rng, cfg.hsv_h, cfg.hsv_s, cfg.hsv_v), sample.boxes
    polygons = sample.polygons
    if rng.random() < cfg.flipud:
        image, boxes = flip_ud(image, boxes)
        polygons = None if polygons is None else flip_vertical(polygons, image.shape[0])
    if rng.random() < cfg.fliplr:
        image, boxes = flip_lr(image, boxes)
        polygons = None if polygons is None else flip_horizontal(polygons, image.shape[1])
    return Labelled(image, boxes.astype(np.float32, copy=False), sample.classes, polygons)
