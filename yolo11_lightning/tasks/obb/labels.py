"""Oriented-box labels: the four corners of each box moved by augmentation, and the rotated boxes they give.

A YOLO OBB row is ``class x1 y1 x2 y2 x3 y3 x4 y4``, the corners normalised to the image (the reference's DOTA-style
format). The YOLO parser reads it as a 4-point polygon (``ImageRecord.segments``); ``ObbCorners`` is that outline
resampled to 100 points (the reference's count for OBB labels: each side stays a straight run of points, so a
warped and clipped box keeps the outline of what is left of it), moved by every augmentation step exactly as
segmentation's ``Polygons``. At the end of a sample ``rotated_boxes`` turns each moved outline into the smallest
rotated rectangle around it (OpenCV's ``minAreaRect``, as the reference's ``Format``): centre, size and an angle in
radians in OpenCV's range (OpenCV 5: [−π/2, 0); 4.5.1 to 4.x: (0, π/2]), the same boxes either way.

``corner_problem`` is ``check-data``'s test of one row's values: the number of values, repeated corners, zero area
and a self-intersecting (bow-tie) quadrilateral. A row of repeated corners or zero area is dropped when the split is
read (``checks.degenerate_corners``, ``DatasetConfig.outline_labels``); the others are named and kept.
"""

from __future__ import annotations

import math
from typing import ClassVar

import cv2
import numpy as np

from yolo11_lightning.data.sources.checks import degenerate_corners
from yolo11_lightning.structures.polygons import Polygons

__all__ = ["OBB_RESAMPLE_POINTS", "ObbCorners", "corner_problem", "rotated_boxes"]

OBB_RESAMPLE_POINTS = 100  # points per box outline through augmentation (the reference's count for OBB)


class ObbCorners(Polygons):
    """Each instance's box outline: ``points`` (n, 100, 2) float32 pixels (``Polygons`` with fewer points).

    An instance labelled by a box row (5 values) gets its box's rectangle, an axis-aligned rotated box."""

    name = "corners"
    resample_points: ClassVar[int] = OBB_RESAMPLE_POINTS


def rotated_boxes(points: np.ndarray) -> np.ndarray:
    """Fits each (n, M, 2) pixel outline's minimum-area rotated rectangle, as (n, 5) float32 cx, cy, w, h, r.

    As the reference's, by ``cv2.minAreaRect``: r in radians in OpenCV's range (see the module docstring).
    """
    out = np.zeros((len(points), 5), np.float32)
    for i, outline in enumerate(np.asarray(points, np.float32)):
        (cx, cy), (w, h), degrees = cv2.minAreaRect(outline)
        out[i] = (cx, cy, w, h, degrees / 180 * math.pi)
    return out


def _segments_cross(p1: np.ndarray, p2: np.ndarray, q1: np.ndarray, q2: np.ndarray) -> bool:
    """Tells whether segments p1p2 and q1q2 meet; touching counts."""
    d1, d2 = _cross(q1, q2, p1), _cross(q1, q2, p2)
    d3, d4 = _cross(p1, p2, q1), _cross(p1, p2, q2)
    if ((d1 > 0) != (d2 > 0)) and ((d3 > 0) != (d4 > 0)) and 0 not in (d1, d2, d3, d4):
        return True

    def on(a: np.ndarray, b: np.ndarray, c: np.ndarray, d: float) -> bool:
        return (
            d == 0
            and min(a[0], b[0]) <= c[0] <= max(a[0], b[0])
            and min(a[1], b[1]) <= c[1] <= max(a[1], b[1])
        )

    return on(q1, q2, p1, d1) or on(q1, q2, p2, d2) or on(p1, p2, q1, d3) or on(p1, p2, q2, d4)


def _cross(o: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
    return float((a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0]))


def corner_problem(coords: np.ndarray) -> str | None:
    """Tells why one OBB row's coordinates, the values after the class, are not a usable box, or None.

    Four corners (8 values) in order around the box, no two equal and not on one line (``checks.degenerate_corners``:
    such a row is dropped when the split is read), opposite sides not crossing (a bow tie: two corners swapped)."""
    values = np.asarray(coords, np.float64).reshape(-1)
    if len(values) != 8:
        return f"an oriented box has 9 values (class x1 y1 x2 y2 x3 y3 x4 y4), got {len(values) + 1}"
    p = values.reshape(4, 2)
    why = degenerate_corners(p)
    if why is not None:
        return why
    if _segments_cross(p[0], p[1], p[2], p[3]) or _segments_cross(p[1], p[2], p[3], p[0]):
        return "self-intersecting oriented box: its sides cross (corners not in order around the box)"
    return None
