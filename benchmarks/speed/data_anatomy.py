"""Where a training sample's time goes: decode, resize, mosaic, warp, labels, HSV, flips, tensor, collate.

Ours beside the reference's YOLODataset on the files of ``data_speed.py`` (mosaic on, the reference's
default augmentation, one thread). Each stage is timed by wrapping the function that does it, exclusive of
the stages it calls, so the stages add up to the measured total; "other" is what no wrapper covers
(Python glue, generators, partner choice). Milliseconds per sample, summed over ``--batches`` batches and
``--rounds`` alternating rounds (median per stage over rounds).

    python benchmarks/speed/data_anatomy.py                    # 640, ~1 min
    python benchmarks/speed/data_anatomy.py --image-size 320

The reference package (ultralytics, AGPL) is only imported here, as an oracle.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import cv2
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers (_common, ...)
os.environ.setdefault("YOLO_OFFLINE", "1")

import _common as C
from _coco_like import make_dataset

from yolo11_lightning.data.sampling.sampler import ElasticDistributedSampler

STAGES = [
    "decode",
    "resize to long side",
    "mosaic placement",
    "affine warp",
    "label transforms",
    "HSV",
    "flips",
    "to tensor / format",
    "collate",
    "other",
]


class StageTimer:
    """Accumulates exclusive wall time per stage of wrapped functions (nested calls are subtracted)."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self._stack: list[float] = []

    def wrap(self, owner: object, name: str, stage: str) -> None:
        """Replace ``owner.name`` by a timed version charging its exclusive time to ``stage``."""
        fn = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            self._stack.append(0.0)
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                children = self._stack.pop()
                self.totals[stage] += elapsed - children
                if self._stack:
                    self._stack[-1] += elapsed

        setattr(owner, name, timed)

    def reset(self) -> None:
        self.totals.clear()


def ours_pipeline(records, size: int, batch: int, timer: StageTimer) -> Callable[[list], int]:
    """Our dataset with timed stages; returns fetch(keys) -> number of images."""
    import yolo11_lightning.data.augment.pipeline as augment
    import yolo11_lightning.data.augment.transforms as transforms
    import yolo11_lightning.data.dataset as dataset
    import yolo11_lightning.data.images.loading as image_loading

    for owner, name, stage in [
        (image_loading, "read_image_retrying", "decode"),
        (dataset, "read_image_retrying", "decode"),
        (dataset, "read_image_reduced", "decode"),
        (image_loading, "resize_long_side", "resize to long side"),
        (dataset, "resize_long_side", "resize to long side"),
        (augment, "mosaic4", "mosaic placement"),  # before warp_tiles: the whole canvas
        (transforms, "place_tiles", "mosaic placement"),
        (transforms, "warp_image", "affine warp"),
        (augment, "warp_tiles", "affine warp"),
        (augment, "random_affine_matrix", "label transforms"),
        (augment, "apply_affine", "label transforms"),
        (augment, "tile_boxes", "label transforms"),
        (augment, "affine_boxes", "label transforms"),
        (image_loading, "xywhn_to_xyxy", "label transforms"),
        (dataset, "xywhn_to_xyxy", "label transforms"),
        (dataset, "xyxy_to_xywhn", "label transforms"),
        (augment, "augment_hsv", "HSV"),
        (augment, "flip_lr", "flips"),
        (augment, "flip_ud", "flips"),
        (dataset, "image_tensor", "to tensor / format"),
        (dataset, "collate_detection", "collate"),
    ]:
        if hasattr(
            owner, name
        ):  # the names of this version of the pipeline (the script times earlier ones too)
            timer.wrap(owner, name, stage)
    ds = dataset.BoxDataset(records, size, augment=True, seed=0, global_batch_size=batch)
    return lambda keys: len(dataset.collate_detection([ds[k] for k in keys])["indices"])


def reference_pipeline(root: Path, size: int, batch: int, timer: StageTimer) -> Callable[[list], int]:
    """The reference's training dataset with timed stages."""
    import ultralytics.data.augment as A
    import ultralytics.data.base as B
    from ultralytics.cfg import get_cfg
    from ultralytics.data.build import build_yolo_dataset
    from ultralytics.data.dataset import YOLODataset

    cfg = get_cfg(overrides={"imgsz": size})
    data = {"names": {i: str(i) for i in range(80)}, "nc": 80, "channels": 3}
    ds = build_yolo_dataset(cfg, str(root / "images" / "train"), batch, data, mode="train")
    cv2.setNumThreads(1)  # ultralytics sets 0 on import; keep both sides identical
    for owner, name, stage in [
        (B, "imread", "decode"),
        (B.BaseDataset, "load_image", "resize to long side"),
        (A.Mosaic, "_mosaic4", "mosaic placement"),
        (A.RandomPerspective, "affine_transform", "affine warp"),
        (A.RandomPerspective, "__call__", "label transforms"),
        (B.BaseDataset, "get_image_and_label", "label transforms"),
        (A.RandomHSV, "__call__", "HSV"),
        (A.RandomFlip, "__call__", "flips"),
        (A.Format, "__call__", "to tensor / format"),
        (YOLODataset, "collate_fn", "collate"),
    ]:
        timer.wrap(owner, name, stage)
    return lambda keys: len(YOLODataset.collate_fn([ds[k] for k in keys])["im_file"])


def main() -> None:
    parser = C.parser(__doc__)
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--image-size", type=int, default=640)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--batches", type=int, default=4, help="batches per round and side")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(C.default_workdir()) / "data_speed")
    args = parser.parse_args()
    cv2.setNumThreads(1)
    torch.set_num_threads(1)
    C.print_machine_info()
    records = make_dataset(args.out, args.images)
    for r in records:  # warm the page cache: we time decoding, not the disk
        Path(r.path).read_bytes()
    size, batch = args.image_size, args.batch
    timers = {"ours": StageTimer(), "reference": StageTimer()}
    fetch = {"ours": ours_pipeline(records, size, batch, timers["ours"])}
    try:
        fetch["reference"] = reference_pipeline(args.out, size, batch, timers["reference"])
    except ImportError:
        print("ultralytics not installed: ours only")
    # Our sampler's batches (the mosaic partner pools follow them); the reference reads the same indices.
    sampler = ElasticDistributedSampler(range(len(records)), batch, num_replicas=1, rank=0, seed=0)
    keys: list = []
    while len(keys) < args.rounds * args.batches * batch:
        sampler.set_epoch(sampler.epoch + 1 if keys else 0)
        keys += list(sampler)
    ms: dict[str, dict[str, list[float]]] = {side: defaultdict(list) for side in fetch}
    for r in range(args.rounds):
        for side, fn in fetch.items():
            timers[side].reset()
            start = time.perf_counter()
            n = 0
            for b in range(args.batches):
                chunk = keys[(r * args.batches + b) * batch : (r * args.batches + b + 1) * batch]
                n += fn(chunk if side == "ours" else [i for _, i in chunk])
            total = (time.perf_counter() - start) * 1000 / n
            per = {stage: t * 1000 / n for stage, t in timers[side].totals.items()}
            per["other"] = total - sum(per.values())
            for stage in STAGES:
                ms[side][stage].append(per.get(stage, 0.0))
            ms[side]["total"].append(total)
    caption = (
        f"{args.images} JPEGs (COCO-like sizes), {size} px, mosaic on, batch {batch}; ms per sample, "
        f"median of {args.rounds} rounds x {args.batches} batches; load {C.load_average()}"
    )
    med = {side: {k: statistics.median(v) for k, v in d.items()} for side, d in ms.items()}
    header = ["stage", "ours ms", "share"] + (
        ["reference ms", "share", "ours/ref"] if "reference" in med else []
    )
    rows = []
    for stage in [*STAGES, "total"]:
        o = med["ours"][stage]
        row = [stage, f"{o:.2f}", f"{100 * o / med['ours']['total']:.0f}%"]
        if "reference" in med:
            t = med["reference"][stage]
            row += [
                f"{t:.2f}",
                f"{100 * t / med['reference']['total']:.0f}%",
                f"{o / t:.2f}" if t > 0.005 else "-",
            ]
        rows.append(row)
    ips = [f"{1000 / med['ours']['total']:.1f}", ""]
    if "reference" in med:
        ips += [
            f"{1000 / med['reference']['total']:.1f}",
            "",
            f"{med['reference']['total'] / med['ours']['total']:.2f}",
        ]
    rows.append(["**img/s**", *ips])
    C.print_table(caption, header, rows)


if __name__ == "__main__":
    main()
