"""Task-aligned assignment on rotated boxes: the detection assigner with probiou as the overlap and a rotated
rectangle as the candidate region."""

from __future__ import annotations

from torch import Tensor

from yolo11_lightning.loss.assigner import TaskAlignedAssigner
from yolo11_lightning.tasks.obb.rotated import corners, probiou

__all__ = ["RotatedTaskAlignedAssigner"]


class RotatedTaskAlignedAssigner(TaskAlignedAssigner):
    """TaskAlignedAssigner for (N, 5) xywhr ground truths and (B, A, 5) xywhr predictions (pixels).

    Alignment = score^alpha · probiou(box, predicted box).clamp(0)^beta; an anchor is a candidate of a box when its
    centre lies in the rotated rectangle, edges included (the reference's test, without a margin). The assignment's
    ``target_boxes`` are (B, A, 5) xywhr.
    """

    @staticmethod
    def inside(anchor_points: Tensor, boxes: Tensor) -> Tensor:
        """Tells which anchor centres (A, 2) lie in each rotated box of (c, 5), edges included: (c, A) bool.

        With corners p1, p2, p4 of a box, a point p is inside when its projections on p1→p2 and p1→p4 lie within
        those sides: 0 <= (p − p1)·(p2 − p1) <= |p2 − p1|², and alike for p4.
        """
        points = corners(boxes)[:, None]  # (c, 1, 4, 2)
        first, second, fourth = points[..., 0, :], points[..., 1, :], points[..., 3, :]
        side_a, side_b = second - first, fourth - first
        to_anchor = anchor_points - first  # (c, A, 2)
        along_a, along_b = (to_anchor * side_a).sum(-1), (to_anchor * side_b).sum(-1)
        length_a, length_b = (side_a * side_a).sum(-1), (side_b * side_b).sum(-1)
        return (along_a >= 0) & (along_a <= length_a) & (along_b >= 0) & (along_b <= length_b)

    @staticmethod
    def overlap(gt_boxes: Tensor, pd_boxes: Tensor) -> Tensor:
        """Returns the elementwise probiou of broadcastable xywhr boxes."""
        return probiou(gt_boxes, pd_boxes)
