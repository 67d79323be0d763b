"""What validation, the checkpoints and ``export --check-data`` ask of a task, with detection's answers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from torch import Tensor

from yolo11_lightning.ops.postprocess import non_max_suppression
from yolo11_lightning.tasks.base.module_view import ModuleView

if TYPE_CHECKING:
    from yolo11_lightning.metrics.class_results import ClassResults
    from yolo11_lightning.metrics.detection import DetectionMAP

__all__ = ["TaskEvaluation"]


class TaskEvaluation:
    """The task's hooks for validation, the checkpoints and export --check-data; see the module docstring."""

    checkpoint_monitor: ClassVar[str] = "val/mAP50-95"  # what ``best.ckpt`` follows (``BestCheckpoint``)
    monitor_meaning: ClassVar[str] = (
        "COCO box mAP at IoU 0.50:0.95"  # the closing summary prints it beside it
    )
    validation_conf: ClassVar[float] = (
        0.001  # the module's default score threshold in validation (the reference's)
    )
    reported_metrics: ClassVar[tuple[str, ...]] = ("mAP50-95", "mAP50")  # ``export --check-data`` prints
    checked_metrics: ClassVar[tuple[str, ...]] = ("mAP50-95",)  # ... and holds to the allowed difference

    def make_metric(self, class_names: list[str] | None, reference_style: bool = False) -> DetectionMAP:
        from yolo11_lightning.metrics.detection import DetectionMAP

        return DetectionMAP(class_names, reference_style=reference_style)

    def class_results(self, evaluation: Any, names: list[str]) -> ClassResults:
        """Returns the per-class results of an evaluation the metric kept, for the summary table and pictures.

        The evaluation is ``metric.evaluation``; the results come from ``metrics.class_results`` and feed the
        closing summary's table and the result pictures.
        """
        from yolo11_lightning.metrics.class_results import class_results

        return class_results(evaluation, names)

    def nms(self, module: ModuleView, predictions: Tensor) -> list[Tensor]:
        """Runs NMS at the module's thresholds, (B, 4 + nc + extra, A) to (n, 6 + extra) per image.

        The detections are in input pixels; ``extra = extra_channels(module.model)``.
        """
        hp = module.hparams
        extra = self.extra_channels(module.model)
        kwargs = {"extra": extra} if extra else {}
        return non_max_suppression(
            predictions, conf_threshold=hp.conf_threshold, iou_threshold=hp.iou_threshold,
            max_detections=hp.max_detections, **kwargs,
        )  # fmt: skip

    def evaluate(self, module: ModuleView, batch: dict[str, Any], metric: DetectionMAP) -> dict[str, Any]:
        """Detects and scores into ``metric``; returns {"detections": [(n, 6)]} for ValidationImages."""
        detections = module.forward_with_nms(batch["images"])
        metric.update(detections, batch)
        return {"detections": detections}
