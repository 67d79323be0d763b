"""COCO json datasets: ``images``, ``annotations`` (bbox = [x, y, w, h] top-left, pixels), ``categories``.

Classes: each category is mapped to the dataset's class of the same name (``names`` in the yaml,
or, without ``names``, the categories sorted by id), so non-contiguous ids such as COCO's 1..90
become 0..79 and a YOLO and a COCO source can share one class list.

Where images are: an image's ``file_name`` is taken relative to the folder named by the yaml
(``{json: ..., images: ...}``); without one, relative to the first of these folders that holds
one of the json's first 20 images: the json's folder, ``images/`` beside the json, the dataset
root, ``<root>/images``. Absolute ``file_name``s are used as they are.

Crowd annotations (``iscrowd: 1``) are skipped (counted, not warned about), as the reference's
trainer does; images without annotations are background. Boxes are normalised by the json's
``width``/``height`` (the frame the annotator saw) when given, else by the decoded size.

``segmentation`` (polygons or RLE, ``annotation_polygon``) becomes the instance's polygon; the box is
always the annotation's ``bbox``. A segmentation that fails its checks is reported and dropped, its
box kept (``DataReport.drop_polygon``).

In a keypoint dataset (``DatasetConfig.options``: K keypoints of x, y, visibility, from the yaml or the
categories' ``keypoints`` names) every annotation's ``keypoints`` ``[x1, y1, v1, ...]`` (pixels, visibility 0, 1
or 2) becomes the instance's keypoints (``ImageRecord.keypoints``), normalised by the frame the boxes are and
checked as a YOLO pose row's (``LabelOptions.annotation_points``: unlabelled ones kept as written); an
annotation whose keypoints are missing, not 3·K numbers, not finite, of another visibility or outside the image is
refused whole. These are the records the YOLO rows the reference's ``convert_coco(use_keypoints=True)`` writes give.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from yolo11_lightning.data.images.io import probe_image
from yolo11_lightning.data.images.limits import DEFAULT_MAX_IMAGE_PIXELS, ImageReadError, ImageTooLargeError
from yolo11_lightning.data.sources.cache import hash_files
from yolo11_lightning.data.sources.checks import DataReport, check_polygon, check_rows
from yolo11_lightning.data.sources.config import DatasetConfig, DatasetError, category_keypoints
from yolo11_lightning.data.sources.label_options import LabelOptions
from yolo11_lightning.data.sources.packed_records import PackedRecords
from yolo11_lightning.data.sources.rle import RLEError, decode_rle, mask_outline
from yolo11_lightning.structures.polygons import merge_parts
from yolo11_lightning.structures.records import ImageRecord

_PROBE_FIRST = 20


def _read_json(json_path: str) -> dict:
    try:
        with open(json_path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise DatasetError(f"{json_path}: cannot read COCO json ({type(e).__name__}: {e})") from e
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise DatasetError(f"{json_path}: not a COCO json (no `images` list)")
    for key in ("annotations", "categories"):
        if not isinstance(data.get(key, []), list):
            raise DatasetError(f"{json_path}: `{key}` must be a list")
    return data


def _category_map(json_path: str, categories: list, names: list[str]) -> dict[int, int]:
    """COCO category id -> contiguous class id, by name."""
    class_of_name: dict[str, int] = {}
    for i, name in enumerate(names):
        class_of_name.setdefault(name, i)
    out, unknown = {}, []
    for cat in categories:
        try:
            cat_id, name = int(cat["id"]), str(cat["name"])
        except (KeyError, TypeError, ValueError) as e:
            raise DatasetError(f"{json_path}: category {cat!r} needs integer `id` and `name`") from e
        if name not in class_of_name:
            unknown.append(name)
        out[cat_id] = class_of_name.get(name, -1)
    if unknown:
        raise DatasetError(
            f"{json_path}: categories {unknown} are not among the dataset's class names {names}; "
            "fix `names` in the dataset yaml (or drop it to take the names from the json)"
        )
    return out


def find_image_dir(json_path: str, file_names: list[str], root: str) -> str | None:
    """The folder ``file_name``s are relative to (module docstring); None when no candidate fits."""
    here = os.path.dirname(json_path)
    candidates = [here, os.path.join(here, "images"), root, os.path.join(root, "images")]
    sample = [f for f in file_names[:_PROBE_FIRST] if not os.path.isabs(f)]
    for folder in candidates:
        if any(os.path.isfile(os.path.join(folder, f)) for f in sample):
            return folder
    return None if sample else here


def _positive_int(value) -> int:
    """A json width/height, or 0 when absent or not a positive number (then the file's size is used)."""
    try:
        return max(int(value), 0)
    except (TypeError, ValueError):
        return 0


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def annotation_polygon(segmentation, size: tuple[int, int]) -> tuple[np.ndarray | None, str | None]:
    """An annotation's ``segmentation`` -> (normalised outline (k, 2) float32, None), or (None, reason).

    ``size`` is the (h, w) frame the pixel coordinates refer to. Polygons (a list of ``[x1, y1, x2, y2,
    ...]`` parts in pixels) are checked part by part (``check_polygon``) and several parts merged into one
    outline (``polygons.merge_parts``). An RLE dict (``counts`` list or compressed string) is decoded and
    its regions' outer outline taken (``rle.mask_outline``); its ``size`` must be the frame's. No or an
    empty ``segmentation``: (None, None), the instance has no polygon.
    """
    h, w = size
    if segmentation is None or (isinstance(segmentation, list) and not segmentation):
        return None, None
    if isinstance(segmentation, dict):
        try:
            mask = decode_rle(segmentation)
        except RLEError as e:
            return None, f"segmentation RLE: {e}"
        if mask.shape != (h, w):
            return None, f"segmentation RLE size {mask.shape[1]}x{mask.shape[0]} is not the image's {w}x{h}"
        outline = mask_outline(mask)
        if not len(outline):
            return None, "segmentation RLE has no region with at least 3 outline points"
        return np.clip(outline / np.array([w, h], np.float32), 0.0, 1.0).astype(np.float32), None
    if not isinstance(segmentation, list):
        return (
            None,
            f"segmentation must be a list of polygons or an RLE dict, got {type(segmentation).__name__}",
        )
    parts = [segmentation] if all(_is_number(v) for v in segmentation) else segmentation
    checked = []
    for k, part in enumerate(parts):
        where = f"segmentation polygon {k}: " if len(parts) > 1 else "segmentation "
        if not isinstance(part, list) or not all(_is_number(v) for v in part):
            return None, f"{where}must be a list of numbers [x1, y1, x2, y2, ...]"
        values = np.asarray(part, np.float64)
        if len(values) % 2 == 0:
            values = (values.reshape(-1, 2) / np.array([w, h], np.float64)).reshape(-1)
        points, why = check_polygon(values)
        if why is not None:
            return None, where + why
        checked.append(points)
    if len(checked) == 1:
        return checked[0], None
    scale = np.array([w, h], np.float32)
    merged = merge_parts([p * scale for p in checked]) / scale
    return np.clip(merged, 0.0, 1.0).astype(np.float32), None


def _box_rows(anns: list[dict], cat_map: dict[int, int], size: tuple[int, int]):
    """Raw rows of one image's annotations: classes, normalised xyxy, coordinate extremes, ids."""
    h, w = size
    classes, boxes, ids = [], [], []
    for ann in anns:
        x, y, bw, bh = ann["_bbox"]
        classes.append(cat_map[ann["_cat"]])
        boxes.append((x / w, y / h, (x + bw) / w, (y + bh) / h))
        ids.append(ann.get("id", "?"))
    xyxy = np.asarray(boxes, np.float64).reshape(-1, 4)
    return np.asarray(classes, np.float64), xyxy, xyxy.min(1), xyxy.max(1), ids


def load_coco_json(
    json_path: str,
    names: list[str],
    root: str,
    report: DataReport,
    image_dir: str | None = None,
    map_fn: Callable[[Callable, Iterable], Iterable] = map,
    max_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
    options: LabelOptions | None = None,
) -> tuple[list[ImageRecord], list[str]]:
    """Records of one COCO json, and the image paths it refers to (their changes invalidate a cache).

    Problems go to ``report`` as ``"<json>: annotation id N: <reason>"`` or ``"<image>: <reason>"``. An
    image above ``max_pixels`` (None or 0: no limit) is skipped from its header, undecoded. ``options``: the
    dataset's label options; with keypoints, K of x, y, visibility are read from every annotation (module
    docstring); DatasetError when the json's categories declare another K or the values per keypoint are not 3.
    """
    options = options or LabelOptions()
    data = _read_json(json_path)
    cat_map = _category_map(json_path, data.get("categories", []), names)
    if options.num_keypoints:
        problem = options.json_problem(category_keypoints(data.get("categories", []), json_path))
        if problem is not None:
            raise DatasetError(f"{json_path}: {problem}")

    images: list[dict] = []
    seen: set = set()
    for i, img in enumerate(data["images"]):
        if not isinstance(img, dict) or "id" not in img or not isinstance(img.get("file_name"), str):
            report.skip_image(f"{json_path}: images[{i}]", "needs `id` and `file_name`")
        elif img["id"] in seen:
            report.skip_image(f"{json_path}: images[{i}]", f"duplicate image id {img['id']}")
        else:
            seen.add(img["id"])
            images.append(img)
    file_names = [img["file_name"] for img in images]
    if image_dir is None:
        image_dir = find_image_dir(json_path, file_names, root)
        if image_dir is None:
            report.note(
                f"{json_path}: none of its first images found beside it, in images/ beside it, in the "
                f"dataset root or <root>/images; name the folder in the yaml: {{json: ..., images: <folder>}}"
            )
            image_dir = os.path.dirname(json_path)
    paths = [os.path.normpath(os.path.join(image_dir, f)) for f in file_names]

    anns_of: dict = {img["id"]: [] for img in images}
    for i, ann in enumerate(data.get("annotations", [])):
        where = f"{json_path}: annotation id {ann.get('id', f'[{i}]') if isinstance(ann, dict) else f'[{i}]'}"
        if not isinstance(ann, dict):
            report.skip_row(where, "not an object")
            continue
        if ann.get("iscrowd", 0):
            report.num_crowd += 1
            continue
        if ann.get("image_id") not in anns_of:
            report.skip_row(where, f"unknown image_id {ann.get('image_id')!r}")
            continue
        if ann.get("category_id") not in cat_map:
            report.skip_row(where, f"unknown category_id {ann.get('category_id')!r}")
            continue
        bbox = ann.get("bbox")
        try:
            bbox = [float(v) for v in bbox]
            if len(bbox) != 4:
                raise ValueError
        except (TypeError, ValueError):
            report.skip_row(where, f"bbox must be 4 numbers [x, y, w, h], got {bbox!r}")
            continue
        anns_of[ann["image_id"]].append(
            {
                "id": ann.get("id", f"[{i}]"),
                "_bbox": bbox,
                "_cat": ann["category_id"],
                "_seg": ann.get("segmentation"),
                "_kpts": ann.get("keypoints"),
            }
        )

    def probe(path: str):
        try:
            return probe_image(path, max_pixels)
        except ImageReadError as e:
            return e

    records = []
    for img, path, probed in zip(images, paths, map_fn(probe, paths)):
        if isinstance(probed, ImageReadError):
            report.skip_image(path, probed.reason, isinstance(probed, ImageTooLargeError))
            continue
        json_size = (_positive_int(img.get("height")), _positive_int(img.get("width")))
        if min(json_size) > 0 and json_size != probed:
            if json_size[::-1] == probed:
                report.skip_image(
                    path,
                    f"json size {json_size[1]}x{json_size[0]} is the image's rotated size "
                    f"{probed[1]}x{probed[0]} (EXIF orientation?): boxes cannot be placed reliably",
                )
                continue
            report.note(
                f"{path}: json size {json_size[1]}x{json_size[0]} != file size {probed[1]}x{probed[0]}; "
                "boxes scaled to the file"
            )
        frame = json_size if min(json_size) > 0 else probed
        anns, keypoints = anns_of[img["id"]], []
        if options.num_keypoints:  # a row with bad keypoints is refused before its box is checked
            usable = []
            for ann in anns:
                points, why = options.annotation_points(ann["_kpts"], frame)
                if why is not None:
                    report.skip_row(f"{json_path}: annotation id {ann['id']}", why)
                    continue
                usable.append(ann)
                keypoints.append(points)
            anns = usable
        classes, xyxy, lo, hi, ids = _box_rows(anns, cat_map, frame)
        checked = check_rows(classes, xyxy, lo, hi, len(names), [f"annotation id {a}" for a in ids])
        for i, why in checked.rejected:
            report.skip_row(f"{json_path}: annotation id {ids[i]}", why)
        polygons = []
        for i in checked.kept:
            points, why = annotation_polygon(anns[i]["_seg"], frame)
            if why is not None:
                report.drop_polygon(f"{json_path}: annotation id {ids[i]}", why)
            polygons.append(np.zeros((0, 2), np.float32) if points is None else points)
        sizes = np.array([len(p) for p in polygons], np.int64)
        report.num_clipped_rows += checked.num_clipped
        report.add_image(len(checked.classes), int((sizes > 0).sum()))
        segments = np.concatenate([*polygons, np.zeros((0, 2), np.float32)])
        kept_points = None
        if options.num_keypoints:
            kept_points = np.zeros((len(checked.kept), options.num_keypoints, 3), np.float32)
            for j, i in enumerate(checked.kept):
                kept_points[j] = keypoints[i]
        records.append(
            ImageRecord(
                path, probed[0], probed[1], checked.classes, checked.boxes, segments, sizes, kept_points
            )
        )
    return records, paths


@dataclass
class CocoEntry:
    """A COCO json file of a split (``SplitEntry``); its images are listed when it is parsed."""

    path: str

    def has_images(self) -> bool:
        return True  # known once parsed

    def fingerprint(self, h, image_dir: str) -> None:
        # "True": the entry-kind tag of the cache key since its first version (see ``YoloEntry``).
        h.update(f"{self.path}\0True\0{image_dir}\n".encode())
        hash_files([self.path], h)  # the images it names are the parse's extra files (``save_cache``)

    def cache_path(self, split: str) -> Path:
        return Path(self.path).with_name(f"{Path(self.path).stem}.{split}.cache.npz")

    def parse(
        self, config: DatasetConfig, split: str, report: DataReport, workers: int, max_pixels: int | None
    ) -> tuple[PackedRecords, list[str]]:
        # Threads: the per-image work is the image check (OpenCV decodes release the GIL); the json is one file.
        image_dir = config.image_dirs.get(self.path)
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="check-data") as pool:
            records, deps = load_coco_json(
                self.path, config.names, str(config.root), report, image_dir, pool.map, max_pixels,
                config.options,
            )  # fmt: skip
        return PackedRecords(records), deps


def open_entry(path: str, seen: set[str]) -> CocoEntry | None:
    """A ``.json`` entry is a COCO file; anything else is not this format's."""
    return CocoEntry(path) if path.lower().endswith(".json") else None
