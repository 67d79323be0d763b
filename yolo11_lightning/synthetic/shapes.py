"""A small synthetic detection (or segmentation) dataset: filled shapes on a noisy gradient, exact labels.

The built-in dataset of the quickstart, the notebook and the tests. Each class is a shape
(rectangle, ellipse, triangle, ...) painted in its own hue band (with jittered hue, saturation,
brightness and size), bright on a dark background, objects never overlapping: a tiny detector
learns it in a few epochs. A box is the exact extent of the painted pixels (drawn without
anti-aliasing), in pixel edges: ``x1 = min column``, ``x2 = max column + 1``.

The segmentation set (``task="segment"``, ``synthetic --task segment``: any task whose labels carry outlines,
``structures.polygons.Polygons``) paints the same shapes as
polygons (curves as 32-gons, the ring as one outline with a hole), rotated by up to 30 degrees, and labels
each with the outline it was painted from (vertices at 1/16 pixel, in pixel-edge coordinates): the exact
polygon, whose extent is the box. Its images are its own (another random stream). The oriented-box set
(``task="obb"``, ``painter.oriented_sample``) paints the shapes stretched 2.5-5 times longer than wide and turned by
any angle, each labelled with its rotated rectangle's four corners (YOLO OBB rows).

Deterministic: image i of a split depends only on (seed, split, i), so changing the number of
images does not change the others. Layout written under ``out_dir``::

    images/{train,val}/*.png   labels/{train,val}/*.txt   data.yaml
    {train,val}.json  coco.yaml     (with coco=True: the same images described as COCO json)

This module writes the folder (labels, yamls, COCO json); ``synthetic.painter`` paints the images and
``synthetic.command`` is the ``synthetic`` CLI.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import cv2
import numpy as np
import yaml

from yolo11_lightning.structures.keypoints import Keypoints
from yolo11_lightning.structures.polygons import Polygons
from yolo11_lightning.synthetic._folder import SPLITS, already_written
from yolo11_lightning.synthetic.classes import make_classes_dataset
from yolo11_lightning.synthetic.painter import (
    SYNTHETIC_CLASS_NAMES,
    ShapeParams,
    boxes_sample,
    oriented_sample,
    outlines_sample,
    polygon_area,
)
from yolo11_lightning.synthetic.poses import make_synthetic_pose_dataset
from yolo11_lightning.tasks import get_task
from yolo11_lightning.tasks.obb.labels import ObbCorners

SYNTHETIC_YAML = "data.yaml"
SYNTHETIC_COCO_YAML = "coco.yaml"
_MARKER = "synthetic.json"  # the parameters the folder was generated with (written last)


def synthetic_class_names(num_classes: int = 3) -> list[str]:
    """Returns the class names of a synthetic dataset with ``num_classes`` classes."""
    if not 1 <= num_classes <= len(SYNTHETIC_CLASS_NAMES):
        raise ValueError(f"num_classes must be 1..{len(SYNTHETIC_CLASS_NAMES)}, got {num_classes}")
    return list(SYNTHETIC_CLASS_NAMES[:num_classes])


def _write_split(
    out: Path,
    params: ShapeParams,
    outlines_set: Callable | None,
    split_index: int,
    split: str,
    count: int,
    category_ids: list[int],
):
    for kind, ext in (("images", "png"), ("labels", "txt")):
        (out / kind / split).mkdir(parents=True, exist_ok=True)
        for stale in (out / kind / split).glob(f"{split}_*.{ext}"):  # from an earlier, larger run
            stale.unlink()
    coco = {"images": [], "annotations": [], "categories": []}
    for i in range(count):
        outlines = None
        if outlines_set:
            image, classes, outlines = outlines_set(params, split_index, i)
            boxes = np.array([[*o.min(0), *o.max(0)] for o in outlines], np.float64).reshape(-1, 4)
        else:
            image, classes, boxes = boxes_sample(params, split_index, i)
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
                ann["area"] = polygon_area(outlines[k])
            coco["annotations"].append(ann)
    if params.coco:
        names = synthetic_class_names(params.num_classes)
        coco["categories"] = [{"id": cid, "name": n} for cid, n in zip(category_ids, names)]
        (out / f"{split}.json").write_text(json.dumps(coco))


def _labelled_with_outlines(task: str) -> Callable | None:
    """Returns the painter of a task's set when it is labelled with outlines, None for boxes.

    Outlines are shapes and their polygons, or rotated elongated shapes and their oriented boxes' corners.
    A task it cannot label gets a clear error.
    """
    fields = get_task(task).label_fields
    samplers = {(): None, (Polygons,): outlines_sample, (ObbCorners,): oriented_sample}
    if fields not in samplers:
        names = ", ".join(f.name for f in fields)
        raise ValueError(
            f"the synthetic shapes set has no labels for task {task!r} (instance fields {names})"
        )
    return samplers[fields]


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
    """Writes the dataset described in the module docstring and returns the path of its YOLO dataset yaml.

    ``image_size`` is an int or (height, width). With ``coco=True`` the same images are also
    described by ``train.json``/``val.json`` (category ids 1, 3, 5, ...: deliberately not
    contiguous) and ``coco.yaml``. ``task="segment"`` writes the segmentation set instead: rotated
    shapes labelled with their exact outlines (YOLO-seg rows, COCO ``segmentation`` polygons). A folder
    already generated with the same parameters is reused as is (its files, hence label caches, stay
    untouched). A task whose labels carry keypoints gets the pose set (``synthetic.poses``; its COCO
    json is a COCO keypoints json).
    """
    if get_task(task).whole_image:  # one label per image: the classification set (``classes``)
        size = int(image_size) if np.ndim(image_size) == 0 else int(min(image_size))
        return make_classes_dataset(out_dir, num_train, num_val, size, num_classes, seed)
    if Keypoints in get_task(task).label_fields:
        return make_synthetic_pose_dataset(
            out_dir, num_train, num_val, image_size, num_classes, seed, max_objects, min_objects, coco
        )
    outlines_set = _labelled_with_outlines(task)
    names = synthetic_class_names(num_classes)
    height, width = (int(image_size),) * 2 if np.ndim(image_size) == 0 else (int(v) for v in image_size)
    if min(height, width) < 16 or not 0 <= min_objects <= max_objects:
        raise ValueError(f"need image_size >= 16 and 0 <= min_objects <= max_objects, got {image_size}")
    params = ShapeParams(num_train, num_val, height, width, num_classes, seed, max_objects, min_objects, coco)
    # What the folder holds; a set labelled with boxes only (any task without instance fields) names no task.
    marker_params = {**asdict(params), "task": task} if outlines_set is not None else asdict(params)
    out = Path(out_dir)
    marker = out / _MARKER
    yaml_path = out / SYNTHETIC_YAML
    if already_written(out, marker, yaml_path, marker_params, (num_train, num_val)):
        return yaml_path
    out.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)
    category_ids = [2 * k + 1 for k in range(num_classes)]
    for split_index, (split, count) in enumerate(zip(SPLITS, (num_train, num_val))):
        _write_split(out, params, outlines_set, split_index, split, count, category_ids)
    # No `path`: the root is the yaml's folder (here and in the reference), so the folder can move.
    yaml_path.write_text(yaml.safe_dump({"train": "images/train", "val": "images/val", "names": names}))
    if coco:  # no `names`: the class list comes from the json categories
        (out / SYNTHETIC_COCO_YAML).write_text(yaml.safe_dump({"train": "train.json", "val": "val.json"}))
    marker.write_text(json.dumps(marker_params))
    return yaml_path


def make_synthetic_coco(out_dir: str | Path, **kwargs) -> Path:
    """Writes the dataset as make_synthetic_dataset(coco=True) does, but returns the COCO dataset yaml."""
    make_synthetic_dataset(out_dir, coco=True, **kwargs)
    return Path(out_dir) / SYNTHETIC_COCO_YAML
