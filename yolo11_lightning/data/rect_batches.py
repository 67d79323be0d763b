"""Evaluation geometry as the reference validator does it: the load resize and rectangular batch shapes.

Validation and test images go through two steps (``BoxDataset`` in evaluation mode):

1. **Load resize** (``eval_resize``): the long side becomes ``size``, the short side
   ``min(ceil(short * r), size)`` with ``r = size / long`` (the reference rounds up, training rounds to
   nearest), bilinear (``cv2.INTER_LINEAR``) for enlarging and shrinking alike. Boxes map back to the
   original image with one gain, ``h' / h`` (resized over original height), for both axes: that is the
   reference's rule, kept so that detections equal its own to 0.01 px, although the x axis was scaled by
   ``w' / w`` (the two differ by less than one resized pixel over the image width).
2. **Letterbox** to the batch's shape, grey 114, the odd pixel on the right/bottom: ``size`` x ``size``
   for square batches, or, with rectangular batches (``rect_batches``), the shape of the image's group.

Rectangular batches: images sorted by aspect ratio h / w (stable sort, so ties keep the dataset order),
cut into groups of ``batch_size`` consecutive images; a group whose ratios are all < 1 gets
``(max ratio, 1)`` x size, all > 1 gets ``(1, 1 / min ratio)`` x size, a mixed group ``(1, 1)`` x size;
each side is then ``ceil(side / stride + pad) * stride`` with the reference's validation ``pad = 0.5``.
The pad term always adds at least half a stride: at ``size`` 640 a square group is 672 x 672, and the
long side of every group is ``size + stride`` when ``size`` is a multiple of the stride. The images
themselves keep long side ``size`` (they are padded, never enlarged, to the group's shape).
"""

from __future__ import annotations

import math

import cv2
import numpy as np

# The reference validation loader's extra padding, in strides, of every rectangular batch side.
RECT_PAD = 0.5
# The model's largest stride: batch sides are multiples of it.
STRIDE = 32


def eval_resized_shape(height: int, width: int, size: int, scaleup: bool = True) -> tuple[int, int, float]:
    """(h', w', gain) of ``eval_resize`` for an image of (height, width), without decoding it.

    ``gain = h' / height``: the one factor that maps boxes back (module docstring).
    """
    r = size / max(height, width)
    if not scaleup:
        r = min(r, 1.0)
    if r == 1.0:
        return height, width, 1.0
    new_h, new_w = min(math.ceil(height * r), size), min(math.ceil(width * r), size)
    return new_h, new_w, new_h / height


def eval_resize(image: np.ndarray, size: int, scaleup: bool = True) -> tuple[np.ndarray, float]:
    """(h, w, 3) uint8 -> (resized (h', w', 3) uint8, gain ``h' / h``), long side ``size`` (module docstring)."""
    height, width = image.shape[:2]
    new_h, new_w, gain = eval_resized_shape(height, width, size, scaleup)
    if (new_h, new_w) != (height, width):
        image = cv2.resize(image, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
    return image, gain


def rect_batches(
    heights: np.ndarray,
    widths: np.ndarray,
    batch_size: int,
    size: int,
    stride: int = STRIDE,
    pad: float = RECT_PAD,
) -> tuple[np.ndarray, np.ndarray]:
    """The aspect-ratio order and each image's letterbox shape for rectangular evaluation batches.

    Args:
        heights, widths: (n,) original image sizes in pixels.
        batch_size: images per group (the GLOBAL batch: the same groups on any world size).
        size: the long side images are resized to.
        stride, pad: shape rounding (module docstring).

    Returns:
        order: (n,) int64 dataset indices sorted by h / w; positions [k*B, (k+1)*B) are group k.
        shapes: (n, 2) int64 (height, width) of the batch each dataset index belongs to.
    """
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    ratio = np.asarray(heights, np.float64) / np.asarray(widths, np.float64)
    order = np.argsort(ratio, kind="stable").astype(np.int64)
    shapes = np.zeros((len(order), 2), np.int64)
    for start in range(0, len(order), batch_size):
        members = order[start : start + batch_size]
        low, high = ratio[members].min(), ratio[members].max()
        unit = [high, 1.0] if high < 1 else [1.0, 1 / low] if low > 1 else [1.0, 1.0]
        shapes[members] = np.ceil(np.array(unit) * size / stride + pad).astype(np.int64) * stride
    return order, shapes
