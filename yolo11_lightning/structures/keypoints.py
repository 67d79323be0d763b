"""Instance keypoints: the Keypoints label field and how every geometric step moves it.

Per instance K keypoints ``x, y`` in pixels of the image and a visibility (0: not labelled or out of the image,
1 or 2: labelled), in one (n, K, 3) float32 array. They follow the reference's rules (its ``Instances`` and
``RandomPerspective.apply_keypoints``): placed and warped point by point; a keypoint that leaves the image
(x or y below 0 or above the side) gets visibility 0 and is clipped to the image, after a warp and when a mosaic
is clipped to its canvas; a mirrored image permutes them by the dataset's ``flip_idx`` (left and right
keypoints swap), on either flip. The boxes never follow the keypoints: they are warped themselves.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from yolo11_lightning.structures.instances import InstanceField
from yolo11_lightning.structures.records import ImageRecord

__all__ = ["Keypoints"]


class Keypoints(InstanceField):
    """K keypoints per instance: ``points`` (n, K, 3) float32 ``x, y`` pixels and visibility; ``flip_idx`` (K,)
    int64 the permutation of a mirrored image, or None (the points are only mirrored)."""

    name = "keypoints"

    def __init__(self, points: np.ndarray, flip_idx: np.ndarray | None = None) -> None:
        self.points = points
        self.flip_idx = flip_idx

    def __len__(self) -> int:
        return len(self.points)

    def _new(self, points: np.ndarray) -> Keypoints:
        return Keypoints(points.astype(np.float32, copy=False), self.flip_idx)

    @classmethod
    def from_record(cls, record: ImageRecord, width: float, height: float) -> Keypoints:
        points = np.array(record.keypoints, np.float32, copy=True)
        points[..., 0] *= np.float32(width)
        points[..., 1] *= np.float32(height)
        return cls(points, record.flip_idx)

    @classmethod
    def empty(cls) -> Keypoints:
        return cls(np.zeros((0, 0, 3), np.float32))

    @classmethod
    def concat(cls, parts: Sequence[InstanceField]) -> Keypoints:
        """Joins the parts into one (sum n_i, K, 3) array.

        Parts without rows, whose K may be unknown (0), add nothing.
        """
        full = [p for p in parts if len(p)] or list(parts[:1])
        points = np.concatenate([p.points for p in full])  # type: ignore[attr-defined]
        flips = [p.flip_idx for p in parts if p.flip_idx is not None]  # type: ignore[attr-defined]
        return cls(points, flips[0] if flips else None)

    def select(self, keep: np.ndarray) -> Keypoints:
        return self._new(self.points[keep])

    def placed(self, scale: float, offset: tuple[float, float]) -> Keypoints:
        points = self.points.copy()
        points[..., :2] = points[..., :2] * np.float32(scale) + np.asarray(offset, np.float32)
        return self._new(points)

    def clipped(self, width: float, height: float) -> Keypoints:
        """Clips the keypoints into the width x height image; those outside it get visibility 0."""
        points = self.points.copy()
        x, y = points[..., 0], points[..., 1]
        points[..., 2][(x < 0) | (x > width) | (y < 0) | (y > height)] = 0.0
        points[..., 0], points[..., 1] = x.clip(0, width), y.clip(0, height)
        return self._new(points)

    def warped(self, matrix: np.ndarray, out_wh: tuple[int, int]) -> tuple[Keypoints, None]:
        """Warps the keypoints through the (3, 3) matrix by perspective division and clips them to out_wh."""
        n, k = self.points.shape[:2]
        if n == 0:
            return self._new(self.points.copy()), None
        xy = self.points[..., :2].reshape(-1, 2)
        mapped = np.concatenate([xy, np.ones((len(xy), 1), xy.dtype)], 1) @ np.asarray(matrix, xy.dtype).T
        points = self.points.copy()
        points[..., :2] = (mapped[:, :2] / mapped[:, 2:3]).reshape(n, k, 2)
        return self._new(points).clipped(*out_wh), None

    def _permuted(self, points: np.ndarray) -> Keypoints:
        return self._new(points if self.flip_idx is None else points[:, self.flip_idx])

    def flipped_lr(self, width: float) -> Keypoints:
        points = self.points.copy()
        points[..., 0] = width - points[..., 0]
        return self._permuted(points)

    def flipped_ud(self, height: float) -> Keypoints:
        points = self.points.copy()
        points[..., 1] = height - points[..., 1]
        return self._permuted(points)
