"""COCO-like training images for the data benchmarks: JPEGs of typical photo sizes with YOLO labels beside them.

Imported as ``_coco_like`` (next to ``_common``) by ``speed/data_speed.py``, ``speed/data_anatomy.py``,
``parity/augment_stats.py`` (``--coco-like``) and ``device/gpu.py`` (its ``prepare`` section).
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from yolo11_lightning.structures.records import ImageRecord

# Typical photo sizes (h, w) of detection datasets (COCO-like).
SIZES = [(480, 640), (640, 480), (427, 640), (640, 427), (375, 500), (512, 512), (720, 960)]


def make_dataset(root: Path, num_images: int, seed: int = 0) -> list[ImageRecord]:
    """Write JPEGs with 1-8 filled shapes on a smooth noisy background, YOLO labels beside them."""
    rng = np.random.default_rng(seed)
    (root / "images" / "train").mkdir(parents=True, exist_ok=True)
    (root / "labels" / "train").mkdir(parents=True, exist_ok=True)
    records = []
    for i in range(num_images):
        h, w = SIZES[i % len(SIZES)]
        img_path = root / "images" / "train" / f"{i:05d}.jpg"
        lbl_path = root / "labels" / "train" / f"{i:05d}.txt"
        n = int(rng.integers(1, 9))
        wh = rng.uniform(0.05, 0.4, (n, 2)) * [w, h]
        xy1 = rng.uniform(0, 1, (n, 2)) * ([w, h] - wh)
        boxes = np.concatenate([xy1, xy1 + wh], 1).round()
        classes = rng.integers(0, 80, n)
        if not img_path.exists():
            yy, xx = np.mgrid[0:h, 0:w]
            base = rng.integers(0, 255, 3)
            img = base + 60 * np.sin(
                xx[..., None] / rng.uniform(20, 80) + yy[..., None] / rng.uniform(20, 80)
            )
            img = np.clip(img + rng.normal(0, 12, (h, w, 3)), 0, 255).astype(np.uint8)
            for x1, y1, x2, y2 in boxes.astype(int):
                cv2.rectangle(
                    img, (x1, y1), (x2 - 1, y2 - 1), tuple(int(v) for v in rng.integers(0, 255, 3)), -1
                )
            cv2.imwrite(str(img_path), img, [cv2.IMWRITE_JPEG_QUALITY, 90])
        xywhn = np.concatenate([(boxes[:, :2] + boxes[:, 2:]) / 2, boxes[:, 2:] - boxes[:, :2]], 1) / [
            w,
            h,
            w,
            h,
        ]
        lbl_path.write_text(
            "".join(f"{c} {' '.join(f'{v:.6f}' for v in b)}\n" for c, b in zip(classes, xywhn))
        )
        records.append(ImageRecord(str(img_path), h, w, classes, xywhn))
    return records
