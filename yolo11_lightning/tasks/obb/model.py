"""Oriented-box detection's model hooks for tasks.base.model: its head, reference files and loss."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from torch import Tensor, nn

from yolo11_lightning.tasks.base.model import TaskModel
from yolo11_lightning.tasks.obb.head import OBB
from yolo11_lightning.tasks.obb.loss import ObbLoss

__all__ = ["ObbModel"]


class ObbModel(TaskModel):
    """Oriented-box detection's model hooks, listed in the module docstring."""

    model_suffix: ClassVar[str] = "-obb"
    reference_class: ClassVar[str] = "OBBModel"
    reference_key: ClassVar[str | None] = "model.23.cv4.0.2.weight"  # also pose's: told apart by its width

    def extra_channels(self, model: Any) -> int:
        """Returns one channel after the class scores: the angle in radians."""
        return 1

    def build_head(
        self, num_classes: int, channels: Sequence[int], strides: Sequence[int], reg_max: int, scale: str,
        kpt_shape: tuple[int, int] | None = None,
    ) -> nn.Module:  # fmt: skip
        return OBB(num_classes, channels, strides, reg_max)

    def matches_reference(self, state: Mapping[str, Any]) -> bool:
        """Tells whether the head's extra branch is one channel wide, the angle; a pose head's is K·D wide."""
        key = self.reference_key
        return key in state and isinstance(state[key], Tensor) and state[key].shape[0] == 1  # type: ignore[operator]

    def build_loss(self, model: Any, box: float, cls: float, dfl: float) -> ObbLoss:
        return ObbLoss(model.num_classes, strides=model.strides, box=box, cls=cls, dfl=dfl)

    def loss(self, criterion: Any, outputs: Any, batch: dict[str, Any]) -> tuple[Tensor, Tensor]:
        """Returns criterion(outputs, targets), the targets (N, 7) [image, class, cx, cy, w, h, r]."""
        return criterion(outputs, batch["targets"])
