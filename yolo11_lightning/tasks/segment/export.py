"""Segmentation's export hooks for tasks.base.export: ONNX outputs, their shapes and metadata."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from yolo11_lightning.tasks.base.export import TaskExport

__all__ = ["SegmentExport"]

SEGMENT_OUTPUT_DOC = (
    "output0 (B, 4 + nc + 32, A): cx, cy, w, h in input pixels, class scores, 32 mask coefficients; no NMS. "
    "output1 (B, 32, H/4, W/4): mask prototypes; a mask is sigmoid(coefficients @ prototypes) > 0.5 in its box"
)


class SegmentExport(TaskExport):
    """Segmentation's export hooks, listed in the module docstring."""

    onnx_outputs: ClassVar[tuple[str, ...]] = ("output0", "output1")
    onnx_output_doc: ClassVar[str] = SEGMENT_OUTPUT_DOC

    def onnx_output_axes(self, dynamic: bool) -> list[dict[int, str]]:
        """Returns detection's output axes plus the prototypes'.

        The prototypes' height and width are free when the image's are.
        """
        protos = {0: "batch", 2: "proto_height", 3: "proto_width"} if dynamic else {0: "batch"}
        return [*super().onnx_output_axes(dynamic), protos]

    def onnx_output_dims(self, model: Any, size: tuple[int, int], dynamic: bool) -> list[dict[int, int]]:
        """Returns detection's output dims plus the prototypes' (B, 32, H/4, W/4)."""
        num_masks = model.head.nm
        protos = {1: num_masks} if dynamic else {1: num_masks, 2: size[0] // 4, 3: size[1] // 4}
        return [*super().onnx_output_dims(model, size, dynamic), protos]

    def onnx_output_order(self, shapes: Sequence[Sequence[Any]]) -> list[int]:
        """Orders predictions (3-D) first and prototypes (4-D) second, whatever the file's order."""
        return [1, 0] if len(shapes[0]) == 4 else [0, 1]

    def onnx_extra_channels(
        self, shapes: Sequence[Sequence[Any]], kpt_shape: Sequence[int] | None = None
    ) -> int:
        """Returns the mask coefficients per anchor: the prototypes' channel count."""
        proto_shape = list(shapes[1])
        if len(proto_shape) != 4 or not isinstance(proto_shape[1], int):
            raise ValueError(f"second output {proto_shape} is not the prototypes (B, nm, H/4, W/4)")
        return proto_shape[1]
