"""Box arithmetic on (n, 4) numpy arrays in pixels: format changes, clipping, mapping through a matrix, flips, and
which boxes survive a warp. Every label structure and the augmentation pipeline move boxes with these."""

from __future__ import annotations

import numpy as np

__all__ = [
    "box_candidates",
    "clip_boxes",
    "flip_boxes_lr",
    "flip_boxes_ud",
    "transform_boxes",
    "xywhn_to_xyxy",
    "xyxy_to_xywhn",
]


def xywhn_to_xyxy(boxes: np.ndarray, width: float, height: float) -> np.ndarray:
    """Converts (n, 4) normalised cx, cy, w, h boxes to (n, 4) float32 pixel x1, y1, x2, y2."""
    boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
    scale = np.array([width, height, width, height], dtype=np.float32)
    half = boxes[:, 2:] / 2
    return np.concatenate([boxes[:, :2] - half, boxes[:, :2] + half], axis=1) * scale


def xyxy_to_xywhn(boxes: np.ndarray, width: float, height: float) -> np.ndarray:
    """Converts (n, 4) pixel x1, y1, x2, y2 boxes to (n, 4) float32 cx, cy, w, h normalised by image size."""
    boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
    scale = np.array([width, height, width, height], dtype=np.float32)
    xywh = np.concatenate([(boxes[:, :2] + boxes[:, 2:]) / 2, boxes[:, 2:] - boxes[:, :2]], axis=1)
    return xywh / scale


def clip_boxes(boxes: np.ndarray, width: float, height: float) -> np.ndarray:
    """Clips (n, 4) pixel xyxy boxes to [0, width] x [0, height] into a new array."""
    return np.clip(boxes, 0, np.array([width, height, width, height], dtype=np.float32))


def transform_boxes(boxes: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """Maps (n, 4) xyxy boxes through a (3, 3) matrix to the extent of their four transformed corners."""
    n = len(boxes)
    if n == 0:
        return np.zeros((0, 4), np.float32)
    x1, y1, x2, y2 = boxes.T
    corners = np.stack(
        [np.stack([x1, x2, x1, x2], 1), np.stack([y1, y2, y2, y1], 1), np.ones((n, 4))], axis=-1
    )  # (n, 4 corners, 3)
    mapped = corners @ matrix.T
    xy = mapped[..., :2] / mapped[..., 2:3]  # the divide is exact (by 1) for affine matrices
    return np.concatenate([xy.min(1), xy.max(1)], axis=1).astype(np.float32)


def box_candidates(
    before: np.ndarray,
    after: np.ndarray,
    min_side: float = 2.0,
    max_aspect: float = 100.0,
    min_area_ratio: float = 0.1,
    eps: float = 1e-16,
) -> np.ndarray:
    """Tells which boxes survive a warp, as an (n,) bool array.

    Keeps boxes whose sides both exceed ``min_side`` pixels, whose aspect ratio stays below ``max_aspect``,
    and that keep more than ``min_area_ratio`` of their area ``before`` (already multiplied by the warp's
    zoom, so only clipping counts). Both inputs are (n, 4) xyxy pixels.
    """
    w1, h1 = before[:, 2] - before[:, 0], before[:, 3] - before[:, 1]
    w2, h2 = after[:, 2] - after[:, 0], after[:, 3] - after[:, 1]
    aspect = np.maximum(w2 / (h2 + eps), h2 / (w2 + eps))
    return (
        (w2 > min_side)
        & (h2 > min_side)
        & (w2 * h2 / (w1 * h1 + eps) > min_area_ratio)
        & (aspect < max_aspect)
    )


def flip_boxes_lr(boxes: np.ndarray, width: float) -> np.ndarray:
    """Mirrors (n, 4) xyxy pixel boxes left-right in an image ``width`` pixels wide."""
    return np.stack([width - boxes[:, 2], boxes[:, 1], width - boxes[:, 0], boxes[:, 3]], 1)


def flip_boxes_ud(boxes: np.ndarray, height: float) -> np.ndarray:
    """Mirrors (n, 4) xyxy pixel boxes top-bottom in an image ``height`` pixels high."""
    return np.stack([boxes[:, 0], height - boxes[:, 3], boxes[:, 2], height - boxes[:, 1]], 1)
