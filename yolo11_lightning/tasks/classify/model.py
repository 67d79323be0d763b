"""Classification's model hooks for tasks.base.model: its head, reference files and loss."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from torch import Tensor, nn

from yolo11_lightning.tasks.base.model import TaskModel
from yolo11_lightning.tasks.classify.head import Classify
from yolo11_lightning.tasks.classify.loss import ClassificationLoss

__all__ = ["ClassifyModel"]


class ClassifyModel(TaskModel):
    """Classification's model hooks, listed in the module docstring."""

    model_suffix: ClassVar[str] = "-cls"
    reference_class: ClassVar[str] = "ClassificationModel"
    reference_key: ClassVar[str | None] = "model.10.linear.weight"
    has_neck: ClassVar[bool] = False
    batch_norm: ClassVar[tuple[float, float]] = (
        1e-5,
        0.1,
    )  # PyTorch's defaults, as the reference's classifier
    class_branch: ClassVar[str] = "head.linear."
    class_key: ClassVar[str] = "head.linear.weight"
    loss_items: ClassVar[tuple[str, ...]] = ("cls",)

    def build_head(
        self, num_classes: int, channels: Sequence[int], strides: Sequence[int], reg_max: int, scale: str,
        kpt_shape: tuple[int, int] | None = None,
    ) -> nn.Module:  # fmt: skip
        return Classify(channels[-1], num_classes)

    def build_loss(self, model: Any, box: float, cls: float, dfl: float) -> ClassificationLoss:
        """Builds the cross-entropy criterion; the box, cls and dfl gains are the detection tasks' only."""
        return ClassificationLoss()

    def loss(self, criterion: Any, outputs: Any, batch: dict[str, Any]) -> tuple[Tensor, Tensor]:
        """Returns criterion(logits, labels) with the batch's (B,) labels, one class per image."""
        if "labels" not in batch:
            raise ValueError(
                f"the classify task needs batches with `labels` (B,), but the batch has only {sorted(batch)}"
            )
        return criterion(outputs, batch["labels"])

    def reference_loss_factor(self, global_batch: int) -> int:
        """Returns 1: the reference trains its classifier on the mean cross-entropy, not times the batch."""
        return 1
