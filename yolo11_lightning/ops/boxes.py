"""Box overlap measures used by the loss and the assigner.

Format conversions and pairwise IoU come straight from ``torchvision.ops`` (``box_convert``, ``box_iou``).
The complete IoU (CIoU) here is written out because YOLO11 places its ``eps`` where torchvision does not,
and the assigner's choices (top-k ranking, tie-breaks) follow those exact numbers.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torchvision.ops import box_convert

__all__ = ["complete_iou", "cxcywh_to_xyxy"]


def cxcywh_to_xyxy(boxes: Tensor) -> Tensor:
    """Converts centre/size boxes of shape (..., 4) to corner boxes in the same units.

    The same conversion as torchvision's box_convert.
    """
    return box_convert(boxes, "cxcywh", "xyxy")


def complete_iou(boxes1: Tensor, boxes2: Tensor, eps: float = 1e-7) -> Tensor:
    """Returns the elementwise complete IoU of xyxy boxes, YOLO11's variant; the two inputs broadcast.

    Args:
        boxes1, boxes2: (..., 4) boxes ``x1, y1, x2, y2`` in the same units (any), broadcastable.
        eps: guards the divisions. It is added to both heights (so to the areas and the aspect
            ratios), to the union, to the squared enclosing diagonal and to the ``alpha`` denominator.

    Returns:
        (...) CIoU in [-1.5, 1]: IoU - centre distance² / enclosing diagonal² - alpha·v, with the
        trade-off weight ``alpha`` treated as a constant (no gradient), as in the CIoU paper.

    Why not torchvision: ``complete_box_iou`` (pairwise N x M) and ``complete_box_iou_loss``
    (elementwise) use the raw heights in the areas and aspect ratios and ``inter / (union + eps)``
    with an eps-free union. In float64 on random boxes both differ from YOLO11's formula by up to
    ~1e-5 relative (1e-6 absolute) for boxes under a few units, larger than the parity we hold the
    loss to (1e-6 relative). ``complete_box_iou_loss`` also fills its intersections through a
    boolean mask, a device-to-host sync on GPU.
    """
    b1x1, b1y1, b1x2, b1y2 = boxes1.unbind(-1)
    b2x1, b2y1, b2x2, b2y2 = boxes2.unbind(-1)
    w1, h1 = b1x2 - b1x1, b1y2 - b1y1 + eps
    w2, h2 = b2x2 - b2x1, b2y2 - b2y1 + eps

    inter = (torch.minimum(b1x2, b2x2) - torch.maximum(b1x1, b2x1)).clamp(min=0) * (
        torch.minimum(b1y2, b2y2) - torch.maximum(b1y1, b2y1)
    ).clamp(min=0)
    union = w1 * h1 + w2 * h2 - inter + eps
    iou = inter / union

    # Smallest enclosing box diagonal² and centre distance² (the DIoU penalty).
    cw = torch.maximum(b1x2, b2x2) - torch.minimum(b1x1, b2x1)
    ch = torch.maximum(b1y2, b2y2) - torch.minimum(b1y1, b2y1)
    diag2 = cw.pow(2) + ch.pow(2) + eps
    dist2 = ((b2x1 + b2x2 - b1x1 - b1x2).pow(2) + (b2y1 + b2y2 - b1y1 - b1y2).pow(2)) / 4

    # Aspect-ratio consistency v and its weight alpha (a constant for the gradient).
    v = (4 / math.pi**2) * (torch.atan(w2 / h2) - torch.atan(w1 / h1)).pow(2)
    with torch.no_grad():
        alpha = v / (v - iou + (1 + eps))
    return iou - (dist2 / diag2 + v * alpha)
