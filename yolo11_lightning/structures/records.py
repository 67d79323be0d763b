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
        segments: (P, 2) float32 polygon vertices ``x, y`` normalised to the original image, inside
            [0, 1]: the polygons of all n instances one after the other (one closed outline each; a
            COCO multi-part polygon or RLE mask is merged into one outline, as the reference does).
        segment_sizes: (n,) int64 vertex count of each instance's polygon, summing to P; 0 for an
            instance without one (a box row, or a polygon that failed its checks). Default: all 0.
        keypoints: (n, K, 3) float32 per instance K keypoints ``x, y`` normalised to the original image and a
            visibility 0 (not labelled), 1 or 2 (a D = 2 dataset's visibility is 0 where x or y is negative,
            else 1, as the reference's); (n, 0, 3) for a dataset without keypoints (the default).
        flip_idx: (K,) int64, the keypoint each one becomes in a mirrored image (the dataset's ``flip_idx``), or
            None.
    """

    path: str
    height: int
    width: int
    classes: np.ndarray = field(default_factory=lambda: np.zeros((0,), np.int64))
    boxes: np.ndarray = field(default_factory=lambda: np.zeros((0, 4), np.float32))
    segments: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), np.float32))
    segment_sizes: np.ndarray | None = None
    keypoints: np.ndarray | None = None
    flip_idx: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.classes = np.asarray(self.classes, dtype=np.int64).reshape(-1)
        self.boxes = np.asarray(self.boxes, dtype=np.float32).reshape(-1, 4)
        if len(self.classes) != len(self.boxes):
            raise ValueError(f"{self.path}: {len(self.classes)} classes but {len(self.boxes)} boxes")
        self.segments = np.asarray(self.segments, dtype=np.float32).reshape(-1, 2)
        sizes = np.zeros(len(self.classes), np.int64) if self.segment_sizes is None else self.segment_sizes
        self.segment_sizes = np.asarray(sizes, dtype=np.int64).reshape(-1)
        if len(self.segment_sizes) != len(self.classes) or self.segment_sizes.sum() != len(self.segments):
            raise ValueError(
                f"{self.path}: {len(self.segment_sizes)} polygon sizes summing to {self.segment_sizes.sum()} "
                f"for {len(self.classes)} instances and {len(self.segments)} vertices"
            )
        points = np.zeros((len(self.classes), 0, 3), np.float32) if self.keypoints is None else self.keypoints
        self.keypoints = np.asarray(points, dtype=np.float32)
        if self.keypoints.ndim != 3 or self.keypoints.shape[::2] != (len(self.classes), 3):
            raise ValueError(
                f"{self.path}: keypoints of shape {self.keypoints.shape} for {len(self.classes)} instances, "
                "expected (n, K, 3)"
            )

    @property
    def polygons(self) -> list[np.ndarray]:
        """One (k_i, 2) float32 normalised polygon per instance (k_i = 0: the instance has none)."""
        return np.split(self.segments, np.cumsum(self.segment_sizes)[:-1]) if len(self.classes) else []

    @property
    def num_polygons(self) -> int:
        """Instances that have a polygon."""
        return int((self.segment_sizes > 0).sum())
