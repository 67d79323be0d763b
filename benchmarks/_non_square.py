"""Synthetic shapes in images of six sizes (five aspect ratios), for the benchmarks of rectangular validation.

Imported as ``_non_square`` (next to ``_common``) by ``parity/val_parity.py`` and ``speed/val_speed.py``
(``--non-square``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

# (height, width): resized to long side 160 most give a fractional short side (95.2, 62.1, 99.2, 91.4),
# where rounding to nearest and rounding up differ; one square is enlarged.
ASPECTS = [(125, 210), (210, 125), (150, 150), (97, 250), (250, 155), (320, 183)]


def non_square_yaml(root: Path, train_per_aspect: int = 48, val_per_aspect: int = 16) -> Path:
    """Synthetic shapes in images of ``ASPECTS`` sizes, numbered 00000.png, ... (int image ids)."""
    from yolo11_lightning.synthetic.shapes import make_synthetic_dataset

    out = root / f"non_square_{len(ASPECTS)}_{train_per_aspect}_{val_per_aspect}"
    if (out / "data.yaml").is_file():
        return out / "data.yaml"
    count = 0
    for k, size in enumerate(ASPECTS):
        part = make_synthetic_dataset(root / f"part_{size[0]}x{size[1]}_{train_per_aspect}_{val_per_aspect}", train_per_aspect, val_per_aspect,
                                      image_size=size, num_classes=3, seed=k, max_objects=4).parent  # fmt: skip
        for split in ("train", "val"):
            for image in sorted((part / "images" / split).glob("*.png")):
                for kind, ext in (("images", ".png"), ("labels", ".txt")):
                    src = part / kind / split / (image.stem + ext)
                    dst = out / kind / split / f"{count:05d}{ext}"
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(src, dst)
                count += 1
    import yaml as pyyaml

    names = pyyaml.safe_load((part / "data.yaml").read_text())["names"]
    (out / "data.yaml").write_text(pyyaml.safe_dump({"path": str(out), "train": "images/train", "val": "images/val",
                                                     "names": names}))  # fmt: skip
    return out / "data.yaml"
