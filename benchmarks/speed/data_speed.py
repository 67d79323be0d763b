"""Data pipeline speed: our BoxDataset beside the reference's YOLODataset, same files, same run.

Measures images per second of ONE DataLoader worker (loading + augmentation + collate; total throughput
is this times the workers, while CPU cores last). Rows:
  * train, 1 device:          mosaic on, 640, reference default augmentation, global batch = 16;
  * train, 1 of 8 devices:    the same seen by one rank's worker when 8 devices share a global batch of
                              128 (mosaic partners come from that rank's own batch, see partner_pool);
  * train, partners anywhere: mosaic partners drawn from the whole dataset (``mosaic_partners
                              dataset``, the default: up to 4 decodes per sample), to show what the
                              partner pools buy;
  * train, recent partners:   ``mosaic_partners recent``: pools over the batch and 3 earlier ones 8 apart,
                              which one worker has decoded (its decode cache holds them);
  * val:                      letterbox to 640, no augmentation.
The reference's worker does the same work whatever the device count (its mosaic partners come from a
buffer of images it loaded recently), so its one train figure is the baseline of every train row.
Rounds alternate between the pipelines so machine noise hits both alike; the table shows medians.

    python benchmarks/speed/data_speed.py                  # 300 generated JPEGs, well under 2 minutes
    python benchmarks/speed/data_speed.py --images 500 --rounds 5

The reference package (ultralytics, AGPL) is only imported here, as an oracle; it is optional.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers (_common, ...)
os.environ.setdefault("YOLO_OFFLINE", "1")

import _common as C
from _coco_like import make_dataset

from yolo11_lightning.data.augment.pipeline import AugmentConfig
from yolo11_lightning.data.dataset import BoxDataset
from yolo11_lightning.data.sampling.partner_pools import RECENT_BATCHES
from yolo11_lightning.data.sampling.sampler import ElasticDistributedSampler
from yolo11_lightning.structures.batch import collate_detection


def time_batches(fetch, batches: list[list]) -> float:
    """Images per second over ``batches`` (lists of dataset keys)."""
    start = time.perf_counter()
    n = 0
    for keys in batches:
        n += len(fetch(keys))
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = C.parser(__doc__)
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--image-size", type=int, default=640)
    parser.add_argument("--batch", type=int, default=16, help="per-device batch")
    parser.add_argument("--train-batches", type=int, default=6, help="batches per round for training")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None, help="dataset folder (default: a temp dir)")
    parser.add_argument(
        "--world-size", type=int, default=8, help="also time a worker of one of this many devices"
    )
    args = parser.parse_args()

    cv2.setNumThreads(1)  # one DataLoader worker = one core; the reference sets the same on import
    torch.set_num_threads(1)
    C.print_machine_info()
    tmp = None
    if args.out is None:
        tmp = tempfile.TemporaryDirectory()
        args.out = Path(tmp.name)
    records = make_dataset(args.out, args.images)
    for r in records:  # warm the page cache: we time decoding, not the disk
        Path(r.path).read_bytes()
    size, batch = args.image_size, args.batch

    def train_keys(world: int, num_batches: int) -> list[list]:
        """Rank 0's first per-device batches over epochs 0, 1, ... for ``world`` devices."""
        sampler = ElasticDistributedSampler(
            range(len(records)), batch * world, num_replicas=world, rank=0, seed=0
        )
        keys: list = []
        while len(keys) < num_batches * batch:
            sampler.set_epoch(sampler.epoch + 1 if keys else 0)
            keys += list(sampler)
        return [keys[i : i + batch] for i in range(0, num_batches * batch, batch)]

    def train_set(global_batch: int | None, partner_batches: int = 1) -> BoxDataset:
        return BoxDataset(
            records, size, augment=True, aug=AugmentConfig(), seed=0, global_batch_size=global_batch,
            partner_batches=partner_batches,
        )  # fmt: skip

    num_batches = args.train_batches * args.rounds
    world = args.world_size
    ours_train = {  # row -> (dataset, batches)
        "train, 1 device": (train_set(batch), train_keys(1, num_batches)),
        f"train, 1 of {world} devices": (train_set(batch * world), train_keys(world, num_batches)),
        "train, partners anywhere": (train_set(None), train_keys(1, num_batches)),
        "train, recent partners": (train_set(batch, RECENT_BATCHES), train_keys(1, num_batches)),
    }
    ours_val = BoxDataset(records, size, augment=False)
    val_keys = list(range(len(records)))
    val_batches = [val_keys[i : i + batch] for i in range(0, len(val_keys), batch)]

    ref = None
    try:
        from ultralytics.cfg import get_cfg
        from ultralytics.data.build import build_yolo_dataset

        cfg = get_cfg(overrides={"imgsz": size})
        data = {"names": {i: str(i) for i in range(80)}, "nc": 80, "channels": 3}
        img_dir = str(args.out / "images" / "train")
        ref_train = build_yolo_dataset(cfg, img_dir, batch, data, mode="train")
        ref_val = build_yolo_dataset(cfg, img_dir, batch, data, mode="val", rect=False)
        cv2.setNumThreads(1)  # ultralytics sets 0 on import; keep both sides identical
        perm = np.random.default_rng(0).permutation(len(records)).tolist()
        train_ref = [perm[i : i + batch] for i in range(0, len(perm), batch)]
        ref = (ref_train, ref_val, train_ref, type(ref_train).collate_fn)
    except ImportError:
        print("ultralytics not installed: measuring ours only")

    def ours(ds):
        return lambda ks: collate_detection([ds[k] for k in ks])["indices"]

    def theirs(ds, collate):
        return lambda ks: collate([ds[k] for k in ks])["im_file"]

    rows = [*ours_train, "val"]
    results: dict[str, list[float]] = {f"{row} {side}": [] for row in rows for side in ("ours", "ref")}
    per_round = args.train_batches
    for r in range(args.rounds):
        chunk = slice(r * per_round, (r + 1) * per_round)
        for row, (dataset, batches) in ours_train.items():
            results[f"{row} ours"].append(time_batches(ours(dataset), batches[chunk]))
        results["val ours"].append(time_batches(ours(ours_val), val_batches))
        if ref is not None:
            ref_train, ref_val, train_ref, collate = ref
            start = (r * per_round) % len(train_ref)
            results["train, 1 device ref"].append(
                time_batches(theirs(ref_train, collate), train_ref[start : start + per_round])
            )
            results["val ref"].append(time_batches(theirs(ref_val, collate), val_batches))
    for row in ours_train:  # a reference worker does the same work whatever the device count
        results[f"{row} ref"] = results["train, 1 device ref"]

    print(
        f"\n{args.images} JPEGs (COCO-like sizes), image size {size}, {batch} images per device and batch; "
        f"images/s of ONE worker, median of {args.rounds} rounds"
    )
    print(f"{'pipeline':<28}{'ours':>8}{'reference':>11}{'ratio':>7}")
    for row in rows:
        o = statistics.median(results[f"{row} ours"])
        if results[f"{row} ref"]:
            t = statistics.median(results[f"{row} ref"])
            print(f"{row:<28}{o:>8.1f}{t:>11.1f}{o / t:>7.2f}")
        else:
            print(f"{row:<28}{o:>8.1f}{'-':>11}{'-':>7}")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
