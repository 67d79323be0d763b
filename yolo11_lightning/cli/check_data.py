"""``yolo11-lightning check-data --dataset PATH [--out DIR]``: check a dataset before training on it.

Prints every warning (skipped images and label rows, with file, line and reason) and a summary
per split in the task's words (``--task``, else the task the dataset's files say, else detection: a
classification dataset counts class labels, not boxes), writes label statistics (``<split>_classes.png``, and
``<split>_boxes.png`` for a task of boxes) and a preview
of augmented training samples with their boxes (``train_preview.png``, the training pipeline's
own ``BoxDataset``) plus letterboxed validation samples (``val_preview.png``, with the polygons
of a segmentation dataset outlined in white). Bad polygons are reported like bad rows: file and line
(or json and annotation id) and the reason; a polygon whose box is usable keeps the box. An image above
``--max_image_pixels`` (default the reference's 178,956,970; 0: no limit) is refused from its header, never
decoded, and reported with its size (a decompression bomb: a 100 KB PNG can decode to gigabytes).

Exit status: 0 when the dataset can be trained on, even with warnings; 1 when it cannot (bad yaml,
a missing ``train``/``val`` split, a split without a usable image, a split the task cannot use:
``Task.check_split``, e.g. a ``val`` without labels or a one-class classification root); 2 for bad arguments. Rows
the task's reading drops (an oriented box of degenerate corners) are named as bad rows are.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np

from yolo11_lightning.data.images.limits import DEFAULT_MAX_IMAGE_PIXELS
from yolo11_lightning.data.shards.reader import ShardImages, load_shard_split, open_index
from yolo11_lightning.data.sources.config import DatasetConfig, DatasetError
from yolo11_lightning.data.sources.split import dataset_config, load_split, split_name
from yolo11_lightning.data.sources.task_hint import dataset_task
from yolo11_lightning.plots.drawing import draw_boxes, image_grid, save_rgb
from yolo11_lightning.plots.labels import box_scatter, class_histogram
from yolo11_lightning.structures.polygons import letterbox_polygons, to_pixels
from yolo11_lightning.structures.records import ImageRecord
from yolo11_lightning.tasks import DEFAULT_TASK, TASKS, get_task

REQUIRED_SPLITS = ("train", "val")
PREVIEW_TILE = 320  # preview tiles are shrunk to this side so a 16-image grid stays small


def _write_statistics(
    records: list[ImageRecord], names: list[str], split: str, out: Path, task: str = DEFAULT_TASK
) -> list[Path]:
    """The class histogram of a split (in the words of ``task``) and, for a task of boxes, their sizes and
    centres (a whole-image label's box is the image)."""
    spec = get_task(task)
    classes = np.concatenate([r.classes for r in records] + [np.zeros(0, np.int64)])
    boxes = np.concatenate([r.boxes for r in records] + [np.zeros((0, 4), np.float32)])
    counts = np.bincount(classes, minlength=len(names))
    paths = [out / f"{split}_classes.png"]
    title = f"{split}: {spec.label_noun} per class ({len(records)} images)"
    save_rgb(str(paths[0]), class_histogram(counts, names, title))
    if not spec.whole_image:
        paths.append(out / f"{split}_boxes.png")
        save_rgb(str(paths[1]), box_scatter(boxes, classes, f"{split}: {len(boxes)} boxes, size and centre"))
    return paths


def _draw_polygons(
    tile: np.ndarray, record: ImageRecord, scale: float, pad: tuple[float, float]
) -> np.ndarray:
    """Outline (white, 1 px) a record's polygons on its letterboxed image (H, W, 3) uint8 RGB."""
    outlines = [
        np.round(letterbox_polygons(p, scale, pad)).astype(np.int32)
        for p in to_pixels(record.polygons, record.width, record.height)
        if len(p)
    ]
    tile = np.ascontiguousarray(tile)
    cv2.polylines(tile, outlines, isClosed=True, color=(255, 255, 255), thickness=1)
    return tile


def _preview(
    records: list[ImageRecord],
    names: list[str],
    path: Path,
    image_size: int,
    count: int,
    augment: bool,
    seed: int,
    max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
    image_bytes: ShardImages | None = None,
) -> Path:
    """A grid of ``count`` samples as the model sees them (augmented or letterboxed), boxes drawn (``image_bytes``:
    a shard folder's images)."""
    from yolo11_lightning.data.dataset import BoxDataset

    dataset = BoxDataset(
        records, image_size=image_size, augment=augment, seed=seed, max_image_pixels=max_image_pixels,
        image_bytes=image_bytes,
    )  # fmt: skip
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(records), size=min(count, len(records)), replace=False)
    tiles = []
    for index in picks:
        sample = dataset[(0, int(index))]
        image = sample["image"].permute(1, 2, 0).numpy()
        labels = sample["labels"].numpy()
        h, w = image.shape[:2]
        cx, cy, bw, bh = labels[:, 1] * w, labels[:, 2] * h, labels[:, 3] * w, labels[:, 4] * h
        xyxy = np.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], 1)
        tile = draw_boxes(image, xyxy, labels[:, 0], names=names, thickness=max(1, image_size // 320))
        if not augment and records[index].num_polygons:
            tile = _draw_polygons(tile, records[index], sample["scale"], sample["pad"])
        if max(h, w) > PREVIEW_TILE:
            tile = cv2.resize(tile, (PREVIEW_TILE, PREVIEW_TILE * h // w), interpolation=cv2.INTER_AREA)
        tiles.append(tile)
    save_rgb(str(path), image_grid(tiles, columns=4))
    return path


def check_dataset(
    config: DatasetConfig,
    out: Path | None,
    image_size: int,
    samples: int,
    seed: int,
    use_cache: bool,
    max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
    task: str = DEFAULT_TASK,
) -> bool:
    """Print the report of every split, write the pictures; True when the dataset is usable.

    ``max_image_pixels``: larger images are refused from their headers (None or 0: no limit); ``task``: whose
    label rules apply beyond the formats' own (``Task.label_problems``: an oriented box's four corners).
    """
    usable = True
    loaded: dict[str, list[ImageRecord]] = {}
    images: dict[str, ShardImages] = {}  # a shard folder's split -> its images
    spec = get_task(task)
    config = dataclasses.replace(config, outline_labels=spec.outline_labels)
    for split in REQUIRED_SPLITS:
        if not config.splits.get(split):
            print(f"error: {config.source}: required split `{split}` is not defined", file=sys.stderr)
            usable = False
    for split in config.splits:
        print(f"--- {split}")
        try:
            records, report = load_split(
                config, split, use_cache=use_cache, verbose=False, max_image_pixels=max_image_pixels
            )
        except DatasetError as e:
            print(f"error: {e}", file=sys.stderr)
            usable = False
            continue
        if config.shards is not None:
            images[split] = load_shard_split(open_index(config.shards), split)[1]
        refusal = spec.check_split(records, config.names, evaluated=split != "train")
        for line in report.warnings + spec.label_problems(records):
            print(f"warning: {line}")
        summary = report.summary(spec.label_noun, background=not spec.whole_image)
        print(summary + (f"  (cache: {report.cache_path})" if report.cache_path else ""))
        if refusal is not None:
            print(f"error: {split_name(config, split)}: {refusal}", file=sys.stderr)
            usable = False
            continue
        loaded[split] = records
    if out is None:
        return usable
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for split, records in loaded.items():
        written += _write_statistics(records, config.names, split, out, task)
    if "train" in loaded:
        written.append(
            _preview(
                loaded["train"],
                config.names,
                out / "train_preview.png",
                image_size,
                samples,
                True,
                seed,
                max_image_pixels,
                images.get("train"),
            )
        )
    if "val" in loaded:
        written.append(
            _preview(
                loaded["val"],
                config.names,
                out / "val_preview.png",
                image_size,
                samples,
                False,
                seed,
                max_image_pixels,
                images.get("val"),
            )
        )
    print("wrote " + ", ".join(str(p) for p in written))
    return usable


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="yolo11-lightning check-data", description=__doc__.split("\n")[0])
    p.add_argument("--dataset", required=True, help="dataset yaml")
    p.add_argument("--out", default=None, help="folder for the PNGs (default: runs/check-data/<yaml name>)")
    p.add_argument("--imgsz", type=int, default=640, help="training image size of the preview")
    p.add_argument("--samples", type=int, default=16, help="images per preview")
    p.add_argument("--seed", type=int, default=0, help="augmentation seed of the preview")
    p.add_argument(
        "--no-cache", action="store_true", help="check everything again; neither read nor write a cache"
    )
    p.add_argument("--no-images", action="store_true", help="only print the report")
    p.add_argument(
        "--task", choices=list(TASKS), default=None,
        help="also check the rows against this task's rules (obb: four corners, no repeated ones, an area, no "
        "crossing sides) and report in its words; default: the task the dataset's files say (an ImageFolder "
        "root: classify; a yaml that declares keypoints: pose), else detect",
    )  # fmt: skip
    p.add_argument(
        "--max_image_pixels",
        "--max-image-pixels",
        dest="max_image_pixels",
        type=int,
        default=DEFAULT_MAX_IMAGE_PIXELS,
        help="refuse images of more pixels from their headers, undecoded (decompression bombs; default "
        f"{DEFAULT_MAX_IMAGE_PIXELS}, the reference's; 0: no limit)",
    )
    args = p.parse_args(argv)
    if args.max_image_pixels < 0:
        p.error(f"--max_image_pixels must be >= 0 (0: no limit), got {args.max_image_pixels}")
    try:
        config = dataset_config(args.dataset)
    except DatasetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    out = None if args.no_images else Path(args.out or Path("runs") / "check-data" / Path(args.dataset).stem)
    hint = dataset_task(args.dataset) if args.task is None else None
    task = args.task or (hint.task if hint is not None else DEFAULT_TASK)
    usable = check_dataset(
        config, out, args.imgsz, args.samples, args.seed, not args.no_cache, args.max_image_pixels, task
    )
    if not usable:
        print(
            f"error: {config.source}: the dataset cannot be trained on (see the errors above)",
            file=sys.stderr,
        )
    return 0 if usable else 1
