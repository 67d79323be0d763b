"""Oriented-box detection's export hooks for tasks.base.export: ONNX outputs, their shapes and metadata."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from yolo11_lightning.tasks.base.export import TaskExport

__all__ = ["ObbExport"]

OBB_OUTPUT_DOC = (
    "(B, 4 + nc + 1, A): the rotated box's cx, cy, w, h in input pixels, class scores, then its angle in radians "
    "(the width's direction, clockwise on the image); no NMS"
)


class ObbExport(TaskExport):
    """Oriented-box detection's export hooks, listed in the module docstring."""

    onnx_output_doc: ClassVar[str] = OBB_OUTPUT_DOC

    def onnx_extra_channels(
        self, shapes: Sequence[Sequence[Any]], kpt_shape: Sequence[int] | None = None
    ) -> int:
        """Returns one channel after the class scores: the angle."""
        return 1
