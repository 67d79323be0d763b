"""Classification's evaluation hooks for tasks.base.evaluation: the metric, scoring a batch, the monitor."""

from __future__ import annotations

from typing import Any, ClassVar

from yolo11_lightning.metrics.class_results import ClassResults
from yolo11_lightning.tasks.base.evaluation import TaskEvaluation
from yolo11_lightning.tasks.classify.metric import ClassificationAccuracy, classification_results

__all__ = ["ClassifyEvaluation"]


class ClassifyEvaluation(TaskEvaluation):
    """Classification's evaluation hooks, listed in the module docstring."""

    checkpoint_monitor: ClassVar[str] = "val/fitness"  # (top1 + top5) / 2, the reference's classify fitness
    monitor_meaning: ClassVar[str] = "(top-1 + top-5 accuracy) / 2, the reference's"
    reported_metrics: ClassVar[tuple[str, ...]] = ("top1", "top5")
    checked_metrics: ClassVar[tuple[str, ...]] = ("top1",)

    def make_metric(
        self, class_names: list[str] | None, reference_style: bool = False
    ) -> ClassificationAccuracy:
        return ClassificationAccuracy(class_names)

    def class_results(self, evaluation: Any, names: list[str]) -> ClassResults:
        """Returns the images per class and the top-1 confusion matrix, by metric.classification_results."""
        return classification_results(evaluation, names)

    def evaluate(self, module: Any, batch: dict[str, Any], metric: Any) -> dict[str, Any]:
        """Scores the (B, nc) class probabilities into ``metric`` and returns them.

        For the box-drawing callbacks it returns no detections: one empty (0, 6) tensor per image.
        """
        probabilities = module.model(module.model_input(batch["images"]))
        metric.update(probabilities, batch["labels"], batch["indices"])
        empty = probabilities.new_zeros(0, 6)
        return {"probabilities": probabilities, "detections": [empty] * probabilities.shape[0]}
