"""Pose estimation's evaluation hooks for tasks.base.evaluation: the metric, scoring a batch, the monitor."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from torch import Tensor

from yolo11_lightning.tasks.base.evaluation import TaskEvaluation

if TYPE_CHECKING:
    from yolo11_lightning.metrics.detection import DetectionMAP

__all__ = ["PoseEvaluation"]


class PoseEvaluation(TaskEvaluation):
    """Pose estimation's evaluation hooks, listed in the module docstring."""

    checkpoint_monitor: ClassVar[str] = "val/fitness"  # box + pose, as the reference's best.pt
    monitor_meaning: ClassVar[str] = (
        "0.1 mAP50 + 0.9 mAP50-95 of the boxes plus the same of the keypoints (OKS), 0 to 2"
    )
    reported_metrics: ClassVar[tuple[str, ...]] = ("mAP50-95", "mAP50", "pose_mAP50-95", "pose_mAP50")
    checked_metrics: ClassVar[tuple[str, ...]] = ("mAP50-95", "pose_mAP50-95")

    def make_metric(self, class_names: list[str] | None, reference_style: bool = False) -> DetectionMAP:
        from yolo11_lightning.tasks.pose.metric import PoseMAP

        return PoseMAP(class_names, reference_style=reference_style)

    def pose(self, module: Any, images: Tensor) -> list[Tensor]:
        """Runs the eval forward and NMS: per image (n, 6 + K·D) rows of box, score, class and keypoints.

        The rows are in input pixels.
        """
        return self.nms(module, module.model(module.model_input(images)))

    def evaluate(self, module: Any, batch: dict[str, Any], metric: DetectionMAP) -> dict[str, Any]:
        """Scores boxes and keypoints into metric.PoseMAP; returns detections and (n, K, D) keypoints."""
        rows = self.pose(module, batch["images"])
        k, d = module.model.kpt_shape
        detections = [r[:, :6] for r in rows]
        keypoints = [r[:, 6:].reshape(-1, k, d) for r in rows]
        metric.update(detections, batch, keypoints)  # type: ignore[call-arg]
        return {"detections": detections, "keypoints": keypoints}
