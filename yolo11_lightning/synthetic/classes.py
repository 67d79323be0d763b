"""A small synthetic classification set: one shape per image, its class the label (the ImageFolder layout).

Each image shows one filled shape of its class (``painter.SYNTHETIC_CLASS_NAMES``: rectangle, ellipse,
triangle, ...), 35-85 % of the image side, anywhere inside it, on the shapes set's noisy gradient, with up to two
small distractor shapes of any class (at most 1/5 of the side, so the largest shape is always the labelled one).
Every shape is painted in its class's hue band (``painter.class_colour``, as the detection sets): the colour
hints at the class, a cue a model from scratch picks up within the reference recipe's warmup, and the outline
tells it. ``class_hues=False`` paints every shape in any hue instead: the outline alone tells the class (ellipse,
ring, hexagon and star, or diamond and rectangle, differ at 64 px by a few pixels), which the reference recipe
learns only over hundreds of optimiser steps (``docs/classify.md``).

Deterministic: image i of a split depends only on (seed, split, i); its class is i modulo the class count, so
every split is balanced. Layout written under ``out_dir``
(``data.sources.imagefolder``; the reference's ``data=<out_dir>`` reads it as is)::

    train/<class>/<i>.png   val/<class>/<i>.png   data.yaml (train: train, val: val, names)
"""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import yaml

from yolo11_lightning.synthetic._folder import SPLITS
from yolo11_lightning.synthetic.painter import SYNTHETIC_CLASS_NAMES, background, class_colour, shape_mask

__all__ = ["classes_sample", "make_classes_dataset"]

_STREAM = 2  # seeds this set's images apart from the shapes sets'
_MARKER = "synthetic.json"
YAML_NAME = "data.yaml"


def _any_colour(rng: np.random.Generator) -> np.ndarray:
    """Picks a bright RGB colour of any hue."""
    hsv = np.uint8([[[rng.integers(180), rng.integers(120, 256), rng.integers(150, 256)]]])
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)[0, 0].astype(np.float64)


def _paint(img: np.ndarray, rng: np.random.Generator, cls: int, side: float, num_classes: int | None) -> None:
    """Paints one shape of class ``cls`` with a side of about ``side``.

    Its hue comes from the class's band of ``num_classes``, or is any hue when that is None.
    """
    h, w = img.shape[:2]
    aspect = rng.uniform(0.75, 1.33)
    bw, bh = max(4, min(w - 2, round(side * aspect))), max(4, min(h - 2, round(side / aspect)))
    x1, y1 = int(rng.integers(1, w - bw)), int(rng.integers(1, h - bh))
    mask = shape_mask(SYNTHETIC_CLASS_NAMES[cls], (x1, y1, x1 + bw, y1 + bh), (h, w), rng)
    ys, xs = np.nonzero(mask)
    colour = _any_colour(rng) if num_classes is None else class_colour(rng, cls, num_classes)
    img[ys, xs] = colour + rng.normal(0.0, 6.0, (len(ys), 3))


def classes_sample(
    seed: int, split_index: int, index: int, size: int, num_classes: int, class_hues: bool = True
) -> tuple[np.ndarray, int]:
    """Draws one (size, size, 3) uint8 RGB image and its class, ``index`` modulo ``num_classes``.

    Shapes are in their class's hue band, or in any hue without ``class_hues``; see the module docstring.
    """
    rng = np.random.default_rng([_STREAM, seed, split_index, index])
    cls = index % num_classes  # balanced in any split, however small
    hues = num_classes if class_hues else None
    img = background(rng, size, size)
    for _ in range(int(rng.integers(3))):  # distractors first: the labelled shape is painted over them
        _paint(img, rng, int(rng.integers(num_classes)), rng.uniform(0.1, 0.2) * size, hues)
    _paint(img, rng, cls, rng.uniform(0.35, 0.85) * size, hues)
    return np.clip(img, 0, 255).astype(np.uint8), cls


def make_classes_dataset(
    out_dir: str | Path, num_train: int = 64, num_val: int = 16, image_size: int = 64, num_classes: int = 3,
    seed: int = 0, class_hues: bool = True,
) -> Path:  # fmt: skip
    """Writes the set described in the module docstring and returns its data.yaml.

    The folder itself is the ImageFolder root; with ``class_hues`` shapes are in their class's hue band. A
    folder already written with the same parameters is reused as is.
    """
    if not 1 <= num_classes <= len(SYNTHETIC_CLASS_NAMES):
        raise ValueError(f"num_classes must be 1..{len(SYNTHETIC_CLASS_NAMES)}, got {num_classes}")
    if image_size < 16:
        raise ValueError(f"need image_size >= 16, got {image_size}")
    names = list(SYNTHETIC_CLASS_NAMES[:num_classes])
    params = {"set": "classify", "num_train": num_train, "num_val": num_val, "image_size": image_size,
              "num_classes": num_classes, "seed": seed, "class_hues": class_hues}  # fmt: skip
    out = Path(out_dir)
    marker, yaml_path = out / _MARKER, out / YAML_NAME
    try:
        if json.loads(marker.read_text()) == params and yaml_path.is_file():
            return yaml_path
    except (OSError, ValueError):
        pass
    out.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)
    for split_index, (split, count) in enumerate(zip(SPLITS, (num_train, num_val))):
        for name in names:  # every class folder exists, even one no image of a tiny split falls in
            folder = out / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for old in folder.glob("*.png"):
                old.unlink()
        for i in range(count):
            image, cls = classes_sample(seed, split_index, i, image_size, num_classes, class_hues)
            cv2.imwrite(str(out / split / names[cls] / f"{split}_{i:05d}.png"), image[..., ::-1])
    yaml_path.write_text(yaml.safe_dump({"train": "train", "val": "val", "names": names}))
    marker.write_text(json.dumps(params))
    return yaml_path
