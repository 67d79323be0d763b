"""Geometric transforms on uint8 (H, W, 3) images and their pixel boxes.

Boxes here are always ``(n, 4)`` float32 ``x1, y1, x2, y2`` in pixels of the image they travel with; classes
travel beside them as ``(n,)`` int64 and are filtered with the same mask. Box maths is vectorised numpy;
pixel work is OpenCV. Randomness comes only from the ``np.random.Generator`` passed in, so one sample's
augmentation is a pure function of its generator's seed (see ``augment.py``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import cv2
import numpy as np

from yolo11_lightning.structures.boxes import (
    box_candidates,
    clip_boxes,
    flip_boxes_lr,
    flip_boxes_ud,
    transform_boxes,
)

FILL_VALUE = 114
"""Grey used for letterbox padding, the mosaic canvas and pixels an affine warp pulls from outside."""


# ----------------------------------------------------------------------------------------------- box formats
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
    image, r, (left, top) = letterbox_fit(image, (out_h, out_w), scaleup)
    dw, dh = out_w - image.shape[1], out_h - image.shape[0]
    if dw or dh:
        image = cv2.copyMakeBorder(
            image, top, dh - top, left, dw - left, cv2.BORDER_CONSTANT, value=(fill, fill, fill)
        )
    return image, r, (left, top)


def letterbox_fit(
    image: np.ndarray, size: tuple[int, int], scaleup: bool = True
) -> tuple[np.ndarray, float, tuple[int, int]]:
    """``letterbox`` without the padding: the resized (h', w', 3) image, r and where it goes (left, top)."""
    out_h, out_w = size
    h, w = image.shape[:2]
    r = min(out_h / h, out_w / w)
    if not scaleup:
        r = min(r, 1.0)
    new_w, new_h = max(1, round(w * r)), max(1, round(h * r))
    if (new_w, new_h) != (w, h):
        image = cv2.resize(image, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
    # The -0.1 puts the odd pixel on the right/bottom side, as the reference does.
    return image, r, (round((out_w - new_w) / 2 - 0.1), round((out_h - new_h) / 2 - 0.1))


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
    return (image, *affine_boxes(boxes, classes, matrix, zoom, out_wh))


def affine_boxes(
    boxes: np.ndarray, classes: np.ndarray, matrix: np.ndarray, zoom: float, out_wh: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """The box half of ``apply_affine``: (n, 4) xyxy through ``matrix``, clipped, candidates kept."""
    warped = clip_boxes(transform_boxes(boxes, matrix), *out_wh)
    keep = box_candidates(boxes * zoom, warped)
    return warped[keep], classes[keep]


# ----------------------------------------------------------------------------------------------- tiles
def place_tiles(
    tiles: Sequence[np.ndarray],
    offsets: Sequence[tuple[int, int]],
    canvas_wh: tuple[int, int],
    window: tuple[int, int, int, int] | None = None,
    fill: int = FILL_VALUE,
) -> np.ndarray:
    """Paint tiles on a ``fill`` canvas, or only a window of it.

    Args:
        tiles: (h_k, w_k, 3) uint8 images.
        offsets: canvas (x, y) of each tile's top-left corner (may be negative: the part off the canvas is cut).
        canvas_wh: canvas (width, height); pixels outside it are ``fill`` even where a tile would reach.
        window: canvas ``(x0, y0, x1, y1)`` to paint (may extend beyond the canvas); None: the whole canvas.

    Returns:
        (y1 - y0, x1 - x0, 3) uint8.
    """
    cw, ch = canvas_wh
    x0, y0, x1, y1 = window if window is not None else (0, 0, cw, ch)
    out = np.full((y1 - y0, x1 - x0, 3), fill, dtype=np.uint8)
    for img, (ox, oy) in zip(tiles, offsets):
        h, w = img.shape[:2]
        a0, b0 = max(ox, 0, x0), max(oy, 0, y0)
        a1, b1 = min(ox + w, cw, x1), min(oy + h, ch, y1)
        if a1 > a0 and b1 > b0:
            out[b0 - y0 : b1 - y0, a0 - x0 : a1 - x0] = img[b0 - oy : b1 - oy, a0 - ox : a1 - ox]
    return out


def tile_boxes(
    boxes: Sequence[np.ndarray],
    classes: Sequence[np.ndarray],
    offsets: Sequence[tuple[int, int]],
    canvas_wh: tuple[int, int],
) -> tuple[np.ndarray, np.ndarray]:
    """Tile boxes (n_k, 4) xyxy moved to canvas pixels, clipped to the canvas, zero-area ones dropped."""
    moved = [b + np.array([ox, oy, ox, oy], dtype=np.float32) for b, (ox, oy) in zip(boxes, offsets)]
    out_boxes = clip_boxes(np.concatenate(moved), *canvas_wh)
    out_classes = np.concatenate(list(classes))
    keep = (out_boxes[:, 2] > out_boxes[:, 0]) & (out_boxes[:, 3] > out_boxes[:, 1])
    return out_boxes[keep], out_classes[keep]


def is_scale_translation(matrix: np.ndarray) -> bool:
    """Whether a (3, 3) matrix only zooms (the same in x and y, > 0) and shifts."""
    return bool(
        matrix[0, 1] == 0
        and matrix[1, 0] == 0
        and matrix[2, 0] == 0
        and matrix[2, 1] == 0
        and matrix[2, 2] == 1
        and matrix[0, 0] == matrix[1, 1] > 0
    )


def _resize_window(shift: float, zoom: float, out: int, length: int) -> tuple[int, int, int, float]:
    """One axis of ``warp_tiles``' fast path: the canvas window to resize and where its result lands.

    ``cv2.resize`` by ``zoom`` maps result pixel j to window pixel (j + 0.5) / zoom - 0.5; the warp maps
    output pixel x to canvas pixel (x - shift) / zoom. They agree for x = j + offset when
    ``shift = offset - zoom * (start - 0.5) - 0.5`` with integer ``offset``: ``shift`` is rounded to
    the nearest such value (at most half an output pixel). The window keeps a margin of canvas pixels
    (or fill) on both sides, so the resize never clamps a pixel that is kept.

    Returns:
        start, stop: the window ``[start, stop)`` in canvas pixels (within ``[-2, length + 2]``).
        offset: output pixel of the resize's first pixel.
        shift: the rounded shift the result realises.
    """
    start = max(math.floor((-shift - 1) / zoom) - 1, -2)
    stop = min(math.ceil((out - shift + 1) / zoom) + 3, length + 2)
    offset = round(shift + zoom * (start - 0.5) + 0.5)
    return start, stop, offset, offset - zoom * (start - 0.5) - 0.5


def warp_tiles(
    tiles: Sequence[np.ndarray],
    offsets: Sequence[tuple[int, int]],
    canvas_wh: tuple[int, int],
    matrix: np.ndarray,
    out_wh: tuple[int, int],
    fill: int = FILL_VALUE,
) -> tuple[np.ndarray, np.ndarray]:
    """``warp_image(place_tiles(...))`` without painting the parts of the canvas the output never sees.

    When ``matrix`` only zooms and shifts (the reference's default geometry: no rotation, shear or
    perspective), the output is one ``cv2.resize`` of the canvas window it samples, about 4x cheaper
    than ``cv2.warpAffine`` (same bilinear interpolation, +-1 grey level of fixed-point rounding). The
    shift is then rounded by at most half an output pixel (see ``_resize_window``) and the matrix
    returned is the one realised, so boxes mapped through it fit the pixels exactly. Any other matrix
    paints the whole canvas and warps it.

    Returns:
        image: (out_h, out_w, 3) uint8, possibly a view of a larger array (rows strided).
        matrix: (3, 3) float64 canvas -> output pixels, as realised.
    """
    out_w, out_h = out_wh
    if not is_scale_translation(matrix):
        return warp_image(place_tiles(tiles, offsets, canvas_wh, fill=fill), matrix, out_wh, fill), matrix
    zoom = float(matrix[0, 0])
    x0, x1, ox, tx = _resize_window(float(matrix[0, 2]), zoom, out_w, canvas_wh[0])
    y0, y1, oy, ty = _resize_window(float(matrix[1, 2]), zoom, out_h, canvas_wh[1])
    realised = np.array([[zoom, 0.0, tx], [0.0, zoom, ty], [0.0, 0.0, 1.0]])
    if x1 <= x0 or y1 <= y0:  # the output sees no canvas pixel
        return np.full((out_h, out_w, 3), fill, np.uint8), realised
    window = place_tiles(tiles, offsets, canvas_wh, (x0, y0, x1, y1), fill)
    if zoom != 1.0:
        window = cv2.resize(window, None, fx=zoom, fy=zoom, interpolation=cv2.INTER_LINEAR)
    h, w = window.shape[:2]
    if ox <= 0 and oy <= 0 and ox + w >= out_w and oy + h >= out_h:  # the usual case: no copy
        return window[-oy : out_h - oy, -ox : out_w - ox], realised
    out = np.full((out_h, out_w, 3), fill, np.uint8)
    a0, b0, a1, b1 = max(ox, 0), max(oy, 0), min(ox + w, out_w), min(oy + h, out_h)
    if a1 > a0 and b1 > b0:
        out[b0:b1, a0:a1] = window[b0 - oy : b1 - oy, a0 - ox : a1 - ox]
    return out, realised


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
    offsets = mosaic_offsets([img.shape[:2] for img in images], size, rng)
    canvas = place_tiles(images, offsets, (2 * size, 2 * size), fill=fill)
    return (canvas, *tile_boxes(boxes, classes, offsets, (2 * size, 2 * size)))


def mosaic_offsets(
    shapes: Sequence[tuple[int, ...]], size: int, rng: np.random.Generator
) -> list[tuple[int, int]]:
    """Draw ``mosaic4``'s centre; the canvas (x, y) of each of the four tiles' top-left corners.

    ``shapes`` are the tiles' (h, w). Tile k's corner touches the centre: 0 top-left, 1 top-right,
    2 bottom-left, 3 bottom-right.
    """
    yc, xc = (int(v) for v in rng.uniform(size / 2, 3 * size / 2, size=2))
    return [
        (xc - shape[1] if k in (0, 2) else xc, yc - shape[0] if k in (0, 1) else yc)
        for k, shape in enumerate(shapes)
    ]


# ----------------------------------------------------------------------------------------------- flips, mixup
def flip_lr(image: np.ndarray, boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mirror left-right: image (new contiguous array) and (n, 4) xyxy boxes."""
    return cv2.flip(image, 1), flip_boxes_lr(boxes, image.shape[1])


def flip_ud(image: np.ndarray, boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mirror top-bottom: image (new contiguous array) and (n, 4) xyxy boxes."""
    return cv2.flip(image, 0), flip_boxes_ud(boxes, image.shape[0])


def mixup(
    image_a: np.ndarray,
    image_b: np.ndarray,
    rng: np.random.Generator,
    alpha: float = 32.0,
) -> np.ndarray:
    """Blend two same-size uint8 images with a weight drawn from Beta(alpha, alpha) (about 0.5)."""
    r = rng.beta(alpha, alpha)
    return cv2.addWeighted(image_a, r, image_b, 1.0 - r, 0.0)
