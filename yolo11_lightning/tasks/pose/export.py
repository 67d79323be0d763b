"""Pose estimation's export hooks for tasks.base.export: ONNX outputs, their shapes and metadata."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from yolo11_lightning.tasks.base.export import TaskExport

if TYPE_CHECKING:
    pass

__all__ = ["PoseExport"]

POSE_OUTPUT_DOC = (
    "(B, 4 + nc + K*D, A): cx, cy, w, h in input pixels, class scores, then per keypoint x, y in input pixels "
    "(and a visibility score in (0, 1) when D = 3); K, D: metadata kpt_shape; no NMS"
)


class PoseExport(TaskExport):
    """Pose estimation's export hooks, listed in the module docstring."""

    onnx_output_doc: ClassVar[str] = POSE_OUTPUT_DOC
    # A keypoint is its raw offset times 2·stride (64 px per unit at P5), twice a box side's DFL gain: measured
    # gaps reach 2x detection's on random reference weights (5.5e-4 at 160 px); 4 leaves a margin.
    onnx_tolerance_gain: ClassVar[float] = 4.0

    def onnx_metadata(self, model: Any) -> dict[str, str]:
        """Returns kpt_shape as a Python literal, as the reference's ONNX client reads it."""
        return {"kpt_shape": repr([int(v) for v in model.kpt_shape])}

    def onnx_extra_channels(
        self, shapes: Sequence[Sequence[Any]], kpt_shape: Sequence[int] | None = None
    ) -> int:
        """Returns K·D from the file's required kpt_shape metadata; the output's width alone cannot tell."""
        if kpt_shape is None:
            raise ValueError("a pose model's file must say its kpt_shape (metadata `kpt_shape`)")
        return int(kpt_shape[0]) * int(kpt_shape[1])
