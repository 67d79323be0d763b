"""``yolo11-lightning shard --data PATH --out FOLDER_OR_URL [--shard-size MB]``: a dataset as shards.

Every split of the dataset (a dataset yaml of YOLO txt or COCO json entries, or an ImageFolder root) is checked
as a fit would check it and written as WebDataset tar shards of the images' original bytes, a ``wids`` index
per split and the split's label records (``data.shards.writer``). ``--out`` is a folder or an fsspec url
(``s3://bucket/prefix``; credentials from the store's usual environment and config). The task (``--task``, else
the one the dataset's files say, else detect) decides how the labels are read (an obb dataset drops degenerate
corners) and is recorded in the index.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence

from yolo11_lightning.data.images.limits import DEFAULT_MAX_IMAGE_PIXELS
from yolo11_lightning.data.shards.writer import DEFAULT_SHARD_MB, write_shards
from yolo11_lightning.data.sources.split import dataset_config
from yolo11_lightning.data.sources.task_hint import dataset_task
from yolo11_lightning.tasks import DEFAULT_TASK, TASKS, get_task


def main(argv: Sequence[str] | None = None) -> int:
    """Convert, then print one line per split (samples, shards, bytes, skipped images)."""
    p = argparse.ArgumentParser(prog="yolo11-lightning shard", description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="dataset yaml, or an ImageFolder root")
    p.add_argument("--out", required=True, help="output folder or fsspec url (s3://bucket/prefix)")
    p.add_argument(
        "--shard-size", "--shard_size", dest="shard_mb", type=float, default=DEFAULT_SHARD_MB,
        help=f"MB per tar shard (default {DEFAULT_SHARD_MB})",
    )  # fmt: skip
    p.add_argument(
        "--task", choices=list(TASKS), default=None,
        help="the task the labels are read for; default: the one the dataset's files say, else detect",
    )  # fmt: skip
    p.add_argument(
        "--max_image_pixels", "--max-image-pixels", dest="max_image_pixels", type=int,
        default=DEFAULT_MAX_IMAGE_PIXELS, help="skip images of more pixels, as a fit does (0: no limit)",
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.shard_mb <= 0:
        p.error(f"--shard-size must be positive, got {args.shard_mb}")
    hint = dataset_task(args.data)
    task = args.task or (hint.task if hint is not None else DEFAULT_TASK)
    config = dataclasses.replace(dataset_config(args.data), outline_labels=get_task(task).outline_labels)
    claim = None if hint is None else (hint.task, hint.evidence)
    written = write_shards(
        config, args.out, task, args.shard_mb, max_image_pixels=args.max_image_pixels, claim=claim
    )
    for s in written:
        print(
            f"{s.split}: {s.samples} samples in {s.shards} shards, {s.bytes} bytes, {s.skipped} images skipped"
        )
    print(f"wrote {args.out.rstrip('/')}/index.json ({task})")
    return 0
