"""The synthetic images: class shapes painted on a noisy gradient, with their exact boxes or outlines.

One image of a split from (parameters, split, index) only (``boxes_sample`` for the set labelled with boxes,
``outlines_sample`` for the one labelled with outlines); ``synthetic.shapes`` writes them as a dataset
folder.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import cv2
import numpy as np

SYNTHETIC_CLASS_NAMES = ("rectangle", "ellipse", "triangle", "diamond", "cross", "hexagon", "star", "ring")
_OUTLINES_STREAM = 1  # seeds the outline set's images apart from the box set's
_ROUND_POINTS = 32  # vertices of an ellipse / ring circle
_SHIFT = 4  # fractional bits of the painted vertices
_SUBPIXEL = 1 << _SHIFT


@dataclass(frozen=True)
class ShapeParams:
    """What a synthetic shapes set is generated from (recorded in its folder's marker)."""

    num_train: int
    num_val: int
    height: int
    width: int
    num_classes: int
    seed: int
    max_objects: int
    min_objects: int
    coco: bool


def shape_mask(kind: str, box: tuple[int, int, int, int], shape: tuple[int, int], rng) -> np.ndarray:
    """Returns the uint8 (H, W) mask of one filled shape drawn inside box (x1, y1, x2, y2), in pixel edges."""
    mask = np.zeros(shape, np.uint8)
    x1, y1, x2, y2 = box
    xr, yb = x2 - 1, y2 - 1  # last pixel column / row inside the box
    cx, cy = (x1 + xr) / 2, (y1 + yb) / 2
    rx, ry = (xr - x1) / 2, (yb - y1) / 2

    def poly(points) -> None:
        cv2.fillPoly(mask, [np.round(np.asarray(points)).astype(np.int32)], 255, cv2.LINE_8)

    if kind == "rectangle":
        cv2.rectangle(mask, (x1, y1), (xr, yb), 255, -1, cv2.LINE_8)
    elif kind in ("ellipse", "ring"):
        cv2.ellipse(mask, (round(cx), round(cy)), (max(1, round(rx)), max(1, round(ry))), 0, 0, 360, 255, -1)
        if kind == "ring":
            inner = (max(1, round(rx * 0.5)), max(1, round(ry * 0.5)))
            cv2.ellipse(mask, (round(cx), round(cy)), inner, 0, 0, 360, 0, -1)
    elif kind == "triangle":
        corners = [[(x1, yb), (xr, yb), (cx, y1)], [(x1, y1), (xr, y1), (cx, yb)]]
        poly(corners[int(rng.integers(2))])
    elif kind == "diamond":
        poly([(cx, y1), (xr, cy), (cx, yb), (x1, cy)])
    elif kind == "cross":
        tx, ty = max(1.0, rx / 3), max(1.0, ry / 3)
        cv2.rectangle(mask, (x1, round(cy - ty)), (xr, round(cy + ty)), 255, -1)
        cv2.rectangle(mask, (round(cx - tx), y1), (round(cx + tx), yb), 255, -1)
    elif kind in ("hexagon", "star"):
        n = 6 if kind == "hexagon" else 10
        angles = np.arange(n) * 2 * math.pi / n - math.pi / 2
        radius = np.where(np.arange(n) % 2, 0.45, 1.0) if kind == "star" else np.ones(n)
        poly(np.stack([cx + rx * radius * np.cos(angles), cy + ry * radius * np.sin(angles)], 1))
    else:
        raise ValueError(kind)
    return mask


def background(rng, height: int, width: int) -> np.ndarray:
    """Paints a dark diagonal gradient between two random colours, values 15..100, plus Gaussian noise."""
    c0, c1 = rng.uniform(15, 100, 3), rng.uniform(15, 100, 3)
    angle = rng.uniform(0, 2 * math.pi)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    t = (xx / max(width - 1, 1) * math.cos(angle) + yy / max(height - 1, 1) * math.sin(angle) + 1.5) / 3.0
    img = c0 + (c1 - c0) * t[..., None]
    return img + rng.normal(0.0, 6.0, img.shape)


def class_colour(rng, cls: int, num_classes: int) -> np.ndarray:
    """Picks a bright, saturated RGB colour in the class's hue band."""
    hue = (cls / num_classes + rng.uniform(-0.3, 0.3) / num_classes) % 1.0
    hsv = np.uint8([[[round(hue * 180) % 180, rng.integers(170, 256), rng.integers(190, 256)]]])
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)[0, 0].astype(np.float64)


def _free_places(
    rng: np.random.Generator, n_target: int, h: int, w: int, num_classes: int
) -> Iterator[tuple[int, tuple[int, int, int, int]]]:
    """Places up to n_target non-overlapping boxes (x1, y1, x2, y2) in an (h, w) image by rejection sampling.

    Yields (class, box) one at a time; the caller draws that object's shape from the same ``rng`` before
    the next place is drawn, so the random stream is that of one interleaved loop.
    """
    taken: list[tuple[int, int, int, int]] = []
    for _ in range(n_target * 20):
        if len(taken) == n_target:
            break
        side = rng.uniform(0.15, 0.45) * min(h, w)
        aspect = rng.uniform(0.7, 1.4)
        bw, bh = max(4, round(side * aspect)), max(4, round(side / aspect))
        if bw > w - 2 or bh > h - 2:
            continue
        x1, y1 = int(rng.integers(1, w - bw)), int(rng.integers(1, h - bh))
        if any(x1 < b[2] + 2 and b[0] < x1 + bw + 2 and y1 < b[3] + 2 and b[1] < y1 + bh + 2 for b in taken):
            continue
        taken.append((x1, y1, x1 + bw, y1 + bh))
        yield int(rng.integers(num_classes)), taken[-1]


def boxes_sample(params: ShapeParams, split_index: int, index: int):
    """Draws one image: (H, W, 3) uint8 RGB, classes (n,) and pixel-edge boxes (n, 4) x1, y1, x2, y2."""
    rng = np.random.default_rng([params.seed, split_index, index])
    h, w = params.height, params.width
    img = background(rng, h, w)
    n_target = int(rng.integers(params.min_objects, params.max_objects + 1))
    classes, boxes = [], []
    for cls, place in _free_places(rng, n_target, h, w, params.num_classes):
        mask = shape_mask(SYNTHETIC_CLASS_NAMES[cls], place, (h, w), rng)
        ys, xs = np.nonzero(mask)
        img[ys, xs] = class_colour(rng, cls, params.num_classes) + rng.normal(0.0, 6.0, (len(ys), 3))
        classes.append(cls)
        boxes.append((xs.min(), ys.min(), xs.max() + 1, ys.max() + 1))  # exact extent of the drawn pixels
    image = np.clip(img, 0, 255).astype(np.uint8)
    return image, np.asarray(classes, np.int64), np.asarray(boxes, np.float64).reshape(-1, 4)


def _unit_outline(kind: str, rng) -> np.ndarray:
    """Returns the outline (k, 2) of a class's shape in the square [-1, 1]^2, as one closed polygon.

    Curved shapes are polygons of ``_ROUND_POINTS`` vertices; the ring is its outer circle, a zero-width
    cut, and its inner circle the other way round (one outline with a hole).
    """
    circle = np.arange(_ROUND_POINTS) * 2 * math.pi / _ROUND_POINTS
    if kind == "rectangle":
        return np.array([(-1, -1), (1, -1), (1, 1), (-1, 1)], np.float64)
    if kind == "ellipse":
        return np.stack([np.cos(circle), np.sin(circle)], 1)
    if kind == "ring":
        outer = np.stack([np.cos(circle), np.sin(circle)], 1)
        inner = 0.5 * outer[::-1]
        return np.concatenate([outer, outer[:1], inner[-1:], inner])  # closes over the cut back to outer[0]
    if kind == "triangle":
        apex = 1 if rng.integers(2) else -1  # pointing up or down, as the detection set
        return np.array([(-1, apex), (1, apex), (0, -apex)], np.float64)
    if kind == "diamond":
        return np.array([(0, -1), (1, 0), (0, 1), (-1, 0)], np.float64)
    if kind == "cross":
        t = 1 / 3
        return np.array(
            [
                (-t, -1),
                (t, -1),
                (t, -t),
                (1, -t),
                (1, t),
                (t, t),
                (t, 1),
                (-t, 1),
                (-t, t),
                (-1, t),
                (-1, -t),
                (-t, -t),
            ],
            np.float64,
        )
    if kind in ("hexagon", "star"):
        n = 6 if kind == "hexagon" else 10
        angles = np.arange(n) * 2 * math.pi / n - math.pi / 2
        radius = np.where(np.arange(n) % 2, 0.45, 1.0) if kind == "star" else np.ones(n)
        return np.stack([radius * np.cos(angles), radius * np.sin(angles)], 1)
    raise ValueError(kind)


def _place_outline(unit: np.ndarray, box: tuple[int, int, int, int], angle: float) -> np.ndarray:
    """Rotates a unit outline by ``angle`` and stretches its extent onto box (x1, y1, x2, y2), in pixel edges.

    Vertices are snapped to 1/16 pixel, the precision ``cv2.fillPoly`` draws them with (``shift=4``), so
    the outline written to the labels is exactly the one painted.
    """
    c, s = math.cos(angle), math.sin(angle)
    pts = unit @ np.array([[c, s], [-s, c]])
    lo, hi = pts.min(0), pts.max(0)
    x1, y1, x2, y2 = box
    pts = (pts - lo) / (hi - lo) * np.array([x2 - x1, y2 - y1]) + np.array([x1, y1])
    return np.round(pts * _SUBPIXEL) / _SUBPIXEL


def _paint_outline(outline: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """Paints an outline in pixel-edge coordinates into a uint8 (H, W) mask.

    Pixel (i, j) has its centre at j + 0.5.
    """
    mask = np.zeros(shape, np.uint8)
    fixed = np.round((outline - 0.5) * _SUBPIXEL).astype(np.int32)
    cv2.fillPoly(mask, [fixed], 255, cv2.LINE_8, shift=_SHIFT)
    return mask


def outlines_sample(params: ShapeParams, split_index: int, index: int):
    """Draws one image labelled with outlines: (H, W, 3) uint8 RGB, classes (n,), outlines [(k_i, 2)].

    The outlines are in pixel edges.

    Same placement as ``boxes_sample`` (non-overlapping boxes), each shape rotated by up to 30 degrees and
    stretched onto its box; the painted pixels are exactly the outline's fill.
    """
    rng = np.random.default_rng([_OUTLINES_STREAM, params.seed, split_index, index])
    h, w = params.height, params.width
    img = background(rng, h, w)
    n_target = int(rng.integers(params.min_objects, params.max_objects + 1))
    classes, outlines = [], []
    for cls, place in _free_places(rng, n_target, h, w, params.num_classes):
        unit = _unit_outline(SYNTHETIC_CLASS_NAMES[cls], rng)
        outline = _place_outline(unit, place, math.radians(rng.uniform(-30, 30)))
        ys, xs = np.nonzero(_paint_outline(outline, (h, w)))
        img[ys, xs] = class_colour(rng, cls, params.num_classes) + rng.normal(0.0, 6.0, (len(ys), 3))
        classes.append(cls)
        outlines.append(outline)
    return np.clip(img, 0, 255).astype(np.uint8), np.asarray(classes, np.int64), outlines


def polygon_area(outline: np.ndarray) -> float:
    """Returns the area of a closed (k, 2) outline in its units squared, by the shoelace formula."""
    x, y = outline.T
    return 0.5 * abs(float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))))


_ORIENTED_STREAM = 2  # seeds the oriented-box set's images apart from the other sets'


def oriented_sample(params: ShapeParams, split_index: int, index: int):
    """Draws one image of rotated elongated objects: (H, W, 3) uint8 RGB, classes (n,) and oriented boxes.

    Each object's oriented box is its 4 corners [(4, 2)] in pixel edges.

    A class's shape is stretched to 2.5-5 times longer than wide, turned by any angle, and placed apart from the
    others (discs around them do not overlap); its label is the rotated rectangle the stretched shape fills
    (a rectangle exactly; an ellipse, diamond, ... touch its sides).
    """
    rng = np.random.default_rng([_ORIENTED_STREAM, params.seed, split_index, index])
    h, w = params.height, params.width
    img = background(rng, h, w)
    n_target = int(rng.integers(params.min_objects, params.max_objects + 1))
    classes, boxes, taken = [], [], []
    square = np.array([(-1, -1), (1, -1), (1, 1), (-1, 1)], np.float64)
    for _ in range(n_target * 20):
        if len(classes) == n_target:
            break
        length = rng.uniform(0.25, 0.6) * min(h, w)
        half = np.array([length / 2, max(1.5, length / rng.uniform(2.5, 5.0) / 2)])
        angle = rng.uniform(0, math.pi)
        radius = float(np.hypot(*half))
        if 2 * radius + 2 >= min(h, w):
            continue
        cx, cy = rng.uniform(radius + 1, w - radius - 1), rng.uniform(radius + 1, h - radius - 1)
        if any(math.hypot(cx - x, cy - y) < radius + r + 2 for x, y, r in taken):
            continue
        taken.append((cx, cy, radius))
        cls = int(rng.integers(params.num_classes))
        c, s = math.cos(angle), math.sin(angle)
        turn = np.array([[c, s], [-s, c]])  # (x, y) @ turn: turned by the angle (clockwise on the image)
        outline, box = (
            np.round(((unit * half) @ turn + (cx, cy)) * _SUBPIXEL) / _SUBPIXEL  # as painted: 1/16 pixel
            for unit in (_unit_outline(SYNTHETIC_CLASS_NAMES[cls], rng), square)
        )
        ys, xs = np.nonzero(_paint_outline(outline, (h, w)))
        img[ys, xs] = class_colour(rng, cls, params.num_classes) + rng.normal(0.0, 6.0, (len(ys), 3))
        classes.append(cls)
        boxes.append(box)
    return np.clip(img, 0, 255).astype(np.uint8), np.asarray(classes, np.int64), boxes
