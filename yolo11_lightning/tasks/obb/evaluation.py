"""Oriented-box evaluation hooks for tasks.base.evaluation: the metric, scoring a batch, the monitor."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from torch import Tensor

from yolo11_lightning.tasks.base.evaluation import TaskEvaluation
from yolo11_lightning.tasks.obb.nms import rotated_nms

if TYPE_CHECKING:
    from yolo11_lightning.metrics.detection import DetectionMAP

__all__ = ["ObbEvaluation"]


class ObbEvaluation(TaskEvaluation):
    """Oriented-box detection's evaluation hooks, listed in the module docstring."""

    monitor_meaning: ClassVar[str] = (
        "oriented-box mAP at IoU 0.50:0.95 by probiou (the reference validator's rules)"
    )
    validation_conf: ClassVar[float] = 0.01  # the reference's validator keeps fewer rotated candidates

    def make_metric(self, class_names: list[str] | None, reference_style: bool = False) -> DetectionMAP:
        from yolo11_lightning.tasks.obb.metric import ObbMAP

        return ObbMAP(class_names)

    def nms(self, module: Any, predictions: Tensor) -> list[Tensor]:
        """Runs rotated NMS, (B, 4 + nc + 1, A) to (n, 7) [cx, cy, w, h, score, class, r] per image.

        The detections are in input pixels.
        """
        hp = module.hparams
        return rotated_nms(
            predictions, conf_threshold=hp.conf_threshold, iou_threshold=hp.iou_threshold,
            max_detections=hp.max_detections,
        )  # fmt: skip
