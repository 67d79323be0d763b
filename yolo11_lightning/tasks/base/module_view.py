"""What a task may use of the LightningModule it runs in: the public attributes every hook that scores or predicts
a batch reads (``training.module.YOLO11Module`` has them; the task never imports it, which sits above)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from torch import Tensor

from yolo11_lightning.nn.yolo11 import YOLO11

__all__ = ["ModuleView"]


class ModuleView(Protocol):
    """The module as a task sees it."""

    model: YOLO11  # the network (or an ONNX file in its place: same outputs)
    hparams: Mapping[str, Any]  # conf_threshold, iou_threshold, max_detections, ...

    def model_input(self, images: Tensor) -> Tensor:
        """Converts uint8 (B, 3, H, W) images to the model's float input, scaled, in its dtype and layout."""
        ...

    def forward_with_nms(self, images: Tensor) -> list[Tensor]:
        """Detects on uint8 (B, 3, H, W) images by the task's NMS: (n, 6 + extra) per image, input pixels."""
        ...
