"""A small synthetic detection (or segmentation) dataset: filled shapes on a noisy gradient, exact labels.

The built-in dataset of the quickstart, the notebook and the tests. Each class is a shape
(rectangle, ellipse, triangle, ...) painted in its own hue band (with jittered hue, saturation,
brightness and size), bright on a dark background, objects never overlapping: a tiny detector
learns it in a few epochs. A box is the exact extent of the painted pixels (drawn without
anti-aliasing), in pixel edges: ``x1 = min column``, ``x2 = max column + 1``.

The segmentation set (``task="segment"``, ``synthetic --task segment``) paints the same shapes as
polygons (curves as 32-gons, the ring as one outline with a hole), rotated by up to 30 degrees, and labels
each with the outline it was painted from (vertices at 1/16 pixel, in pixel-edge coordinates): the exact
polygon, whose extent is the box. Its images are its own (another random stream).

Deterministic: image i of a split depends only on (seed, split, i), so changing the number of
images does not change the others. Layout written under ``out_dir``::

    images/{train,val}/*.png   labels/{train,val}/*.txt   data.yaml
    {train,val}.json  coco.yaml     (with coco=True: the same images described as COCO json)
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import cv2
import numpy as np
import yaml

SYNTHETIC_CLASS_NAMES = ("rectangle", "ellipse", "triangle", "diamond", "cross", "hexagon", "star", "ring")
SYNTHETIC_YAML = "data.yaml"
SYNTHETIC_COCO_YAML = "coco.yaml"
_MARKER = "synthetic.json"  # the parameters the folder was generated with (written last)
_SPLITS = ("train", "val")
TASKS = ("detect", "segment")
_SEGMENT_STREAM = 1  # seeds the segmentation set's images apart from the detection set's
_ROUND_POINTS = 32  # vertices of an ellipse / ring circle
_SHIFT = 4  # fractional bits of the painted vertices
_SUBPIXEL = 1 << _SHIFT


def synthetic_class_names(num_classes: int = 3) -> list[str]:
    """Class names of a synthetic dataset with ``num_classes`` classes."""
    if not 1 <= num_classes <= len(SYNTHETIC_CLASS_NAMES):
        raise ValueError(f"num_classes must be 1..{len(SYNTHETIC_CLASS_NAMES)}, got {num_classes}")
    return list(SYNTHETIC_CLASS_NAMES[:num_classes])


@dataclass(frozen=True)
class _Params:
    num_train: int
    num_val: int
    height: int
    width: int
    num_classes: int
    seed: int
    max_objects: int
    min_objects: int
    coco: bool
    task: str = "detect"

    def marker(self) -> dict:
        """What ``synthetic.json`` records; a detection set's marker has no ``task`` (as before it existed)."""
        out = asdict(self)
        if out["task"] == "detect":
            del out["task"]
        return out


def _shape_mask(kind: str, box: tuple[int, int, int, int], shape: tuple[int, int], rng) -> np.ndarray:
    """uint8 mask (H, W) of one filled shape drawn inside box (x1, y1, x2, y2), pixel edges."""
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


def _background(rng, height: int, width: int) -> np.ndarray:
    """Dark diagonal gradient between two random colours (values 15..100) plus Gaussian noise."""
    c0, c1 = rng.uniform(15, 100, 3), rng.uniform(15, 100, 3)
    angle = rng.uniform(0, 2 * math.pi)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    t = (xx / max(width - 1, 1) * math.cos(angle) + yy / max(height - 1, 1) * math.sin(angle) + 1.5) / 3.0
    img = c0 + (c1 - c0) * t[..., None]
    return img + rng.normal(0.0, 6.0, img.shape)


def _class_colour(rng, cls: int, num_classes: int) -> np.ndarray:
    """A bright, saturated RGB colour in the class's hue band."""
    hue = (cls / num_classes + rng.uniform(-0.3, 0.3) / num_classes) % 1.0
    hsv = np.uint8([[[round(hue * 180) % 180, rng.integers(170, 256), rng.integers(190, 256)]]])
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)[0, 0].astype(np.float64)


def _sample(params: _Params, split_index: int, index: int):
    """One image: (H, W, 3) uint8 RGB, classes (n,), pixel boxes (n, 4) x1, y1, x2, y2 (edges)."""
    rng = np.random.default_rng([params.seed, split_index, index])
    h, w = params.height, params.width
    img = _background(rng, h, w)
    n_target = int(rng.integers(params.min_objects, params.max_objects + 1))
    classes, boxes, taken = [], [], []
    for _ in range(n_target * 20):  # rejection sampling of non-overlapping places
        if len(boxes) == n_target:
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
        cls = int(rng.integers(params.num_classes))
        mask = _shape_mask(SYNTHETIC_CLASS_NAMES[cls], taken[-1], (h, w), rng)
        ys, xs = np.nonzero(mask)
        img[ys, xs] = _class_colour(rng, cls, params.num_classes) + rng.normal(0.0, 6.0, (len(ys), 3))
        classes.append(cls)
        boxes.append((xs.min(), ys.min(), xs.max() + 1, ys.max() + 1))  # exact extent of the drawn pixels
    image = np.clip(img, 0, 255).astype(np.uint8)
    return image, np.asarray(classes, np.int64), np.asarray(boxes, np.float64).reshape(-1, 4)


def _unit_outline(kind: str, rng) -> np.ndarray:
    """The outline (k, 2) of a class's shape in the square [-1, 1]^2, as one closed polygon.

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
    """Rotate a unit outline by ``angle`` and stretch its extent onto box (x1, y1, x2, y2), pixel edges.

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
    """uint8 mask (H, W) of an outline in pixel-edge coordinates (pixel (i, j) has its centre at j + 0.5)."""
    mask = np.zeros(shape, np.uint8)
    fixed = np.round((outline - 0.5) * _SUBPIXEL).astype(np.int32)
    cv2.fillPoly(mask, [fixed], 255, cv2.LINE_8, shift=_SHIFT)
    return mask


def _segment_sample(params: _Params, split_index: int, index: int):
    """One segmentation image: (H, W, 3) uint8 RGB, classes (n,), outlines [(k_i, 2)] in pixel edges.

    Same placement as ``_sample`` (non-overlapping boxes), each shape rotated by up to 30 degrees and
    stretched onto its box; the painted pixels are exactly the outline's fill.
    """
    rng = np.random.default_rng([_SEGMENT_STREAM, params.seed, split_index, index])
    h, w = params.height, params.width
    img = _background(rng, h, w)
    n_target = int(rng.integers(params.min_objects, params.max_objects + 1))
    classes, outlines, taken = [], [], []
    for _ in range(n_target * 20):
        if len(outlines) == n_target:
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
        cls = int(rng.integers(params.num_classes))
        unit = _unit_outline(SYNTHETIC_CLASS_NAMES[cls], rng)
        outline = _place_outline(unit, taken[-1], math.radians(rng.uniform(-30, 30)))
        ys, xs = np.nonzero(_paint_outline(outline, (h, w)))
        img[ys, xs] = _class_colour(rng, cls, params.num_classes) + rng.normal(0.0, 6.0, (len(ys), 3))
        classes.append(cls)
        outlines.append(outline)
    return np.clip(img, 0, 255).astype(np.uint8), np.asarray(classes, np.int64), outlines


def _polygon_area(outline: np.ndarray) -> float:
    x, y = outline.T
    return 0.5 * abs(float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))))


def _write_split(
    out: Path, params: _Params, split_index: int, split: str, count: int, category_ids: list[int]
):
    for kind, ext in (("images", "png"), ("labels", "txt")):
        (out / kind / split).mkdir(parents=True, exist_ok=True)
        for stale in (out / kind / split).glob(f"{split}_*.{ext}"):  # from an earlier, larger run
            stale.unlink()
    coco = {"images": [], "annotations": [], "categories": []}
    for i in range(count):
        outlines = None
        if params.task == "segment":
            image, classes, outlines = _segment_sample(params, split_index, i)
            boxes = np.array([[*o.min(0), *o.max(0)] for o in outlines], np.float64).reshape(-1, 4)
        else:
            image, classes, boxes = _sample(params, split_index, i)
        name = f"{split}_{i:05d}"
        cv2.imwrite(str(out / "images" / split / f"{name}.png"), cv2.cvtColor(image, cv2.COLOR_RGB2BGR))
        h, w = image.shape[:2]
        if outlines is None:
            rows = [
                f"{c} {(x1 + x2) / 2 / w:.10f} {(y1 + y2) / 2 / h:.10f} {(x2 - x1) / w:.10f} {(y2 - y1) / h:.10f}"
                for c, (x1, y1, x2, y2) in zip(classes, boxes)
            ]
        else:
            rows = [
                f"{c} " + " ".join(f"{x / w:.10f} {y / h:.10f}" for x, y in outline)
                for c, outline in zip(classes, outlines)
            ]
        (out / "labels" / split / f"{name}.txt").write_text("".join(r + "\n" for r in rows))
        coco["images"].append(
            {"id": i + 1, "file_name": f"images/{split}/{name}.png", "width": w, "height": h}
        )
        for k, (c, (x1, y1, x2, y2)) in enumerate(zip(classes, boxes)):
            ann = {
                "id": len(coco["annotations"]) + 1,
                "image_id": i + 1,
                "category_id": category_ids[c],
                "bbox": [float(x1), float(y1), float(x2 - x1), float(y2 - y1)],
                "area": float((x2 - x1) * (y2 - y1)),
                "iscrowd": 0,
            }
            if outlines is not None:
                ann["segmentation"] = [[float(v) for v in outlines[k].reshape(-1)]]
                ann["area"] = _polygon_area(outlines[k])
            coco["annotations"].append(ann)
    if params.coco:
        names = synthetic_class_names(params.num_classes)
        coco["categories"] = [{"id": cid, "name": n} for cid, n in zip(category_ids, names)]
        (out / f"{split}.json").write_text(json.dumps(coco))


def make_synthetic_dataset(
    out_dir: str | Path,
    num_train: int = 64,
    num_val: int = 16,
    image_size: int | tuple[int, int] = 128,
    num_classes: int = 3,
    seed: int = 0,
    max_objects: int = 4,
    min_objects: int = 1,
    coco: bool = False,
    task: str = "detect",
) -> Path:
    """Write the dataset (module docstring) and return the path of its YOLO dataset yaml.

    ``image_size`` is an int or (height, width). With ``coco=True`` the same images are also
    described by ``train.json``/``val.json`` (category ids 1, 3, 5, ...: deliberately not
    contiguous) and ``coco.yaml``. ``task="segment"`` writes the segmentation set instead: rotated
    shapes labelled with their exact outlines (YOLO-seg rows, COCO ``segmentation`` polygons). A folder
    already generated with the same parameters is reused as is (its files, hence label caches, stay
    untouched).
    """
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    names = synthetic_class_names(num_classes)
    height, width = (int(image_size),) * 2 if np.ndim(image_size) == 0 else (int(v) for v in image_size)
    if min(height, width) < 16 or not 0 <= min_objects <= max_objects:
        raise ValueError(f"need image_size >= 16 and 0 <= min_objects <= max_objects, got {image_size}")
    params = _Params(
        num_train, num_val, height, width, num_classes, seed, max_objects, min_objects, coco, task
    )
    out = Path(out_dir)
    marker = out / _MARKER
    yaml_path = out / SYNTHETIC_YAML
    try:
        same = json.loads(marker.read_text()) == params.marker() and yaml_path.is_file()
        counts = [len(list((out / "images" / s).glob(f"{s}_*.png"))) for s in _SPLITS]
        if same and counts == [num_train, num_val]:
            return yaml_path
    except (OSError, ValueError):
        pass
    out.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)
    category_ids = [2 * k + 1 for k in range(num_classes)]
    for split_index, (split, count) in enumerate(zip(_SPLITS, (num_train, num_val))):
        _write_split(out, params, split_index, split, count, category_ids)
    # No `path`: the root is the yaml's folder (here and in the reference), so the folder can move.
    yaml_path.write_text(yaml.safe_dump({"train": "images/train", "val": "images/val", "names": names}))
    if coco:  # no `names`: the class list comes from the json categories
        (out / SYNTHETIC_COCO_YAML).write_text(yaml.safe_dump({"train": "train.json", "val": "val.json"}))
    marker.write_text(json.dumps(params.marker()))
    return yaml_path


def make_synthetic_coco(out_dir: str | Path, **kwargs) -> Path:
    """Same as ``make_synthetic_dataset(coco=True)`` but returns the COCO dataset yaml."""
    make_synthetic_dataset(out_dir, coco=True, **kwargs)
    return Path(out_dir) / SYNTHETIC_COCO_YAML


def main(argv: Sequence[str] | None = None) -> int:
    """``yolo11-lightning synthetic --out DIR [--hard] [--train N --val N --size S --seed S ...]``."""
    p = argparse.ArgumentParser(prog="yolo11-lightning synthetic", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--train", type=int, default=64, help="number of training images")
    p.add_argument("--val", type=int, default=16, help="number of validation images")
    p.add_argument("--size", type=int, nargs="+", help="image size: S, or H W (default 128; --hard: 192 256)")
    p.add_argument("--classes", type=int, default=3, help=f"1..{len(SYNTHETIC_CLASS_NAMES)}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-objects", type=int, help="default 4; --hard: 7")
    p.add_argument("--coco", action="store_true", help="also write COCO json files and coco.yaml")
    p.add_argument(
        "--task", choices=TASKS, default="detect",
        help="segment: shapes labelled with their exact polygons (YOLO-seg rows; COCO segmentation)",
    )  # fmt: skip
    p.add_argument(
        "--hard", action="store_true",
        help="the harder set of yolo11_lightning.data.synthetic_hard (5 look-alike classes, clutter, "
        "overlaps; --classes and --coco do not apply)",
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.size is not None and len(args.size) not in (1, 2):
        p.error("--size takes S or H W")
    if args.hard and args.coco:
        p.error("--coco is not available with --hard")
    if args.hard and args.task != "detect":
        p.error("--task segment is not available with --hard")
    sizes = args.size or ([192, 256] if args.hard else [128])
    size = sizes[0] if len(sizes) == 1 else (sizes[0], sizes[1])
    try:
        if args.hard:
            from yolo11_lightning.data.synthetic_hard import make_hard_synthetic_dataset

            path = make_hard_synthetic_dataset(
                args.out, args.train, args.val, size, args.seed, max_objects=args.max_objects or 7
            )
        else:
            path = make_synthetic_dataset(
                args.out, args.train, args.val, size, args.classes, args.seed, args.max_objects or 4,
                coco=args.coco, task=args.task,
            )  # fmt: skip
    except ValueError as e:
        p.error(str(e))
    print(Path(args.out) / SYNTHETIC_COCO_YAML if args.coco else path)
    return 0
