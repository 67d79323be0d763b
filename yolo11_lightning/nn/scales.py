"""The YOLO11 scales n/s/m/l/x: depth and width multiples, and the channels of a layer at a scale."""

from __future__ import annotations

import math

__all__ = ["SCALES", "scaled_channels"]

# scale -> (depth multiple, width multiple, max channels)
SCALES: dict[str, tuple[float, float, int]] = {
    "n": (0.50, 0.25, 1024),
    "s": (0.50, 0.50, 1024),
    "m": (0.50, 1.00, 512),
    "l": (1.00, 1.00, 512),
    "x": (1.00, 1.50, 512),
}


def scaled_channels(scale: str, c: int) -> int:
    """Returns the channels at a scale of a layer c wide at width 1: ceil(min(c, max) · width / 8) · 8."""
    _, width, max_ch = SCALES[scale]
    return math.ceil(min(c, max_ch) * width / 8) * 8
