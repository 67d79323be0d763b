"""Segmentation's model hooks for tasks.base.model: its head, reference files and loss."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from torch import Tensor, nn

from yolo11_lightning.nn.scales import scaled_channels
from yolo11_lightning.tasks.base.model import TaskModel
from yolo11_lightning.tasks.segment.head import Segment
from yolo11_lightning.tasks.segment.loss import SegmentationLoss

if TYPE_CHECKING:
    from yolo11_lightning.loss.detection import DetectionLoss

__all__ = ["NUM_MASKS", "PROTO_CHANNELS", "SegmentModel"]

NUM_MASKS = 32  # mask coefficients per anchor and prototypes per image (YOLO11-seg)
PROTO_CHANNELS = 256  # hidden width of Proto at width 1, scaled like any layer


class SegmentModel(TaskModel):
    """Segmentation's model hooks, listed in the module docstring."""

    model_suffix: ClassVar[str] = "-seg"
    reference_class: ClassVar[str] = "SegmentationModel"
    reference_key: ClassVar[str | None] = "model.23.proto.cv1.conv.weight"  # only a Segment head has it
    loss_items: ClassVar[tuple[str, ...]] = ("box", "seg", "cls", "dfl")

    def build_head(
        self, num_classes: int, channels: Sequence[int], strides: Sequence[int], reg_max: int, scale: str,
        kpt_shape: tuple[int, int] | None = None,
    ) -> nn.Module:  # fmt: skip
        return Segment(
            num_classes, channels, strides, reg_max, NUM_MASKS, scaled_channels(scale, PROTO_CHANNELS)
        )

    def extra_channels(self, model: Any) -> int:
        """Returns the 32 mask coefficients per anchor."""
        return NUM_MASKS

    def build_loss(self, model: Any, box: float, cls: float, dfl: float) -> DetectionLoss:
        return SegmentationLoss(model.num_classes, strides=model.strides, box=box, cls=cls, dfl=dfl)

    @staticmethod
    def _masks(batch: dict[str, Any]) -> tuple[Tensor, bool]:
        if "masks" not in batch:
            raise ValueError(
                "the segment task needs segmentation batches (with `masks` and `mask_overlap`), but the batch "
                f"has only {sorted(batch)}: use a segmentation data module (--data.task segment)"
            )
        return batch["masks"], bool(batch.get("mask_overlap", True))

    def loss(self, criterion: Any, outputs: Any, batch: dict[str, Any]) -> tuple[Tensor, Tensor]:
        masks, overlap = self._masks(batch)
        criterion.overlap = overlap  # type: ignore[attr-defined]
        return criterion(outputs, batch["targets"], masks, batch.get("targets_per_image"))
