"""COCO run-length masks: decoding (both the ``counts`` list and the compressed string) and outlines.

A COCO RLE is ``{"size": [h, w], "counts": ...}``: alternating run lengths of 0s and 1s (starting with
0s) over the mask in column-major order. Crowd annotations store ``counts`` as a list of ints; results
and some datasets store the compressed string of the COCO mask API (each run a variable-length
signed delta, 5 bits per character offset by 48). Decoded here without the mask API, so the package
needs no pycocotools.
"""

from __future__ import annotations

import cv2
import numpy as np

from yolo11_lightning.structures.polygons import merge_parts

__all__ = ["RLEError", "decode_counts", "decode_rle", "mask_outline"]


class RLEError(ValueError):
    """A malformed RLE; the message says what is wrong."""


def decode_counts(text: str) -> list[int]:
    """The run lengths of a compressed COCO ``counts`` string (the mask API's ``rleFrString``)."""
    counts: list[int] = []
    pos, n = 0, len(text)
    while pos < n:
        value, shift, more = 0, 0, True
        while more:
            if pos >= n:
                raise RLEError("compressed counts end inside a number")
            c = ord(text[pos]) - 48
            if not 0 <= c < 64:
                raise RLEError(f"character {text[pos]!r} is not a compressed-counts character")
            value |= (c & 0x1F) << (5 * shift)
            more = bool(c & 0x20)
            pos += 1
            shift += 1
            if not more and c & 0x10:
                value |= -1 << (5 * shift)  # sign-extend
        if len(counts) > 2:
            value += counts[-2]  # runs after the second are stored as deltas from two runs before
        counts.append(value)
    return counts


def decode_rle(rle: dict) -> np.ndarray:
    """A COCO RLE dict -> (h, w) uint8 0/1 mask; raises ``RLEError`` naming the problem."""
    try:
        h, w = (int(v) for v in rle["size"])
        counts = rle["counts"]
    except (KeyError, TypeError, ValueError) as e:
        raise RLEError(f"RLE needs `size` [h, w] and `counts` ({type(e).__name__}: {e})") from e
    if h <= 0 or w <= 0:
        raise RLEError(f"RLE size {h}x{w} is not positive")
    if isinstance(counts, bytes):
        counts = counts.decode("ascii", errors="replace")
    if isinstance(counts, str):
        runs = decode_counts(counts)
    elif isinstance(counts, list) and all(isinstance(c, int) and not isinstance(c, bool) for c in counts):
        runs = counts
    else:
        raise RLEError("RLE `counts` must be a list of ints or a compressed string")
    runs_arr = np.asarray(runs, np.int64)
    if (runs_arr < 0).any():
        raise RLEError("RLE has a negative run length")
    if runs_arr.sum() != h * w:
        raise RLEError(f"RLE runs cover {int(runs_arr.sum())} pixels, its size {h}x{w} has {h * w}")
    values = np.zeros(len(runs_arr), np.uint8)
    values[1::2] = 1
    flat = np.repeat(values, runs_arr)
    return np.ascontiguousarray(flat.reshape(w, h).T)


def mask_outline(mask: np.ndarray, min_points: int = 3) -> np.ndarray:
    """The outer outline (k, 2) float32, in pixels, of a binary mask's regions, merged into one.

    Each region's outer contour (``cv2.findContours``, pixel centres at ``i + 0.5``) with at least
    ``min_points`` points is kept, largest region first, and the regions are joined as the parts of a
    COCO multi-polygon (``polygons.merge_parts``). Holes are not kept (a polygon has none). A mask
    without a region of ``min_points`` contour points gives a (0, 2) array.
    """
    contours, _ = cv2.findContours(
        np.ascontiguousarray(mask, np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE
    )
    parts = [c.reshape(-1, 2).astype(np.float32) + 0.5 for c in contours if len(c) >= min_points]
    parts.sort(key=lambda p: -cv2.contourArea(p))
    return merge_parts(parts)
