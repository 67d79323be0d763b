"""The ``yolo11-lightning synthetic`` command: write a synthetic dataset folder (the shapes set or the hard set).

``synthetic.shapes`` writes the shapes set (boxes, or outlines for a segmentation task), ``synthetic.hard``
the harder detection set.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from yolo11_lightning.synthetic.hard import make_hard_synthetic_dataset
from yolo11_lightning.synthetic.painter import SYNTHETIC_CLASS_NAMES
from yolo11_lightning.synthetic.shapes import SYNTHETIC_COCO_YAML, make_synthetic_dataset
from yolo11_lightning.tasks import DEFAULT_TASK, TASKS, get_task


def main(argv: Sequence[str] | None = None) -> int:
    """Runs yolo11-lightning synthetic --out DIR [--hard] [--train N --val N --size S --seed S ...]."""
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
        "--task", choices=list(TASKS), default=DEFAULT_TASK,
        help="segment: shapes labelled with their exact polygons (YOLO-seg rows; COCO segmentation); pose: "
        "figures of 5 keypoints, some occluded or unlabelled (YOLO pose rows, a yaml that declares the keypoints "
        "and their flip; --coco: COCO keypoints json); obb: "
        "rotated elongated shapes labelled with their oriented boxes' corners; classify: one shape per image, "
        "in class folders (synthetic.classes)",
    )  # fmt: skip
    p.add_argument(
        "--hard", action="store_true",
        help="the harder set of yolo11_lightning.synthetic.hard (5 look-alike classes, clutter, "
        "overlaps; --classes and --coco do not apply)",
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.size is not None and len(args.size) not in (1, 2):
        p.error("--size takes S or H W")
    if args.hard and args.coco:
        p.error("--coco is not available with --hard")
    if (args.hard or args.coco) and get_task(args.task).whole_image:
        p.error(f"--task {args.task} writes class folders: --hard and --coco do not apply")
    if args.hard and get_task(args.task).label_fields:
        p.error(f"--task {args.task} is not available with --hard (it is labelled with boxes only)")
    sizes = args.size or ([192, 256] if args.hard else [128])
    size = sizes[0] if len(sizes) == 1 else (sizes[0], sizes[1])
    try:
        if args.hard:
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
