"""What ONNX export and reading an ONNX file back ask of a task, with detection's answers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from yolo11_lightning.nn.yolo11 import YOLO11

__all__ = ["TaskExport"]

OUTPUT_DOC = "(B, 4 + nc, A): cx, cy, w, h in input pixels, then class scores; no NMS"


class TaskExport:
    """ONNX export and reading an ONNX file back: the task's hooks, listed in the module docstring."""

    onnx_outputs: ClassVar[tuple[str, ...]] = ("output0",)
    onnx_output_doc: ClassVar[str] = OUTPUT_DOC
    # The export check's tolerance (``export.onnx.onnx_tolerance``) times this: a task whose decode amplifies
    # float32 rounding more than the box decode's does allows more.
    onnx_tolerance_gain: ClassVar[float] = 1.0

    def onnx_output_axes(self, dynamic: bool) -> list[dict[int, str]]:
        """Names each ONNX output's free axes, in onnx_outputs order.

        The free axes are the batch, and the anchors when the image height and width are free (``dynamic``).
        """
        return [{0: "batch", 2: "anchors"} if dynamic else {0: "batch"}]

    def onnx_output_dims(self, model: YOLO11, size: tuple[int, int], dynamic: bool) -> list[dict[int, int]]:
        """Returns per ONNX output the axes whose length is known; shape inference leaves them symbolic."""
        known = {1: 4 + model.num_classes + self.extra_channels(model)}
        if not dynamic:
            known[2] = sum((size[0] // s) * (size[1] // s) for s in model.strides)
        return [known]

    def onnx_output_order(self, shapes: Sequence[Sequence[Any]]) -> list[int]:
        """Finds where each of onnx_outputs is among an ONNX file's outputs, given their shapes."""
        return list(range(len(shapes)))

    def onnx_num_classes(self, shape: Sequence[Any], extra: int) -> int | None:
        """Returns the class count an ONNX file's first output shape implies; None if its axis is symbolic.

        Raises ValueError when the shape is not this task's (B, 4 + nc + extra, A).
        """
        if len(shape) != 3:
            raise ValueError(
                f"output {list(shape)} is not (B, 4 + nc, A); an export with NMS inside the graph (end-to-end) "
                "is not supported"
            )
        return shape[1] - 4 - extra if isinstance(shape[1], int) else None

    def onnx_metadata(self, model: YOLO11) -> dict[str, str]:
        """Returns what an ONNX file of ``model`` says beyond every task's metadata; for pose, kpt_shape."""
        return {}

    def onnx_extra_channels(
        self, shapes: Sequence[Sequence[Any]], kpt_shape: Sequence[int] | None = None
    ) -> int:
        """Returns the prediction channels after the class scores in an ONNX file.

        The file's outputs have ``shapes`` (in ``onnx_outputs`` order) and its metadata says ``kpt_shape`` (or
        not: None). Raises ValueError when they are not this task's.
        """
        return 0
