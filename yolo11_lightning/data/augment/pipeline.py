"""The training augmentation pipeline and its hyper-parameters.

Order, as the reference: mosaic of 4 (or letterbox) -> random affine back to ``size`` -> mixup ->
HSV -> vertical flip -> horizontal flip. Every random number comes from the generator passed in,
so a sample's augmentation is a function of the generator's seed alone (the Dataset seeds it from
``(seed, epoch, index)``), whatever the number of workers, ranks or nodes.

The labels travel as ``structures.instances.Instances``: boxes, classes and the task's instance fields (a
segmentation sample's outlines), every step moving all of them with the same numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import NamedTuple

import cv2
import numpy as np

from yolo11_lightning.data.augment.color import augment_hsv
from yolo11_lightning.data.augment.transforms import (
    letterbox_fit,
    mixup,
    mosaic_offsets,
    random_affine_matrix,
    warp_tiles,
)
from yolo11_lightning.structures.instances import Instances


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
    """An image and its instances.

    Attributes:
        image: (H, W, 3) uint8 RGB.
        instances: boxes (n, 4) float32 xyxy and fields in pixels of ``image``, classes (n,) int64.
    """

    image: np.ndarray
    instances: Instances

    @property
    def boxes(self) -> np.ndarray:
        return self.instances.boxes

    @property
    def classes(self) -> np.ndarray:
        return self.instances.classes


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
        instances = Instances.tiled([p.instances for p in parts], offsets, canvas_wh)
    else:
        item = load(index)
        image, r, (left, top) = letterbox_fit(item.image, (size, size))
        tiles, offsets, canvas_wh = [image], [(left, top)], (size, size)
        instances = item.instances.placed(r, (left, top))
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
    return Labelled(image, instances.warped(matrix, zoom, (size, size)))


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
        image = mixup(sample.image, other.image, rng)
        sample = Labelled(image, Instances.concat([sample.instances, other.instances]))
    image, instances = augment_hsv(sample.image, rng, cfg.hsv_h, cfg.hsv_s, cfg.hsv_v), sample.instances
    if rng.random() < cfg.flipud:
        image, instances = cv2.flip(image, 0), instances.flipped_ud(image.shape[0])
    if rng.random() < cfg.fliplr:
        image, instances = cv2.flip(image, 1), instances.flipped_lr(image.shape[1])
    return Labelled(image, instances)
