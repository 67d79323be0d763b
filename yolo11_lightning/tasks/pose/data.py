"""Pose estimation's data hooks for tasks.base.data: label fields, samples, collate, split checks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from yolo11_lightning.structures.keypoints import Keypoints
from yolo11_lightning.tasks.base.data import TaskData
from yolo11_lightning.tasks.pose.batch import collate_pose

if TYPE_CHECKING:
    from yolo11_lightning.structures.instances import InstanceField, Instances

__all__ = ["PoseData"]


class PoseData(TaskData):
    """Pose estimation's data hooks, listed in the module docstring."""

    label_fields: ClassVar[tuple[type[InstanceField], ...]] = (Keypoints,)

    def sample_targets(
        self, image_shape: tuple[int, int], instances: Instances, options: dict[str, Any]
    ) -> tuple[np.ndarray | None, dict[str, Any]]:
        """Returns the sample's (n, K, 3) keypoints: x, y normalised to the (h, w) image, and visibility."""
        points = instances.fields[Keypoints.name].points.copy()  # type: ignore[attr-defined]
        points[..., 0] /= image_shape[1]
        points[..., 1] /= image_shape[0]
        return None, {"keypoints": torch.from_numpy(points)}

    def missing_targets(self, options: dict[str, Any]) -> dict[str, Any]:
        return {"keypoints": torch.zeros(0, 0, 3)}

    def collate(self, samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        return collate_pose(samples)
