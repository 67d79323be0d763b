"""Keypoint augmentation statistics, ours beside the oracle's pose dataset, on the same images and settings.

    python benchmarks/parity/augment_stats_pose.py --samples 3000 --image-size 128

The synthetic pose set (``synthetic.poses``: upright figures, head / left and right hands / left and right
feet, ``flip_idx`` [0, 2, 1, 4, 3]) read by each side's training dataset with its defaults (mosaic 1.0, scale
0.5, translate 0.1, fliplr 0.5 with ``flip_idx``; the oracle: its default configuration with imgsz and task pose)
in a shuffled order over several epochs. Reported beside ``augment_stats.py``'s box figures: keypoint visibility
shares (0: unlabelled or pushed out of the image, 1, 2), labelled keypoints per instance, labelled keypoint x / y
quantiles, keypoint distance to its box centre over the box diagonal, and the share of instances whose left hand
lies left of their right hand (both labelled): a flip that forgot to swap them would halve it.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers (_common, ...)

import _common as C
import numpy as np
from augment_stats import _accumulate, _order


def _keypoint_summary(items: list[tuple[np.ndarray, np.ndarray]]) -> dict:
    visibility, per_instance, xs, ys, spread, left_first = [], [], [], [], [], []
    for boxes, points in items:  # boxes (n, 4) xywh normalised, points (n, K, 3) x, y normalised + visibility
        if not len(points):
            continue
        v = points[..., 2]
        visibility += v.reshape(-1).tolist()
        labelled = v > 0
        per_instance += labelled.sum(1).tolist()
        xs += points[..., 0][labelled].tolist()
        ys += points[..., 1][labelled].tolist()
        diagonal = np.hypot(boxes[:, 2], boxes[:, 3])[:, None]
        distance = np.hypot(points[..., 0] - boxes[:, :1], points[..., 1] - boxes[:, 1:2]) / np.maximum(
            diagonal, 1e-9
        )
        spread += distance[labelled].tolist()
        both = labelled[:, 1] & labelled[:, 2]
        left_first += (points[both, 1, 0] < points[both, 2, 0]).tolist()
    visibility = np.asarray(visibility)
    return {
        "keypoints v=0 / 1 / 2": [round(float(np.mean(visibility == k)), 4) for k in (0, 1, 2)],
        "labelled keypoints per instance": round(float(np.mean(per_instance)), 3),
        "keypoint x q10/q50/q90": np.quantile(xs, [0.1, 0.5, 0.9]).round(3).tolist(),
        "keypoint y q10/q50/q90": np.quantile(ys, [0.1, 0.5, 0.9]).round(3).tolist(),
        "keypoint-centre distance / box diagonal q50/q90": np.quantile(spread, [0.5, 0.9]).round(3).tolist(),
        "left hand left of right hand": round(float(np.mean(left_first)), 4),
    }


def ours(yaml: str, image_size: int, samples: int) -> dict:
    from yolo11_lightning import YOLODataModule

    data = YOLODataModule(dataset=yaml, batch_size=16, image_size=image_size, num_workers=0)
    data.setup("fit")
    dataset = data.datasets["train"]
    images, keypoints = [], []
    for key in _order(len(dataset), samples):
        item = dataset[key]
        labels = item["labels"][:, 1:].numpy()
        images.append((item["image"].numpy(), labels))
        keypoints.append((labels, item["keypoints"].numpy()))
    return {**_accumulate(images), **_keypoint_summary(keypoints)}


def oracle(yaml: str, image_size: int, samples: int) -> dict:
    from ultralytics.cfg import get_cfg
    from ultralytics.data import build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset

    random.seed(0)
    np.random.seed(0)
    cfg = get_cfg(overrides={"imgsz": image_size, "task": "pose"})
    data = check_det_dataset(yaml)
    dataset = build_yolo_dataset(cfg, data["train"], batch=16, data=data, mode="train")
    images, keypoints = [], []
    for _, index in _order(len(dataset), samples):
        item = dataset[index]
        boxes = item["bboxes"].numpy().reshape(-1, 4)
        images.append((item["img"].numpy(), boxes))
        keypoints.append((boxes, item["keypoints"].numpy().reshape(len(boxes), 5, 3)))
    return {**_accumulate(images), **_keypoint_summary(keypoints)}


def main() -> None:
    parser = C.parser(__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=3000)
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--train", type=int, default=200, help="images of the synthetic pose set")
    args = parser.parse_args()
    from yolo11_lightning.synthetic.poses import make_synthetic_pose_dataset

    yaml = str(make_synthetic_pose_dataset(C.default_workdir() / f"pose_{args.train}_{args.image_size}", args.train, 16,
                                           args.image_size))  # fmt: skip
    results = {
        "ours": ours(yaml, args.image_size, args.samples),
        "oracle": oracle(yaml, args.image_size, args.samples),
    }
    print(f"{args.samples} training samples per side, {args.image_size} px, {yaml}\n")
    rows = [[key, str(results["ours"][key]), str(results["oracle"][key])] for key in results["ours"]]
    print(C.format_table(["statistic", "ours", "oracle"], rows))


if __name__ == "__main__":
    main()
