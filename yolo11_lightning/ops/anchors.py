"""Anchor points and the distance <-> box conversions shared by the Detect head and the loss."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def make_anchors(
    feature_shapes: Sequence[tuple[int, int]],
    strides: Sequence[int],
    offset: float = 0.5,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> tuple[Tensor, Tensor]:
    """Returns the anchor centre of every grid cell, level by level.

    Args:
        feature_shapes: (H, W) of each level map, finest first.
        strides: pixels per cell of each level (8, 16, 32 for YOLO11).
        offset: 0.5 puts the anchor at the cell centre.

    Returns:
        points: (A, 2) anchor centres (x, y) in grid units of their level.
        stride_tensor: (A, 1) the stride of each anchor, to scale points and boxes to pixels.
    """
    points, stride_list = [], []
    for (h, w), stride in zip(feature_shapes, strides):
        sx = torch.arange(w, device=device, dtype=dtype) + offset
        sy = torch.arange(h, device=device, dtype=dtype) + offset
        grid_y, grid_x = torch.meshgrid(sy, sx, indexing="ij")
        points.append(torch.stack((grid_x, grid_y), -1).view(-1, 2))
        stride_list.append(torch.full((h * w, 1), float(stride), dtype=dtype, device=device))
    return torch.cat(points), torch.cat(stride_list)


def dist_to_box(distance: Tensor, anchor_points: Tensor, xywh: bool = True, dim: int = -1) -> Tensor:
    """Turns left, top, right and bottom distances from anchor points into boxes.

    ``distance`` and ``anchor_points`` broadcast; ``dim`` is the axis holding the 4 distances / 2 coords.
    Returns xywh (centre, size) when ``xywh`` else xyxy, in the units of the inputs.
    """
    lt, rb = distance.chunk(2, dim)
    x1y1 = anchor_points - lt
    x2y2 = anchor_points + rb
    if xywh:
        return torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), dim)
    return torch.cat((x1y1, x2y2), dim)


def box_to_dist(anchor_points: Tensor, boxes_xyxy: Tensor, max_dist: float) -> Tensor:
    """Returns the left, top, right and bottom distances from anchor points to xyxy boxes.

    The distances are clamped to [0, max_dist].
    """
    x1y1, x2y2 = boxes_xyxy.chunk(2, -1)
    return torch.cat((anchor_points - x1y1, x2y2 - anchor_points), -1).clamp_(0, max_dist)
