"""Instance outlines: the Polygons label field and its resampling, warps, flips and boxes.

Coordinates are pixels ``x, y`` of the image the polygons belong to, in (N, M, 2) float32 arrays: N
instances of M points each. Polygons come from the records as lists of (k_i, 2) normalised outlines
(``ImageRecord.polygons``); ``to_pixels`` scales them and ``resample`` gives them one common point count,
so that an affine or perspective warp moves every outline point by point (a warped straight edge stays
straight only for affine maps; dense points keep perspective-warped outlines accurate) and clipping at
the image border follows the outline closely.

Boxes after a warp are re-derived from the warped polygons (``boxes_from_polygons``), not from warped
boxes: a rotated box's corners overshoot the object, the polygon's extent does not. Everything here is
pure numpy, deterministic, and never changes its inputs.

``Polygons`` is the segmentation task's instance field (``instances.InstanceField``): one outline per box,
moved by every augmentation step with the boxes.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from yolo11_lightning.structures.boxes import xywhn_to_xyxy
from yolo11_lightning.structures.instances import InstanceField
from yolo11_lightning.structures.records import ImageRecord

__all__ = [
    "RESAMPLE_POINTS",
    "Polygons",
    "apply_matrix",
    "box_outlines",
    "boxes_from_polygons",
    "flip_horizontal",
    "flip_vertical",
    "letterbox_polygons",
    "merge_parts",
    "resample",
    "resample_all",
    "to_pixels",
    "with_box_outlines",
]

# Points per outline before warping (the reference's choice for segments): enough that clipping a
# warped outline at the image border follows it closely.
RESAMPLE_POINTS = 1000


def resample(polygon: np.ndarray, n: int) -> np.ndarray:
    """Resamples a closed (k, 2) outline as (n, 2) float32 points along its perimeter, even in vertex index.

    The outline is closed (its first point appended), then sampled at n parameters evenly spaced over
    its k + 1 vertices by linear interpolation. With k < n the original vertices are kept too: n - k - 1
    samples plus the k + 1 vertices, so corners stay sharp. A polygon of exactly n points is returned
    as it is. (This is the reference's resampling.)
    """
    points = np.asarray(polygon, np.float32).reshape(-1, 2)
    if len(points) == 0:
        raise ValueError("cannot resample an empty polygon (an instance without one: see box_outlines)")
    if len(points) == n:
        return points.copy()
    closed = np.concatenate([points, points[:1]])
    vertices = np.arange(len(closed), dtype=np.float64)
    last = len(closed) - 1
    if len(closed) < n:
        samples = np.linspace(0, last, n - len(closed))
        params = np.insert(samples, np.searchsorted(samples, vertices), vertices)
    else:
        params = np.linspace(0, last, n)
    out = np.stack([np.interp(params, vertices, closed[:, 0]), np.interp(params, vertices, closed[:, 1])], 1)
    return out.astype(np.float32)


def resample_all(polygons: Sequence[np.ndarray], n: int = RESAMPLE_POINTS) -> np.ndarray:
    """Resamples outlines of different lengths into one (N, M, 2) float32 array.

    M = n, or the longest length + 1 when that is longer.

    An outline longer than ``n`` would lose points: then every outline gets the longest's point count
    plus one (the reference's rule). No outlines: a (0, n, 2) array.
    """
    if not len(polygons):
        return np.zeros((0, n, 2), np.float32)
    longest = max(len(p) for p in polygons)
    m = longest + 1 if longest > n else n
    return np.stack([resample(p, m) for p in polygons])


def box_outlines(xyxy: np.ndarray) -> np.ndarray:
    """Returns the rectangles (N, 4, 2) float32 of (N, 4) xyxy boxes, clockwise from top-left.

    The outline to give an instance that has a box but no polygon (a box row of a YOLO-seg file, a COCO
    annotation without ``segmentation``), where a mask is needed for every instance.
    """
    b = np.asarray(xyxy, np.float32).reshape(-1, 4)
    return np.stack([b[:, [0, 1]], b[:, [2, 1]], b[:, [2, 3]], b[:, [0, 3]]], 1)


def with_box_outlines(polygons: Sequence[np.ndarray], xyxy: np.ndarray) -> list[np.ndarray]:
    """Replaces each empty polygon with its box's rectangle, in the same units."""
    rects = box_outlines(xyxy)
    return [np.asarray(p, np.float32).reshape(-1, 2) if len(p) else rects[i] for i, p in enumerate(polygons)]


def to_pixels(polygons: Sequence[np.ndarray], width: float, height: float) -> list[np.ndarray]:
    """Converts normalised (k_i, 2) outlines to pixel (k_i, 2) float32 outlines of a width x height image."""
    scale = np.array([width, height], np.float32)
    return [np.asarray(p, np.float32).reshape(-1, 2) * scale for p in polygons]


def apply_matrix(points: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """Maps (..., 2) points by a 3x3 homogeneous matrix, affine or perspective, to (..., 2) float32."""
    pts = np.asarray(points, np.float32)
    flat = pts.reshape(-1, 2).astype(np.float64)
    m = np.asarray(matrix, np.float64)
    xyw = flat @ m[:, :2].T + m[:, 2]
    return (xyw[:, :2] / xyw[:, 2:3]).astype(np.float32).reshape(pts.shape)


def boxes_from_polygons(points: np.ndarray, width: float, height: float) -> tuple[np.ndarray, np.ndarray]:
    """Returns the (N, 4) xyxy float32 boxes of warped (N, M, 2) outlines, and the outlines clipped to them.

    Per outline: when 3 or 4 of its sides (min x, min y, max x, max y) are outside the image, all its
    points are first clipped to the image; the box is then the extent of the points inside the image
    (all zeros when none is), and every point is clipped into that box. This is the reference's rule
    after a warp: an outline mostly off the image keeps the part that is on it, and one that crosses
    a single border keeps the extent of its points inside the image.
    """
    pts = np.asarray(points, np.float32)
    if pts.size == 0:
        return np.zeros((len(pts), 4), np.float32), pts.copy()
    x, y = pts[..., 0].copy(), pts[..., 1].copy()
    outside_sides = (
        (x.min(1) < 0).astype(int) + (y.min(1) < 0) + (x.max(1) > width) + (y.max(1) > height)
    ) >= 3
    x[outside_sides] = x[outside_sides].clip(0, width)
    y[outside_sides] = y[outside_sides].clip(0, height)
    inside = (x >= 0) & (y >= 0) & (x <= width) & (y <= height)
    any_inside = inside.any(1)
    boxes = np.stack(
        [
            np.where(inside, x, np.inf).min(1),
            np.where(inside, y, np.inf).min(1),
            np.where(inside, x, -np.inf).max(1),
            np.where(inside, y, -np.inf).max(1),
        ],
        1,
    )
    boxes[~any_inside] = 0
    boxes = boxes.astype(np.float32)
    clipped = np.stack(
        [pts[..., 0].clip(boxes[:, 0:1], boxes[:, 2:3]), pts[..., 1].clip(boxes[:, 1:2], boxes[:, 3:4])], -1
    )
    return boxes, clipped.astype(np.float32)


def flip_horizontal(points: np.ndarray, width: float) -> np.ndarray:
    """Mirrors (..., 2) pixel points left-right in an image ``width`` pixels wide: x -> width - x."""
    out = np.array(points, np.float32, copy=True)
    out[..., 0] = width - out[..., 0]
    return out


def flip_vertical(points: np.ndarray, height: float) -> np.ndarray:
    """Mirrors (..., 2) pixel points top-bottom in an image ``height`` pixels high: y -> height - y."""
    out = np.array(points, np.float32, copy=True)
    out[..., 1] = height - out[..., 1]
    return out


def letterbox_polygons(points: np.ndarray, scale: float, pad: tuple[float, float]) -> np.ndarray:
    """Maps original-image (..., 2) pixel points to letterboxed pixels: xy * scale + (left, top)."""
    return np.asarray(points, np.float32) * np.float32(scale) + np.asarray(pad, np.float32)


def merge_parts(parts: Sequence[np.ndarray]) -> np.ndarray:
    """Merges several closed (k_i, 2) outlines of one object into one outline that fills them all.

    Consecutive parts are joined by a zero-width bridge between their closest vertices; the walk goes
    around part i from where it entered to the bridge to part i + 1, visits the rest of the chain, comes
    back over the same bridge and finishes part i. The one outline therefore covers each part (bridges
    add no area), as a COCO multi-polygon annotation is meant, and has sum(k_i) + 2 (len(parts) - 1)
    + 1 points. One part is returned as it is.
    """
    parts = [np.asarray(p, np.float32).reshape(-1, 2) for p in parts if len(p)]
    if len(parts) <= 1:
        return parts[0].copy() if parts else np.zeros((0, 2), np.float32)
    exits, entries = [], []  # exits[i]: vertex of part i bridged to part i + 1; entries[i + 1]: its end
    for a, b in itertools.pairwise(parts):
        d = ((a[:, None, :].astype(np.float64) - b[None, :, :]) ** 2).sum(-1)
        i, j = np.unravel_index(int(np.argmin(d)), d.shape)
        exits.append(int(i))
        entries.append(int(j))

    def walk(k: int, start: int) -> list[np.ndarray]:
        part = parts[k]
        ring = np.concatenate([part[start:], part[:start], part[start : start + 1]])  # closed at start
        if k == len(parts) - 1:
            return [ring]
        cut = (exits[k] - start) % len(part)  # position of the exit vertex along the ring
        return [ring[: cut + 1], *walk(k + 1, entries[k]), ring[cut:]]

    return np.concatenate(walk(0, exits[0]))


class Polygons(InstanceField):
    """One outline per instance: ``points`` (n, M, 2) float32 ``x, y`` pixels, every outline M points.

    Records' outlines are resampled to ``resample_points`` (``RESAMPLE_POINTS``; more for longer ones); an instance without one gets
    its box's rectangle. After a warp the boxes are the outlines' extent (``boxes_from_polygons``), kept when
    they keep more than 1 % of their zoomed area (the reference's rule with segments).
    """

    name = "polygons"
    reads_polygons = True
    derives_boxes = True
    min_area_ratio = 0.01
    resample_points: ClassVar[int] = RESAMPLE_POINTS  # points per outline (a subclass may take fewer)

    def __init__(self, points: np.ndarray) -> None:
        self.points = points

    def __len__(self) -> int:
        return len(self.points)

    @classmethod
    def from_record(cls, record: ImageRecord, width: float, height: float) -> Polygons:
        boxes = xywhn_to_xyxy(record.boxes, width, height)
        outlines = with_box_outlines(to_pixels(record.polygons, width, height), boxes)
        return cls(resample_all(outlines, cls.resample_points))

    @classmethod
    def empty(cls) -> Polygons:
        return cls(np.zeros((0, cls.resample_points, 2), np.float32))

    @classmethod
    def concat(cls, parts: Sequence[InstanceField]) -> Polygons:
        """Joins the parts into one (sum n_k, max M_k, 2) array.

        Shorter outlines are resampled to the longest, the reference's rule.
        """
        arrays = [p.points for p in parts]  # type: ignore[attr-defined]
        m = max(a.shape[1] for a in arrays)
        same = [
            a
            if a.shape[1] == m
            else np.stack([resample(q, m) for q in a] or [np.zeros((m, 2), np.float32)])[: len(a)]
            for a in arrays
        ]
        return cls(np.concatenate(same).astype(np.float32, copy=False))

    def select(self, keep: np.ndarray) -> Polygons:
        return type(self)(self.points[keep])

    def placed(self, scale: float, offset: tuple[float, float]) -> Polygons:
        scaled = self.points if scale == 1 else self.points * np.float32(scale)
        return type(self)(scaled + np.array(offset, dtype=np.float32))

    def clipped(self, width: float, height: float) -> Polygons:
        p = self.points
        return type(self)(np.stack([p[..., 0].clip(0, width), p[..., 1].clip(0, height)], -1))

    def warped(self, matrix: np.ndarray, out_wh: tuple[int, int]) -> tuple[Polygons, np.ndarray]:
        boxes, clipped = boxes_from_polygons(apply_matrix(self.points, matrix), *out_wh)
        return type(self)(clipped), boxes

    def flipped_lr(self, width: float) -> Polygons:
        return type(self)(flip_horizontal(self.points, width))

    def flipped_ud(self, height: float) -> Polygons:
        return type(self)(flip_vertical(self.points, height))
