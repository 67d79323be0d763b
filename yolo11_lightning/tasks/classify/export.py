"""Classification's export hooks for tasks.base.export: ONNX outputs, their shapes and metadata."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from yolo11_lightning.tasks.base.export import TaskExport

__all__ = ["ClassifyExport"]


class ClassifyExport(TaskExport):
    """Classification's export hooks, listed in the module docstring."""

    onnx_output_doc: ClassVar[str] = "(B, nc): class probabilities (softmax)"

    def onnx_output_axes(self, dynamic: bool) -> list[dict[int, str]]:
        return [{0: "batch"}]

    def onnx_output_dims(self, model: Any, size: tuple[int, int], dynamic: bool) -> list[dict[int, int]]:
        return [{1: model.num_classes}]

    def onnx_num_classes(self, shape: Sequence[Any], extra: int) -> int | None:
        if len(shape) != 2:
            raise ValueError(f"output {list(shape)} is not a classifier's (B, nc) probabilities")
        return shape[1] if isinstance(shape[1], int) else None
