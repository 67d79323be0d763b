"""The synthetic keypoint (pose) set: five-pointed figures with labelled keypoints, some occluded or unlabelled.

Each object is a figure of ``SYNTHETIC_KPT_SHAPE`` = (5, 3) keypoints: a head at the top, two hands and two
feet, left (smaller x in the upright figure) and right, joined by thick limbs in the class's hue band, with a
bright disc at each keypoint (over every figure); the figure is scaled, stretched and rotated by up to 25 degrees. Its box is the
exact extent of the painted pixels. Per keypoint: visibility 2 (painted, visible), 1 (labelled but covered by
a dark patch instead of its disc, ``OCCLUDED``) or 0 (not labelled, written ``0 0 0``, ``UNLABELLED``). ``flip_idx`` swaps left
and right: [0, 2, 1, 4, 3].

Deterministic: image i of a split depends only on (seed, split, i). Layout written under ``out_dir``::

    images/{train,val}/*.png   labels/{train,val}/*.txt   data.yaml (names, the keypoints and their flip)
    {train,val}.json  coco.yaml     (with coco=True: the same labels as COCO keypoints json)

Rows are the reference's pose rows: ``class cx cy w h`` then ``x y v`` per keypoint, normalised. The COCO json
has them in pixels (``bbox`` [x, y, w, h], ``keypoints`` [x, y, v, ...], ``num_keypoints``), its categories the
keypoint names (``KEYPOINT_NAMES``) and the limbs (``skeleton``, 1-based); ``coco.yaml`` declares no keypoints:
their shape and flip follow from the names (``LabelOptions.with_keypoint_names``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import cv2
import numpy as np
import yaml

from yolo11_lightning.data.sources.label_options import LabelOptions
from yolo11_lightning.synthetic._folder import SPLITS, already_written
from yolo11_lightning.synthetic.painter import SYNTHETIC_CLASS_NAMES

__all__ = [
    "FLIP_IDX", "KEYPOINT_NAMES", "SKELETON", "SYNTHETIC_KPT_SHAPE", "make_synthetic_pose_dataset", "pose_sample",
]  # fmt: skip

SYNTHETIC_KPT_SHAPE = (5, 3)  # head, left hand, right hand, left foot, right foot; x, y, visibility
FLIP_IDX = (0, 2, 1, 4, 3)
# The COCO json's keypoint names; they give FLIP_IDX (``sources.config.flip_from_names``).
KEYPOINT_NAMES = ("head", "left_hand", "right_hand", "left_foot", "right_foot")
SKELETON = ((0, 1), (0, 2), (0, 3), (0, 4))  # limbs: head to each hand and foot
OCCLUDED = 0.12  # chance a keypoint is covered by a dark patch (visibility 1)
UNLABELLED = 0.08  # chance a keypoint is left unlabelled (visibility 0)
_UNIT = np.array([[0.0, -1.0], [-0.9, -0.25], [0.9, -0.25], [-0.55, 1.0], [0.55, 1.0]])  # upright figure
_POSE_STREAM = 2  # seeds the pose set's images apart from the other synthetic sets'
_MARKER = "synthetic.json"


def _colour(rng: np.random.Generator, cls: int, num_classes: int) -> tuple[float, float, float]:
    hue = (cls / num_classes + rng.uniform(-0.25, 0.25) / num_classes) % 1.0
    hsv = np.uint8([[[round(hue * 180) % 180, rng.integers(170, 256), rng.integers(170, 230)]]])
    return tuple(float(v) for v in cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)[0, 0])


def pose_sample(
    seed: int, split_index: int, index: int, height: int, width: int, num_classes: int, max_objects: int,
    min_objects: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """Draws one image: (H, W, 3) uint8 RGB, classes (n,), pixel boxes (n, 4) and keypoints (n, 5, 3).

    Boxes are x1, y1, x2, y2 in pixel edges; keypoints are pixel x, y and visibility (0: unlabelled, its
    x, y then 0).
    """
    rng = np.random.default_rng([seed, _POSE_STREAM, split_index, index])
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    c0, c1 = rng.uniform(15, 90, 3), rng.uniform(15, 90, 3)
    t = (xx / max(width - 1, 1) + yy / max(height - 1, 1)) / 2
    img = c0 + (c1 - c0) * t[..., None] + rng.normal(0.0, 5.0, (height, width, 3))
    n_target = int(rng.integers(min_objects, max_objects + 1))
    taken: list[tuple[float, float, float, float]] = []
    classes, boxes, keypoints, marks = [], [], [], []
    for _ in range(n_target * 20):
        if len(taken) == n_target:
            break
        size = rng.uniform(0.18, 0.42) * min(height, width)
        sx, sy = size / 2 * rng.uniform(0.8, 1.2), size / 2
        cx, cy = rng.uniform(sx + 3, width - sx - 3), rng.uniform(sy + 3, height - sy - 3)
        box = (cx - size * 0.7, cy - size * 0.7, cx + size * 0.7, cy + size * 0.7)
        if any(box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3] for b in taken):
            continue
        taken.append(box)
        cls = int(rng.integers(num_classes))
        angle = math.radians(rng.uniform(-25, 25))
        rot = np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
        points = (_UNIT * (sx, sy)) @ rot.T + (cx, cy)
        points += rng.normal(0, size * 0.03, points.shape)
        points = np.clip(points, 0, (width - 1, height - 1))
        mask = np.zeros((height, width), np.uint8)
        thick = max(2, round(size * 0.09))
        for a, b in SKELETON:
            cv2.line(
                mask,
                tuple(np.round(points[a]).astype(int)),
                tuple(np.round(points[b]).astype(int)),
                255,
                thick,
            )
        cv2.circle(mask, tuple(np.round(points[0]).astype(int)), max(2, round(size * 0.12)), 255, -1)
        ys, xs = np.nonzero(mask)
        img[ys, xs] = _colour(rng, cls, num_classes)
        visibility = np.full(5, 2.0)
        draw = rng.random(5)
        visibility[draw < OCCLUDED] = 1.0
        marks.append((points, visibility.copy(), max(1, round(size * 0.05)), max(2, round(size * 0.08))))
        visibility[(draw >= OCCLUDED) & (draw < OCCLUDED + UNLABELLED)] = 0.0
        extent = np.nonzero(mask)
        x1 = min(int(extent[1].min()), int(np.floor(points[:, 0].min())))
        y1 = min(int(extent[0].min()), int(np.floor(points[:, 1].min())))
        x2 = max(int(extent[1].max()) + 1, int(np.ceil(points[:, 0].max())))
        y2 = max(int(extent[0].max()) + 1, int(np.ceil(points[:, 1].max())))
        x1, y1, x2, y2 = max(x1, 0), max(y1, 0), min(x2, width), min(y2, height)
        labelled = np.where(visibility[:, None] > 0, points, 0.0)
        classes.append(cls)
        boxes.append((x1, y1, x2, y2))
        keypoints.append(np.concatenate([labelled, visibility[:, None]], 1))
    for occluded in (
        True,
        False,
    ):  # over every figure: the occluding patches, then the other keypoints' discs
        for points, visibility, radius, half in marks:
            for (x, y), v in zip(np.round(points).astype(int).tolist(), visibility):
                if occluded and v == 1:
                    cv2.rectangle(img, (x - half, y - half), (x + half, y + half), (40, 40, 40), -1)
                elif not occluded and v != 1:
                    cv2.circle(img, (x, y), radius, (235, 235, 235), -1)
    image = np.clip(img, 0, 255).astype(np.uint8)
    return (
        image,
        np.asarray(classes, np.int64),
        np.asarray(boxes, np.float64).reshape(-1, 4),
        np.asarray(keypoints, np.float64).reshape(-1, 5, 3),
    )


def make_synthetic_pose_dataset(
    out_dir: str | Path,
    num_train: int = 64,
    num_val: int = 16,
    image_size: int | tuple[int, int] = 128,
    num_classes: int = 3,
    seed: int = 0,
    max_objects: int = 4,
    min_objects: int = 1,
    coco: bool = False,
) -> Path:
    """Writes the pose set described in the module docstring and returns its dataset yaml.

    A folder already written with the same parameters is reused as is. With ``coco`` it also writes
    {train,val}.json and coco.yaml (category ids 1, 3, 5, ...).
    """
    if not 1 <= num_classes <= len(SYNTHETIC_CLASS_NAMES):
        raise ValueError(f"num_classes must be 1..{len(SYNTHETIC_CLASS_NAMES)}, got {num_classes}")
    height, width = (int(image_size),) * 2 if np.ndim(image_size) == 0 else (int(v) for v in image_size)
    if min(height, width) < 32 or not 0 <= min_objects <= max_objects:
        raise ValueError(f"need image_size >= 32 and 0 <= min_objects <= max_objects, got {image_size}")
    params = {
        "task": "pose", "num_train": num_train, "num_val": num_val, "height": height, "width": width,
        "num_classes": num_classes, "seed": seed, "max_objects": max_objects, "min_objects": min_objects,
        **({"coco": True} if coco else {}),
    }  # fmt: skip
    out = Path(out_dir)
    marker, yaml_path = out / _MARKER, out / "data.yaml"
    if already_written(out, marker, yaml_path, params, (num_train, num_val)):
        return yaml_path
    out.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)
    names = list(SYNTHETIC_CLASS_NAMES[:num_classes])
    category_ids = [2 * c + 1 for c in range(num_classes)]
    categories = [
        {
            "id": i,
            "name": n,
            "keypoints": list(KEYPOINT_NAMES),
            "skeleton": [[a + 1, b + 1] for a, b in SKELETON],
        }
        for i, n in zip(category_ids, names)
    ]
    for split_index, (split, count) in enumerate(zip(SPLITS, (num_train, num_val))):
        described: dict[str, list] = {"images": [], "annotations": [], "categories": categories}
        for kind, ext in (("images", "png"), ("labels", "txt")):
            (out / kind / split).mkdir(parents=True, exist_ok=True)
            for stale in (out / kind / split).glob(f"{split}_*.{ext}"):
                stale.unlink()
        for i in range(count):
            image, classes, boxes, points = pose_sample(
                seed, split_index, i, height, width, num_classes, max_objects, min_objects
            )
            name = f"{split}_{i:05d}"
            cv2.imwrite(str(out / "images" / split / f"{name}.png"), cv2.cvtColor(image, cv2.COLOR_RGB2BGR))
            rows = []
            for c, (x1, y1, x2, y2), kpts in zip(classes, boxes, points):
                box = f"{(x1 + x2) / 2 / width:.8f} {(y1 + y2) / 2 / height:.8f} {(x2 - x1) / width:.8f} {(y2 - y1) / height:.8f}"
                kp = " ".join(f"{x / width:.8f} {y / height:.8f} {int(v)}" for x, y, v in kpts)
                rows.append(f"{c} {box} {kp}\n")
            (out / "labels" / split / f"{name}.txt").write_text("".join(rows))
            described["images"].append(
                {"id": i + 1, "file_name": f"images/{split}/{name}.png", "width": width, "height": height}
            )
            for c, (x1, y1, x2, y2), kpts in zip(classes, boxes, points):
                described["annotations"].append(
                    {
                        "id": len(described["annotations"]) + 1, "image_id": i + 1,
                        "category_id": category_ids[c], "iscrowd": 0,
                        "bbox": [float(x1), float(y1), float(x2 - x1), float(y2 - y1)],
                        "area": float((x2 - x1) * (y2 - y1)),
                        "keypoints": [float(v) for v in kpts.reshape(-1)],
                        "num_keypoints": int((kpts[:, 2] > 0).sum()),
                    }
                )  # fmt: skip
        if coco:
            (out / f"{split}.json").write_text(json.dumps(described))
    yaml_path.write_text(
        yaml.safe_dump(
            {
                "train": "images/train",
                "val": "images/val",
                "names": names,
                **LabelOptions(SYNTHETIC_KPT_SHAPE, FLIP_IDX).yaml_keys(),
            },
            sort_keys=False,
        )
    )
    if coco:  # names, keypoints and their flip from the json's categories
        (out / "coco.yaml").write_text(  # shapes.SYNTHETIC_COCO_YAML (shapes imports this module)
            yaml.safe_dump({"train": "train.json", "val": "val.json"})
        )
    marker.write_text(json.dumps(params))
    return yaml_path
