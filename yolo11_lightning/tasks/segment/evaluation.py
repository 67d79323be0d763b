"""Segmentation's evaluation hooks for tasks.base.evaluation: the metric, scoring a batch, the monitor."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from torch import Tensor

from yolo11_lightning.tasks.base.evaluation import TaskEvaluation
from yolo11_lightning.tasks.segment.mask_ops import image_target_masks, masks_at_protos

if TYPE_CHECKING:
    from yolo11_lightning.metrics.detection import DetectionMAP

__all__ = ["SegmentEvaluation"]


class SegmentEvaluation(TaskEvaluation):
    """Segmentation's evaluation hooks, listed in the module docstring."""

    checkpoint_monitor: ClassVar[str] = "val/fitness"  # box + mask, as the reference's best.pt
    monitor_meaning: ClassVar[str] = (
        "0.1 mAP50 + 0.9 mAP50-95 of the boxes plus the same of the masks, 0 to 2"
    )
    reported_metrics: ClassVar[tuple[str, ...]] = ("mAP50-95", "mAP50", "mask_mAP50-95", "mask_mAP50")
    checked_metrics: ClassVar[tuple[str, ...]] = ("mAP50-95", "mask_mAP50-95")

    def make_metric(self, class_names: list[str] | None, reference_style: bool = False) -> DetectionMAP:
        from yolo11_lightning.tasks.segment.metric import SegmentationMAP

        return SegmentationMAP(class_names, reference_style=reference_style)

    def segment(self, module: Any, images: Tensor) -> tuple[list[Tensor], Tensor]:
        """Runs the eval forward and NMS: per image (n, 6 + 32) rows in input pixels, and the protos.

        The protos are (B, 32, H/4, W/4).
        """
        predictions, protos = module.model(module.model_input(images))
        return self.nms(module, predictions), protos

    def evaluate(self, module: Any, batch: dict[str, Any], metric: DetectionMAP) -> dict[str, Any]:
        """Scores boxes and masks as the reference validator does, masks at proto resolution.

        The predicted masks (``masks_at_protos``) are scored against the ground truth at the same 1/4
        resolution (``image_target_masks``).
        """
        masks, overlap = self._masks(batch)
        rows, protos = self.segment(module, batch["images"])
        size = batch["images"].shape[-2:]
        detections = [r[:, :6] for r in rows]
        predicted = [masks_at_protos(protos[i], r[:, 6:], r[:, :4], size) for i, r in enumerate(rows)]
        truths = [
            image_target_masks(masks, overlap, batch["targets"], i) for i in range(len(batch["images"]))
        ]
        metric.update(detections, batch, predicted, truths)  # type: ignore[call-arg]
        return {"detections": detections, "masks": predicted}
