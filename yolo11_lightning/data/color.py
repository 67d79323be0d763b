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
    saturation and value are multiplied by ``1 + r``, clipped to [0, 255]. One 3-channel LUT over the HSV
    image does all three in a single pass.

    Returns:
        a new (H, W, 3) uint8 RGB image (the input is left untouched).
    """
    r = rng.uniform(-1.0, 1.0, size=3) * np.array([hgain, sgain, vgain])
    if not r.any():
        return image
    x = np.arange(256, dtype=np.float64)
    lut = np.empty((256, 1, 3), dtype=np.uint8)
    lut[:, 0, 0] = np.mod(x + r[0] * 180, 180).astype(np.uint8)
    lut[:, 0, 1] = np.clip(x * (1 + r[1]), 0, 255).astype(np.uint8)
    lut[:, 0, 2] = np.clip(x * (1 + r[2]), 0, 255).astype(np.uint8)
    hsv = cv2.cvtColor(image, cv2.COLOR_RGB2HSV)
    return cv2.cvtColor(cv2.LUT(hsv, lut), cv2.COLOR_HSV2RGB)
