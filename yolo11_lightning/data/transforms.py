"""Geometric transforms on uint8 (H, W, 3) images and their pixel boxes.

Boxes here are always ``(n, 4)`` float32 ``x1, y1, x2, y2`` in pixels of the image they travel with; classes
travel beside them as ``(n,)`` int64 and are filtered with the same mask. Box maths is vectorised numpy;
pixel work is OpenCV. Randomness comes only from the ``np.random.Generator`` passed in, so one sample's
augmentation is a pure function of its generator's seed (see ``augment.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

FILL_VALUE = 114
"""Grey used for letterbox padding, the mosaic canvas and pixels an affine warp pulls from outside."""


# ----------------------------------------------------------------------------------------------- box formats
def xywhn_to_xyxy(boxes: np.ndarray, width: float, height: float) -> np.ndarray:
    """(n, 4) normalised ``cx, cy, w, h`` -> (n, 4) float32 pixel ``x1, y1, x2, y2``."""
    boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
    scale = np.array([width, height, width, height], dtype=np.float32)
    half = boxes[:, 2:] / 2
    return np.concatenate([boxes[:, :2] - half, boxes[:, :2] + half], axis=1) * scale


def xyxy_to_xywhn(boxes: np.ndarray, width: float, height: float) -> np.ndarray:
    """(n, 4) pixel ``x1, y1, x2, y2`` -> (n, 4) float32 ``cx, cy, w, h`` normalised by (width, height)."""
    boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
    scale = np.array([width, height, width, height], dtype=np.float32)
    xywh = np.concatenate([(boxes[:, :2] + boxes[:, 2:]) / 2, boxes[:, 2:] - boxes[:, :2]], axis=1)
    return xywh / scale


def clip_boxes(boxes: np.ndarray, width: float, height: float) -> np.ndarray:
    """Clip (n, 4) pixel xyxy boxes to ``[0, width] x [0, height]`` (new array)."""
    return np.clip(boxes, 0, np.array([width, height, width, height], dtype=np.float32))


# ----------------------------------------------------------------------------------------------- resizing
def resize_long_side(image: np.ndarray, size: int, scaleup: bool = True) -> tuple[np.ndarray, float]:
    """Resize so the longer side is ``size`` pixels, keeping the aspect ratio.

    The reference loads every image this way (train and val) before mosaic or letterbox; with
    ``scaleup=False`` smaller images are left as they are.

    Returns:
        image: resized (h', w', 3) uint8, h' = round(h * r), w' = round(w * r).
        r: the scale factor applied (pixels out per pixel in).
    """
    h, w = image.shape[:2]
    r = size / max(h, w)
    if not scaleup:
        r = min(r, 1.0)
    if r != 1.0:
        new_wh = (max(1, round(w * r)), max(1, round(h * r)))
        image = cv2.resize(image, new_wh, interpolation=cv2.INTER_LINEAR)
    return image, r


def letterbox(
    image: np.ndarray,
    size: int | tuple[int, int],
    scaleup: bool = True,
    fill: int = FILL_VALUE,
) -> tuple[np.ndarray, float, tuple[int, int]]:
    """Resize keeping the aspect ratio, then pad evenly to ``size``.

    Args:
        image: (h, w, 3) uint8.
        size: output (height, width), or one int for a square.
        scaleup: allow enlarging; False only shrinks (a small image is just padded).
        fill: padding grey level.

    Returns:
        image: (H, W, 3) uint8.
        scale: r, output pixels per input pixel.
        pad: (left, top) padding in pixels, so ``x_in = (x_out - left) / r``.
    """
    out_h, out_w = (size, size) if isinstance(size, int) else size
    h, w = image.shape[:2]
    r = min(out_h / h, out_w / w)
    if not scaleup:
        r = min(r, 1.0)
    new_w, new_h = max(1, round(w * r)), max(1, round(h * r))
    if (new_w, new_h) != (w, h):
        image = cv2.resize(image, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
    dw, dh = out_w - new_w, out_h - new_h
    # The -0.1 puts the odd pixel on the right/bottom side, as the reference does.
    left, top = round(dw / 2 - 0.1), round(dh / 2 - 0.1)
    if dw or dh:
        image = cv2.copyMakeBorder(
            image, top, dh - top, left, dw - left, cv2.BORDER_CONSTANT, value=(fill, fill, fill)
        )
    return image, r, (left, top)


# ----------------------------------------------------------------------------------------------- affine
def random_affine_matrix(
    rng: np.random.Generator,
    in_wh: tuple[int, int],
    out_wh: tuple[int, int],
    degrees: float = 0.0,
    translate: float = 0.1,
    scale: float = 0.5,
    shear: float = 0.0,
    perspective: float = 0.0,
) -> tuple[np.ndarray, float]:
    """Draw the reference's random warp: centre, perspective, rotate+scale, shear, translate.

    The input centre goes to a point drawn uniformly in ``[0.5 - translate, 0.5 + translate]`` of the
    output size. Angles in degrees; ``scale`` draws the zoom s in ``[1 - scale, 1 + scale]``.

    Returns:
        M: (3, 3) float64 matrix mapping input pixels (x, y, 1) to output pixels.
        s: the drawn zoom, used to compare box areas before and after.
    """
    centre = np.eye(3)
    centre[0, 2], centre[1, 2] = -in_wh[0] / 2, -in_wh[1] / 2
    persp = np.eye(3)
    persp[2, 0], persp[2, 1] = rng.uniform(-perspective, perspective, size=2)
    angle = rng.uniform(-degrees, degrees)
    s = rng.uniform(1 - scale, 1 + scale)
    rot = np.eye(3)
    rot[:2] = cv2.getRotationMatrix2D(angle=angle, center=(0, 0), scale=s)
    shr = np.eye(3)
    shr[0, 1], shr[1, 0] = np.tan(np.radians(rng.uniform(-shear, shear, size=2)))
    trans = np.eye(3)
    trans[0, 2], trans[1, 2] = rng.uniform(0.5 - translate, 0.5 + translate, size=2) * np.asarray(out_wh)
    # Right to left: centre first, translate last; the order matters.
    return trans @ shr @ rot @ persp @ centre, float(s)


def warp_image(
    image: np.ndarray, matrix: np.ndarray, out_wh: tuple[int, int], fill: int = FILL_VALUE
) -> np.ndarray:
    """Warp (h, w, 3) uint8 with a (3, 3) matrix to ``out_wh``; a projective warp only when needed."""
    border = (fill, fill, fill)
    if matrix[2, 0] != 0 or matrix[2, 1] != 0:
        return cv2.warpPerspective(image, matrix, dsize=out_wh, borderValue=border)
    return cv2.warpAffine(image, matrix[:2], dsize=out_wh, borderValue=border)


def transform_boxes(boxes: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """Map (n, 4) xyxy boxes through a (3, 3) matrix: the extent of the four transformed corners."""
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
    """Which boxes survive a warp: (n,) bool.

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


def apply_affine(
    image: np.ndarray,
    boxes: np.ndarray,
    classes: np.ndarray,
    matrix: np.ndarray,
    zoom: float,
    out_wh: tuple[int, int],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Warp image and boxes, clip the boxes to the output and drop degenerate ones (``box_candidates``)."""
    if image.shape[1::-1] != tuple(out_wh) or not np.array_equal(matrix, np.eye(3)):
        image = warp_image(image, matrix, out_wh)
    warped = clip_boxes(transform_boxes(boxes, matrix), *out_wh)
    keep = box_candidates(boxes * zoom, warped)
    return image, warped[keep], classes[keep]


# ----------------------------------------------------------------------------------------------- mosaic
def mosaic4(
    images: Sequence[np.ndarray],
    boxes: Sequence[np.ndarray],
    classes: Sequence[np.ndarray],
    size: int,
    rng: np.random.Generator,
    fill: int = FILL_VALUE,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Place four images around a random centre of a (2*size, 2*size) canvas.

    The centre (xc, yc) is drawn in ``[size/2, 3*size/2)``; image k's corner touches it: 0 top-left,
    1 top-right, 2 bottom-left, 3 bottom-right. Parts falling off the canvas are cut. Each image is
    expected already resized (long side = size, see ``resize_long_side``).

    Returns:
        canvas: (2*size, 2*size, 3) uint8 filled with ``fill`` where no image lands.
        boxes: (n, 4) xyxy canvas pixels, clipped to the canvas, zero-area ones dropped.
        classes: (n,) int64.
    """
    s2 = 2 * size
    yc, xc = (int(v) for v in rng.uniform(size / 2, 3 * size / 2, size=2))
    canvas = np.full((s2, s2, 3), fill, dtype=np.uint8)
    all_boxes, all_classes = [], []
    for k, (img, bxs, cls) in enumerate(zip(images, boxes, classes)):
        h, w = img.shape[:2]
        ox = xc - w if k in (0, 2) else xc  # canvas position of the image's top-left corner
        oy = yc - h if k in (0, 1) else yc
        x1, y1, x2, y2 = max(ox, 0), max(oy, 0), min(ox + w, s2), min(oy + h, s2)
        if x2 > x1 and y2 > y1:
            canvas[y1:y2, x1:x2] = img[y1 - oy : y2 - oy, x1 - ox : x2 - ox]
        all_boxes.append(bxs + np.array([ox, oy, ox, oy], dtype=np.float32))
        all_classes.append(cls)
    out_boxes = clip_boxes(np.concatenate(all_boxes), s2, s2)
    out_classes = np.concatenate(all_classes)
    keep = (out_boxes[:, 2] > out_boxes[:, 0]) & (out_boxes[:, 3] > out_boxes[:, 1])
    return canvas, out_boxes[keep], out_classes[keep]


# ----------------------------------------------------------------------------------------------- flips, mixup
def flip_lr(image: np.ndarray, boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mirror left-right: image (new contiguous array) and (n, 4) xyxy boxes."""
    w = image.shape[1]
    return cv2.flip(image, 1), np.stack([w - boxes[:, 2], boxes[:, 1], w - boxes[:, 0], boxes[:, 3]], 1)


def flip_ud(image: np.ndarray, boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mirror top-bottom: image (new contiguous array) and (n, 4) xyxy boxes."""
    h = image.shape[0]
    return cv2.flip(image, 0), np.stack([boxes[:, 0], h - boxes[:, 3], boxes[:, 2], h - boxes[:, 1]], 1)


def mixup(
    image_a: np.ndarray,
    image_b: np.ndarray,
    rng: np.random.Generator,
    alpha: float = 32.0,
) -> np.ndarray:
    """Blend two same-size uint8 images with a weight drawn from Beta(alpha, alpha) (about 0.5)."""
    r = rng.beta(alpha, alpha)
    return cv2.addWeighted(image_a, r, image_b, 1.0 - r, 0.0)
