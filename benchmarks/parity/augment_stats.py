"""Training-augmentation statistics, ours beside the oracle's dataset, on the same images and settings.

    python benchmarks/parity/augment_stats.py --samples 2000 --image-size 224
    python benchmarks/parity/augment_stats.py --coco-like 300 --image-size 640   # the files of data_speed.py

Each side's training dataset (defaults: mosaic 1.0, scale 0.5, translate 0.1, HSV, flips; the oracle's
default configuration with only imgsz set) is read in a shuffled order over several epochs, the way the
loaders read it. Reported: output image shape, boxes per sample, box area (fraction of the image)
quantiles, box side quantiles in pixels, the share of boxes under 8 px on the short side, per-channel
pixel mean and standard deviation (RGB, 0..255), the mean absolute difference of neighbouring pixels
(sharpness: what resampling changes), the share of grey pixels (R = G = B: mostly the fill the mosaic
and the affine leave, so it follows their geometry) and the box centre quantiles.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers (_common, ...)

import _common as C
import numpy as np


def _summary(shapes, counts, areas, sides, centres, pixel_sum, pixel_sq, grad, grey, pixels) -> dict:
    mean = pixel_sum / pixels
    std = np.sqrt(pixel_sq / pixels - mean**2)
    areas, sides, centres = np.asarray(areas), np.asarray(sides), np.asarray(centres).reshape(-1, 2)
    return {
        "shapes": sorted({tuple(s) for s in shapes}),
        "boxes per sample": round(float(np.mean(counts)), 3),
        "samples with no box": round(float(np.mean(np.asarray(counts) == 0)), 4),
        "box area q10/q50/q90": np.quantile(areas, [0.1, 0.5, 0.9]).round(4).tolist(),
        "box short side px q10/q50/q90": np.quantile(sides, [0.1, 0.5, 0.9]).round(1).tolist(),
        "boxes < 8 px": round(float(np.mean(sides < 8)), 4),
        "box centre x q10/q50/q90": np.quantile(centres[:, 0], [0.1, 0.5, 0.9]).round(3).tolist(),
        "box centre y q10/q50/q90": np.quantile(centres[:, 1], [0.1, 0.5, 0.9]).round(3).tolist(),
        "pixel mean RGB": mean.round(1).tolist(),
        "pixel std RGB": std.round(1).tolist(),
        "mean abs neighbour difference": round(float(grad / pixels), 3),
        "grey (R=G=B) pixel share": round(float(grey / pixels), 4),
    }


def _accumulate(samples):
    shapes, counts, areas, sides, centres = [], [], [], [], []
    pixel_sum, pixel_sq, grad, grey, pixels = np.zeros(3), np.zeros(3), 0.0, 0, 0
    for image, labels in samples:  # image (3, H, W) uint8 RGB; labels (n, 4) xywh normalised
        _, h, w = image.shape
        shapes.append((h, w))
        counts.append(len(labels))
        areas += (labels[:, 2] * labels[:, 3]).tolist()
        sides += np.minimum(labels[:, 2] * w, labels[:, 3] * h).tolist()
        centres += labels[:, :2].tolist()
        x = image.reshape(3, -1).astype(np.float64)
        pixel_sum += x.sum(1)
        pixel_sq += (x**2).sum(1)
        pixels += x.shape[1]
        signed = image.astype(np.int16)
        grad += (np.abs(np.diff(signed, axis=1)).sum() + np.abs(np.diff(signed, axis=2)).sum()) / 6
        grey += int(((image[0] == image[1]) & (image[1] == image[2])).sum())
    return _summary(shapes, counts, areas, sides, centres, pixel_sum, pixel_sq, grad, grey, pixels)


def coco_like_yaml(num_images: int) -> str:
    """The generated JPEGs of ``data_speed.py`` (COCO-like sizes, 80 classes) with a dataset yaml."""
    from _coco_like import make_dataset

    root = C.default_workdir() / "data_speed"
    make_dataset(root, num_images)
    path = root / "data.yaml"
    names = "".join(f"  {i}: c{i}\n" for i in range(80))
    path.write_text(f"path: {root}\ntrain: images/train\nval: images/train\nnames:\n{names}")
    return str(path)


def _order(n: int, samples: int) -> Iterator[tuple[int, int]]:
    """``(epoch, index)`` of the first ``samples`` training samples: each epoch a seeded permutation of ``n``."""
    count = 0
    for epoch in range(samples // n + 1):
        for index in np.random.default_rng(epoch).permutation(n):
            if count == samples:
                return
            yield epoch, int(index)
            count += 1


def ours(yaml: str, image_size: int, samples: int) -> dict:
    from yolo11_lightning import YOLODataModule

    data = YOLODataModule(dataset=yaml, batch_size=16, image_size=image_size, num_workers=0)
    data.setup("fit")
    dataset = data.datasets["train"]
    n = len(dataset)

    def items():
        for key in _order(n, samples):
            item = dataset[key]
            yield item["image"].numpy(), item["labels"][:, 1:].numpy()

    return _accumulate(items())


def oracle(yaml: str, image_size: int, samples: int) -> dict:
    from ultralytics.cfg import get_cfg
    from ultralytics.data import build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset

    random.seed(0)
    np.random.seed(0)
    cfg = get_cfg(overrides={"imgsz": image_size})
    data = check_det_dataset(yaml)
    dataset = build_yolo_dataset(cfg, data["train"], batch=16, data=data, mode="train")
    n = len(dataset)

    def items():
        for _, index in _order(n, samples):
            item = dataset[index]
            yield item["img"].numpy(), item["bboxes"].numpy().reshape(-1, 4)

    return _accumulate(items())


def main() -> None:
    parser = C.parser(__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--yaml", default=None, help="dataset yaml (default: the hard set of convergence.py)")
    parser.add_argument("--coco-like", type=int, default=0, help="use N generated JPEGs of data_speed.py")
    args = parser.parse_args()
    if args.coco_like:
        args.yaml = coco_like_yaml(args.coco_like)
    elif args.yaml is None:
        from yolo11_lightning.synthetic.hard import make_hard_synthetic_dataset

        args.yaml = str(
            make_hard_synthetic_dataset(C.default_workdir() / "hard_400_100_168x224", 400, 100, (168, 224))
        )
    results = {"ours": ours(args.yaml, args.image_size, args.samples)}
    results["oracle"] = oracle(args.yaml, args.image_size, args.samples)
    print(f"{args.samples} training samples per side, {args.image_size} px, {args.yaml}\n")
    rows = [[key, str(results["ours"][key]), str(results["oracle"][key])] for key in results["ours"]]
    print(C.format_table(["statistic", "ours", "oracle"], rows))


if __name__ == "__main__":
    main()
