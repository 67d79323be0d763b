"""Pose prediction and drawing hooks for tasks.base.prediction: results, json fields, pictures."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from torch import Tensor

from yolo11_lightning.ops.letterbox import detections_to_original
from yolo11_lightning.tasks.base.prediction import TaskPrediction
from yolo11_lightning.tasks.pose.drawing import draw_keypoints, keypoints_to_original

if TYPE_CHECKING:
    pass

__all__ = ["PosePrediction"]


class PosePrediction(TaskPrediction):
    """Pose estimation's prediction and drawing hooks, listed in the module docstring."""

    def draw_evaluated(
        self, image: np.ndarray, outputs: dict[str, Any], index: int, keep: Tensor,
        names: Sequence[str] | None,
    ) -> np.ndarray:  # fmt: skip
        """Draws the predicted keypoints and skeleton under the boxes."""
        det = outputs["detections"][index].detach().float().cpu()[keep]
        points = outputs["keypoints"][index].detach().float().cpu()[keep]
        image = draw_keypoints(image, points.numpy(), det[:, 5].numpy())
        return super().draw_evaluated(image, outputs, index, keep, names)

    def draw_targets(
        self, image: np.ndarray, batch: dict[str, Any], index: int, names: Sequence[str] | None
    ) -> np.ndarray:
        """Draws the labelled keypoints, visibility 1 or 2, and skeleton under the boxes."""
        targets = batch["targets"].detach().cpu()
        own = targets[:, 0] == index
        points = batch["keypoints"].detach().float().cpu()[own].clone()
        points[..., 0] *= image.shape[1]
        points[..., 1] *= image.shape[0]
        image = draw_keypoints(image, points.numpy(), targets[own, 1].numpy())
        return super().draw_targets(image, batch, index, names)

    def predict(self, module: Any, batch: dict[str, Any]) -> list[dict[str, Tensor]]:
        """Predicts per image {"detections": (n, 6), "keypoints": (n, K, D)}, clipped, in original pixels."""
        rows = self.pose(module, batch["images"])
        k, d = module.model.kpt_shape
        detections = detections_to_original(
            [r[:, :6] for r in rows], batch["scales"], batch["pads"], batch["orig_sizes"]
        )
        out = []
        for i, (r, det) in enumerate(zip(rows, detections)):
            points = keypoints_to_original(
                r[:, 6:].reshape(-1, k, d), batch["scales"][i], batch["pads"][i], batch["orig_sizes"][i]
            )
            out.append({"detections": det, "keypoints": points})
        return out

    def split_result(self, result: Any) -> tuple[Tensor, dict[str, Any]]:
        return result["detections"], {"keypoints": result["keypoints"].detach().float().cpu().numpy()}

    def result_fields(self, extras: dict[str, Any], k: int) -> dict[str, Any]:
        """Returns COCO keypoints [x1, y1, v1, x2, y2, v2, ...] in original pixels.

        v is the predicted visibility score in (0, 1) (D = 3, as the reference's json) or 1 (D = 2).
        """
        points = extras["keypoints"][k]
        if points.shape[-1] == 2:
            points = np.concatenate([points, np.ones_like(points[:, :1])], 1)
        return {"keypoints": [round(float(v), 3) for v in points.reshape(-1)]}

    def draw_under_boxes(self, image: np.ndarray, classes: np.ndarray, extras: dict[str, Any]) -> np.ndarray:
        points = extras["keypoints"]
        return draw_keypoints(image, points, classes) if len(points) else image
