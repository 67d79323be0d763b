"""A harder synthetic detection set: look-alike shapes, small and overlapping, on cluttered backgrounds.

Meant for convergence benchmarks that must be able to show a gap between two trainers; the quickstart
and the tests keep the easy set of :mod:`yolo11_lightning.synthetic.shapes`. What makes it hard:

- look-alike classes: circle vs ring, square vs cross, triangle (a third outline), drawn with random
  colours that carry no class information, at a contrast that varies per object;
- clutter: a colour gradient with random straight lines, Gaussian noise, and distractor blobs (blurred
  ellipses and thin squiggles that belong to no class);
- small objects (3% to 35% of the short image side) and 1-7 objects per image that may overlap; a later
  object is drawn over an earlier one. An occluded object keeps its label, and its box is the FULL
  extent of its shape as drawn before occlusion (``x1 = min column``, ``x2 = max column + 1``, pixel
  edges), not the visible part. A placement that would leave an earlier object less than 40% visible
  is rejected, so no label describes an invisible object;
- non-square images (``image_size=(height, width)``, default 192 x 256).

Deterministic: image i of a split depends only on (seed, split, i). The folder layout and the reuse of an
already generated folder are those of :func:`yolo11_lightning.synthetic.shapes.make_synthetic_dataset`.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import cv2
import numpy as np
import yaml

from yolo11_lightning.synthetic._folder import SPLITS, already_written

HARD_CLASS_NAMES = ("circle", "ring", "square", "cross", "triangle")
_MARKER = "synthetic_hard.json"
_MIN_VISIBLE = 0.4  # an earlier object must keep at least this share of its pixels visible


@dataclass(frozen=True)
class _Params:
    num_train: int
    num_val: int
    height: int
    width: int
    seed: int
    min_objects: int
    max_objects: int


def _shape_mask(kind: str, box: tuple[int, int, int, int], shape: tuple[int, int], rng) -> np.ndarray:
    """Returns the bool (H, W) mask of one shape inside box (x1, y1, x2, y2), in pixel edges."""
    mask = np.zeros(shape, np.uint8)
    x1, y1, x2, y2 = box
    xr, yb = x2 - 1, y2 - 1
    cx, cy = (x1 + xr) / 2, (y1 + yb) / 2
    rx, ry = (xr - x1) / 2, (yb - y1) / 2
    if kind in ("circle", "ring"):
        axes = (max(1, round(rx)), max(1, round(ry)))
        cv2.ellipse(mask, (round(cx), round(cy)), axes, 0, 0, 360, 255, -1)
        if kind == "ring":  # a thick ring: from afar it looks like a circle
            k = rng.uniform(0.45, 0.65)
            inner = (max(1, round(rx * k)), max(1, round(ry * k)))
            cv2.ellipse(mask, (round(cx), round(cy)), inner, 0, 0, 360, 0, -1)
    elif kind == "square":
        cv2.rectangle(mask, (x1, y1), (xr, yb), 255, -1)
    elif kind == "cross":  # fat arms: a square with its corners cut out
        tx, ty = max(1.0, rx * rng.uniform(0.45, 0.7)), max(1.0, ry * rng.uniform(0.45, 0.7))
        cv2.rectangle(mask, (x1, round(cy - ty)), (xr, round(cy + ty)), 255, -1)
        cv2.rectangle(mask, (round(cx - tx), y1), (round(cx + tx), yb), 255, -1)
    elif kind == "triangle":
        apex = [(cx, y1), (cx, yb)][int(rng.integers(2))]
        base_y = yb if apex[1] == y1 else y1
        points = np.round(np.asarray([(x1, base_y), (xr, base_y), apex])).astype(np.int32)
        cv2.fillPoly(mask, [points], 255, cv2.LINE_8)
    else:
        raise ValueError(kind)
    return mask > 0


def _background(rng, height: int, width: int) -> np.ndarray:
    """Paints a float (H, W, 3) background: a gradient, random lines, distractor blobs and squiggles.

    The gradient runs between two colours.
    """
    c0, c1 = rng.uniform(20, 200, 3), rng.uniform(20, 200, 3)
    angle = rng.uniform(0, 2 * math.pi)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    t = (xx / max(width - 1, 1) * math.cos(angle) + yy / max(height - 1, 1) * math.sin(angle) + 1.5) / 3.0
    img = (c0 + (c1 - c0) * t[..., None]).astype(np.float32)
    short = min(height, width)
    for _ in range(int(rng.integers(3, 12))):  # straight lines
        p0 = (int(rng.integers(0, width)), int(rng.integers(0, height)))
        p1 = (int(rng.integers(0, width)), int(rng.integers(0, height)))
        cv2.line(img, p0, p1, rng.uniform(0, 255, 3).tolist(), int(rng.integers(1, 4)))
    blobs = np.zeros_like(img)
    alpha = np.zeros((height, width), np.float32)
    for _ in range(int(rng.integers(2, 8))):  # soft distractor blobs: no class looks like them
        centre = (int(rng.integers(0, width)), int(rng.integers(0, height)))
        axes = (max(1, int(rng.uniform(0.02, 0.15) * short)), max(1, int(rng.uniform(0.02, 0.15) * short)))
        layer = np.zeros((height, width), np.float32)
        cv2.ellipse(layer, centre, axes, float(rng.uniform(0, 180)), 0, 360, 1.0, -1)
        colour = rng.uniform(0, 255, 3).astype(np.float32)
        blobs = blobs * (1 - layer[..., None]) + colour * layer[..., None]
        alpha = np.maximum(alpha, layer)
    alpha = cv2.GaussianBlur(alpha, (0, 0), max(1.0, short / 80)) * 0.8
    img = img * (1 - alpha[..., None]) + blobs * alpha[..., None]
    for _ in range(int(rng.integers(1, 5))):  # thin squiggles (open polylines)
        n = int(rng.integers(3, 7))
        start = rng.uniform((0, 0), (width, height))
        points = start + np.cumsum(rng.normal(0, short * 0.08, (n, 2)), 0)
        cv2.polylines(img, [points.astype(np.int32)], False, rng.uniform(0, 255, 3).tolist(), 1)
    return img


def _sample(params: _Params, split_index: int, index: int):
    """Draws one image: (H, W, 3) uint8 RGB, classes (n,) and the objects' full-extent pixel boxes.

    The boxes are (n, 4) x1, y1, x2, y2.
    """
    rng = np.random.default_rng([params.seed, split_index, index, 1])
    h, w = params.height, params.width
    img = _background(rng, h, w)
    n_target = int(rng.integers(params.min_objects, params.max_objects + 1))
    owner = np.full((h, w), -1, np.int32)  # which object each pixel shows (-1: background)
    sizes: list[int] = []  # pixel count of each object's full shape
    classes, boxes = [], []
    short = min(h, w)
    for _ in range(n_target * 30):
        if len(boxes) == n_target:
            break
        side = short * math.exp(rng.uniform(math.log(0.06), math.log(0.35)))
        aspect = rng.uniform(0.75, 1.33)
        bw, bh = max(5, round(side * aspect)), max(5, round(side / aspect))
        if bw > w - 2 or bh > h - 2:
            continue
        x1, y1 = int(rng.integers(1, w - bw)), int(rng.integers(1, h - bh))
        cls = int(rng.integers(len(HARD_CLASS_NAMES)))
        mask = _shape_mask(HARD_CLASS_NAMES[cls], (x1, y1, x1 + bw, y1 + bh), (h, w), rng)
        if mask.sum() < 8:
            continue
        after = np.where(mask, len(boxes), owner)
        visible = np.bincount(after[after >= 0].ravel(), minlength=len(boxes) + 1)[: len(boxes)]
        if any(v < _MIN_VISIBLE * s for v, s in zip(visible, sizes)):
            continue
        owner = after
        sizes.append(int(mask.sum()))
        # random colour, contrast against the local background varies from faint to strong
        local = img[mask].mean(0)
        direction = rng.uniform(-1, 1, 3)
        direction /= np.linalg.norm(direction) + 1e-6
        colour = np.clip(local + direction * rng.uniform(40, 140), 0, 255)
        shade = rng.normal(0.0, 8.0, (int(mask.sum()), 3))
        img[mask] = colour + shade
        ys, xs = np.nonzero(mask)
        classes.append(cls)
        boxes.append((xs.min(), ys.min(), xs.max() + 1, ys.max() + 1))
    img = img + rng.normal(0.0, rng.uniform(4, 14), img.shape)
    image = np.clip(img, 0, 255).astype(np.uint8)
    return image, np.asarray(classes, np.int64), np.asarray(boxes, np.float64).reshape(-1, 4)


def _write_split(out: Path, params: _Params, split_index: int, split: str, count: int) -> None:
    for kind, ext in (("images", "png"), ("labels", "txt")):
        (out / kind / split).mkdir(parents=True, exist_ok=True)
        for stale in (out / kind / split).glob(f"{split}_*.{ext}"):
            stale.unlink()
    for i in range(count):
        image, classes, boxes = _sample(params, split_index, i)
        name = f"{split}_{i:05d}"
        cv2.imwrite(str(out / "images" / split / f"{name}.png"), cv2.cvtColor(image, cv2.COLOR_RGB2BGR))
        h, w = image.shape[:2]
        rows = [
            f"{c} {(x1 + x2) / 2 / w:.10f} {(y1 + y2) / 2 / h:.10f} {(x2 - x1) / w:.10f} {(y2 - y1) / h:.10f}"
            for c, (x1, y1, x2, y2) in zip(classes, boxes)
        ]
        (out / "labels" / split / f"{name}.txt").write_text("".join(r + "\n" for r in rows))


def make_hard_synthetic_dataset(
    out_dir: str | Path,
    num_train: int = 400,
    num_val: int = 100,
    image_size: int | tuple[int, int] = (192, 256),
    seed: int = 0,
    min_objects: int = 1,
    max_objects: int = 7,
) -> Path:
    """Writes the hard set described in the module docstring and returns the path of its YOLO dataset yaml.

    ``image_size`` is an int or (height, width) in pixels. A folder already generated with the same
    parameters is reused untouched.
    """
    height, width = (int(image_size),) * 2 if np.ndim(image_size) == 0 else (int(v) for v in image_size)
    if min(height, width) < 32 or not 1 <= min_objects <= max_objects:
        raise ValueError(
            f"need image_size >= 32 and 1 <= min_objects <= max_objects, got {image_size}, "
            f"{min_objects}, {max_objects}"
        )
    params = _Params(num_train, num_val, height, width, seed, min_objects, max_objects)
    out = Path(out_dir)
    marker, yaml_path = out / _MARKER, out / "data.yaml"
    if already_written(out, marker, yaml_path, asdict(params), (num_train, num_val)):
        return yaml_path
    out.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)
    for split_index, (split, count) in enumerate(zip(SPLITS, (num_train, num_val))):
        _write_split(out, params, split_index, split, count)
    names = list(HARD_CLASS_NAMES)
    yaml_path.write_text(yaml.safe_dump({"train": "images/train", "val": "images/val", "names": names}))
    marker.write_text(json.dumps(asdict(params)))
    return yaml_path
