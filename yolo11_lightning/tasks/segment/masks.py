"""Rasterising instance polygons into the training masks, at 1/``ratio`` of the image (default 1/4).

A polygon is filled at full resolution (``cv2.fillPoly`` with its points truncated to integer pixels,
pixel (i, j) filled when inside or on the outline) and then shrunk with ``cv2.resize`` (bilinear): the
reference's rasteriser, so masks equal its masks pixel for pixel. Only the polygon's bounding rectangle,
widened to whole ``ratio`` x ``ratio`` cells, is filled and shrunk: for an integer ratio every output
pixel depends on its own cell alone, so the crop gives the same pixels as the whole image at a fraction
of the cost (images whose sides are not multiples of the ratio take the whole-image path).

Two encodings (``rasterize``):

    overlap=True   (H/r, W/r) uint8 index map (int32 above 255 instances): 0 background, k the k-th
                   instance in ``order`` (1-based). Instances are drawn from the largest mask area to the
                   smallest, each over the previous ones, so a small object in front of a large one keeps
                   its pixels. ``order`` (N,) int64 lists the instances by decreasing area (ties: input
                   order; empty masks last); the labels of the image must be put in that order.
    overlap=False  (N, H/r, W/r) uint8 0/1, one mask per instance in input order; ``order`` is arange(N).

Pure numpy and OpenCV, deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

__all__ = ["MASK_RATIO", "instance_masks", "overlap_mask", "polygon_mask", "rasterize"]

MASK_RATIO = 4  # masks are 1/4 of the image side: the Proto output's resolution


def _fill_shrunk(points: np.ndarray, height: int, width: int, ratio: int) -> np.ndarray:
    """Fills one outline over the whole image at full size, then shrinks it bilinearly, as the reference."""
    full = np.zeros((height, width), np.uint8)
    cv2.fillPoly(full, [points], color=1)
    return cv2.resize(full, (width // ratio, height // ratio))


def polygon_mask(polygon: np.ndarray, height: int, width: int, ratio: int = MASK_RATIO) -> np.ndarray:
    """Rasterises one (k, 2) pixel outline into a (height // ratio, width // ratio) uint8 0/1 mask."""
    points = np.asarray(polygon, np.float32).reshape(-1, 2).astype(np.int32)  # truncated, as the reference
    out_h, out_w = height // ratio, width // ratio
    if len(points) == 0:
        return np.zeros((out_h, out_w), np.uint8)
    if height % ratio or width % ratio:
        return _fill_shrunk(points, height, width, ratio)
    x0 = max(int(points[:, 0].min()) // ratio, 0)
    y0 = max(int(points[:, 1].min()) // ratio, 0)
    x1 = min(int(points[:, 0].max()) // ratio + 1, out_w)
    y1 = min(int(points[:, 1].max()) // ratio + 1, out_h)
    out = np.zeros((out_h, out_w), np.uint8)
    if x1 <= x0 or y1 <= y0:
        return out  # entirely outside the image
    crop = np.zeros(((y1 - y0) * ratio, (x1 - x0) * ratio), np.uint8)
    cv2.fillPoly(crop, [points - np.array([x0 * ratio, y0 * ratio], np.int32)], color=1)
    out[y0:y1, x0:x1] = cv2.resize(crop, (x1 - x0, y1 - y0))
    return out


def instance_masks(
    polygons: Sequence[np.ndarray], height: int, width: int, ratio: int = MASK_RATIO
) -> np.ndarray:
    """Rasterises pixel outlines into (N, height // ratio, width // ratio) uint8 0/1 masks, one each."""
    out = np.zeros((len(polygons), height // ratio, width // ratio), np.uint8)
    for i, polygon in enumerate(polygons):
        out[i] = polygon_mask(polygon, height, width, ratio)
    return out


def overlap_mask(
    polygons: Sequence[np.ndarray], height: int, width: int, ratio: int = MASK_RATIO
) -> tuple[np.ndarray, np.ndarray]:
    """Rasterises outlines in image pixels into one index map and the (N,) order; see the module docstring.

    The index map is (height // ratio, width // ratio).
    """
    masks = instance_masks(polygons, height, width, ratio)
    areas = masks.reshape(len(masks), masks.shape[1] * masks.shape[2]).sum(
        1, dtype=np.int64
    )  # 0 polygons too
    order = np.argsort(-areas, kind="stable").astype(np.int64)
    index_map = np.zeros(masks.shape[1:], np.uint8 if len(polygons) <= 255 else np.int32)
    for rank, i in enumerate(order, 1):
        index_map[masks[i] > 0] = rank
    return index_map, order


def rasterize(
    polygons: Sequence[np.ndarray], height: int, width: int, overlap: bool = True, ratio: int = MASK_RATIO
) -> tuple[np.ndarray, np.ndarray]:
    """Rasterises one image's masks in either encoding and returns the instance order they imply.

    The module docstring describes the two encodings.
    """
    if overlap:
        return overlap_mask(polygons, height, width, ratio)
    return instance_masks(polygons, height, width, ratio), np.arange(len(polygons), dtype=np.int64)
