"""``ClassifyTask``: image classification (YOLO11-cls), what every layer asks of it (``tasks.base``).

Another network: the detection backbone's layers 0-8, then C2PSA at layer 9 (no SPPF, no neck; ``neck = False``)
and the ``Classify`` head at layer 10; one label per image, cross-entropy (``loss.ClassificationLoss``). The model,
its reference files and its loss are here; the data (ImageFolder, classification augmentations), top-1 / top-5
accuracy, prediction and export are not yet (``not_yet``: runs are refused by ``tasks.choice``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from torch import Tensor, nn

from yolo11_lightning.tasks.base import Task
from yolo11_lightning.tasks.classify.head import Classify
from yolo11_lightning.tasks.classify.loss import ClassificationLoss

__all__ = ["ClassifyTask"]


class ClassifyTask(Task):
    """Classification: backbone only, ``Classify`` head, ``ClassificationLoss``; (B, nc) probabilities."""

    name: ClassVar[str] = "classify"
    words: ClassVar[str] = "classification"
    title: ClassVar[str] = "image classification"
    noun: ClassVar[str] = "classifier"
    model_suffix: ClassVar[str] = "-cls"
    reference_class: ClassVar[str] = "ClassificationModel"
    reference_key: ClassVar[str | None] = "model.10.linear.weight"
    neck: ClassVar[bool] = False
    batch_norm: ClassVar[tuple[float, float]] = (1e-5, 0.1)  # PyTorch's defaults, as the reference's classifier
    class_branch: ClassVar[str] = "head.linear."
    class_key: ClassVar[str] = "head.linear.weight"
    loss_items: ClassVar[tuple[str, ...]] = ("cls",)
    not_yet: ClassVar[str] = (
        "its data (ImageFolder, classification augmentations), top-1/top-5 accuracy, prediction and export"
    )

    def build_head(
        self, num_classes: int, channels: Sequence[int], strides: Sequence[int], reg_max: int, scale: str,
        kpt_shape: tuple[int, int] | None = None,
    ) -> nn.Module:  # fmt: skip
        return Classify(channels[-1], num_classes)

    def build_loss(self, model: Any, box: float, cls: float, dfl: float) -> ClassificationLoss:
        """Cross-entropy; the box/cls/dfl gains are the detection tasks' and do not apply."""
        return ClassificationLoss()

    def loss(self, criterion: Any, outputs: Any, batch: dict[str, Any]) -> tuple[Tensor, Tensor]:
        """``criterion(logits, labels)``: the batch's ``labels`` (B,), one class per image."""
        if "labels" not in batch:
            raise ValueError(
                f"the classify task needs batches with `labels` (B,), but the batch has only {sorted(batch)}"
            )
        return criterion(outputs, batch["labels"])
