"""The scale benchmark's dataset: many tiny JPEGs in folders of 10,000, 1-3 boxes each, made quickly.

Imported as ``_scale_data`` by ``scale.py`` (next to ``_common``). A few distinct small JPEGs are encoded once
and written under every name, so a million files take minutes; every image still has its own label file.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

FOLDER_SIZE = 10_000  # images per folder, as the dataset
DISTINCT = 64  # distinct JPEG files written in turn


def _jpegs(size: tuple[int, int], count: int) -> list[bytes]:
    import cv2

    rng = np.random.default_rng(0)
    out = []
    for i in range(count):
        h, w = size if i % 2 == 0 else size[::-1]
        small = rng.integers(0, 256, (max(h // 8, 1), max(w // 8, 1), 3), dtype=np.uint8)
        ok, data = cv2.imencode(".jpg", cv2.resize(small, (w, h)), [cv2.IMWRITE_JPEG_QUALITY, 80])
        assert ok
        out.append(data.tobytes())
    return out


def _write_split(root: Path, split: str, count: int, seed: int, size: tuple[int, int]) -> None:
    jpegs = _jpegs(size, DISTINCT)
    rng = np.random.default_rng(seed)
    boxes = rng.integers(1, 4, count)
    for start in range(0, count, FOLDER_SIZE):
        sub = f"{start // FOLDER_SIZE:03d}"
        images, labels = root / "images" / split / sub, root / "labels" / split / sub
        images.mkdir(parents=True, exist_ok=True)
        labels.mkdir(parents=True, exist_ok=True)
        for i in range(start, min(start + FOLDER_SIZE, count)):
            name = f"{i:07d}"
            with open(images / f"{name}.jpg", "wb") as f:
                f.write(jpegs[i % DISTINCT])
            n = int(boxes[i])
            rows = rng.uniform(0.2, 0.8, (n, 2))
            wh = rng.uniform(0.05, 0.3, (n, 2))
            cls = rng.integers(0, 8, n)
            with open(labels / f"{name}.txt", "w") as f:
                f.write(
                    "".join(
                        f"{c} {x:.5f} {y:.5f} {w:.5f} {h:.5f}\n" for c, (x, y), (w, h) in zip(cls, rows, wh)
                    )
                )


def scale_dataset(
    root: str | Path, num_images: int, size: tuple[int, int] = (48, 64), num_val: int = 32
) -> Path:
    """``<root>/scale_<n>/data.yaml``: ``num_images`` training images (h, w = ``size`` or its transpose) and
    ``num_val`` validation ones, 8 classes; reused when already complete. Returns the yaml."""
    folder = Path(root) / f"scale_{num_images}"
    yaml_path = folder / "data.yaml"
    if yaml_path.is_file():
        return yaml_path
    _write_split(folder, "train", num_images, 0, size)
    _write_split(folder, "val", num_val, 1, size)
    names = "".join(f"  {i}: c{i}\n" for i in range(8))
    tmp = folder / "data.yaml.tmp"
    tmp.write_text(f"path: {folder}\ntrain: images/train\nval: images/val\nnames:\n{names}")
    os.replace(tmp, yaml_path)  # written last: a yaml means the set is complete
    return yaml_path
