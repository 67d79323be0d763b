"""What a dataset source hands to the training pipeline: one record per usable image.

Sources (YOLO txt, COCO json) parse and check files into ``ImageRecord``s; the Dataset reads pixels
and augments. Keeping this boundary small lets either side change without the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class ImageRecord:
    """One image and its checked labels.

    Attributes:
        path: image file path (absolute).
        height, width: original image size in pixels, after EXIF rotation.
        classes: (n,) int64 contiguous class ids in [0, num_classes).
        boxes: (n, 4) float32 boxes ``cx, cy, w, h`` normalised to the original image, inside [0, 1].
    """

    path: str
    height: int
    width: int
    classes: np.ndarray = field(default_factory=lambda: np.zeros((0,), np.int64))
    boxes: np.ndarray = field(default_factory=lambda: np.zeros((0, 4), np.float32))

    def __post_init__(self) -> None:
        self.classes = np.asarray(self.classes, dtype=np.int64).reshape(-1)
        self.boxes = np.asarray(self.boxes, dtype=np.float32).reshape(-1, 4)
        if len(self.classes) != len(self.boxes):
            raise ValueError(f"{self.path}: {len(self.classes)} classes but {len(self.boxes)} boxes")
