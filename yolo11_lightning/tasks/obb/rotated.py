"""Rotated-box maths for oriented boxes ``xywhr``: centre x, y, width, height (any one unit) and the angle r in
radians (the width's direction, counter-clockwise from the x axis in image coordinates, y pointing down).

``probiou`` is the probabilistic IoU of two rotated boxes (Llerena et al., 2021, arXiv:2106.06072): each box is
the Gaussian with its centre as the mean and the covariance of a uniform distribution over it, and the overlap is
1 − the Hellinger distance derived from their Bhattacharyya distance. torchvision has no rotated-box measure.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["box_covariance", "corners", "dist_to_rotated_box", "probiou"]


def box_covariance(boxes: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Returns the covariance [[a, c], [c, b]] of each (..., 5) xywhr box's Gaussian as (..., 1) a, b, c.

    A uniform distribution over a w × h rectangle has variances w²/12 and h²/12 along its sides; rotating by r
    gives a = w²/12·cos²r + h²/12·sin²r, b = w²/12·sin²r + h²/12·cos²r, c = (w²/12 − h²/12)·cos r·sin r.
    """
    var_w, var_h = boxes[..., 2:3].square() / 12, boxes[..., 3:4].square() / 12
    angle = boxes[..., 4:5]
    cos, sin = angle.cos(), angle.sin()
    cos2, sin2 = cos.square(), sin.square()
    return var_w * cos2 + var_h * sin2, var_w * sin2 + var_h * cos2, (var_w - var_h) * cos * sin


def probiou(boxes1: Tensor, boxes2: Tensor, eps: float = 1e-7) -> Tensor:
    """Returns the elementwise probabilistic IoU of broadcastable (..., 5) xywhr boxes, about [0, 1).

    With Σ = Σ1 + Σ2 and Δ the centre difference, the Bhattacharyya distance is
    B = Δᵀ Σ⁻¹ Δ / 8 + ln(det Σ / (4·sqrt(det Σ1 · det Σ2))) / 2 (the determinants of Σ1, Σ2 clamped at 0),
    clamped to [eps, 100]; the result is 1 − sqrt(1 − exp(−B) + eps). ``eps`` also guards both divisions, where
    the reference places it (its numbers decide the assigner's rankings).
    """
    dx = boxes1[..., 0:1] - boxes2[..., 0:1]
    dy = boxes1[..., 1:2] - boxes2[..., 1:2]
    a1, b1, c1 = box_covariance(boxes1)
    a2, b2, c2 = box_covariance(boxes2)
    a, b, c = a1 + a2, b1 + b2, c1 + c2
    det = a * b - c.square()
    mahalanobis = (a * dy.square() + b * dx.square()) / (det + eps) * 0.25 + (c * -dx * dy) / (
        det + eps
    ) * 0.5
    det1, det2 = (a1 * b1 - c1.square()).clamp(min=0), (a2 * b2 - c2.square()).clamp(min=0)
    log_term = (det / (4 * (det1 * det2).sqrt() + eps) + eps).log() * 0.5
    bhattacharyya = (mahalanobis + log_term).clamp(eps, 100.0)
    hellinger = (1.0 - torch.exp(-bhattacharyya) + eps).sqrt()
    return (1 - hellinger).squeeze(-1)


def corners(boxes: Tensor) -> Tensor:
    """Returns the (..., 4, 2) corner points of (..., 5) xywhr boxes.

    Centre ± half width along r ± half height across it, in the order (+w, +h), (+w, −h), (−w, −h), (−w, +h).
    """
    centre, w, h, angle = boxes[..., :2], boxes[..., 2:3], boxes[..., 3:4], boxes[..., 4:5]
    cos, sin = angle.cos(), angle.sin()
    along = torch.cat((w / 2 * cos, w / 2 * sin), -1)
    across = torch.cat((-h / 2 * sin, h / 2 * cos), -1)
    return torch.stack(
        (centre + along + across, centre + along - across, centre - along - across, centre - along + across),
        -2,
    )


def dist_to_rotated_box(distance: Tensor, angle: Tensor, anchor_points: Tensor, dim: int = -1) -> Tensor:
    """Turns distances measured in a box's own rotated frame from an anchor point into its centre and size.

    The distances are left, top, right, bottom; the result is the centre (x, y) and size (w, h), in the
    inputs' units.

    ``distance`` (..., 4, ...) along ``dim``; ``angle`` the same shape with 1 there; ``anchor_points`` broadcast
    (2 along ``dim``). The centre is the anchor plus the frame offset ((r − l)/2, (b − t)/2) rotated by the angle.
    """
    lt, rb = distance.split(2, dim=dim)
    cos, sin = torch.cos(angle), torch.sin(angle)
    offset_x, offset_y = ((rb - lt) / 2).split(1, dim=dim)
    x, y = offset_x * cos - offset_y * sin, offset_x * sin + offset_y * cos
    return torch.cat((torch.cat((x, y), dim=dim) + anchor_points, lt + rb), dim=dim)
