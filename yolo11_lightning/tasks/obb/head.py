"""The YOLO11-obb head: ``OBB``, the detection head plus one rotation angle per anchor."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from yolo11_lightning.nn.blocks import Conv
from yolo11_lightning.nn.head import Detect, autocast_off, output_branch
from yolo11_lightning.tasks.obb.rotated import dist_to_rotated_box

__all__ = ["OBB", "ObbOutput"]


class ObbOutput(NamedTuple):
    """Train-mode output of ``OBB`` (what ``ObbLoss`` takes).

    maps: the detection level maps (B, 4·reg_max + nc, H_i, W_i), the box distances measured in each box's own
    rotated frame; angles: (B, 1, A) rotation in radians, in [−π/4, 3π/4), anchors in the maps' order.
    """

    maps: list[Tensor]
    angles: Tensor


class OBB(Detect):
    """Detect plus a rotation per anchor: the box sides' distances are read in the box's rotated frame.

    Angle branch ``cv4[i]``: Conv3×3→c4, Conv3×3→c4, Conv2d 1×1→1 (bias), c4 = max(ch[0] // 4, 1); the angle is
    (sigmoid(logit) − 1/4)·π radians.

    Train mode returns an ``ObbOutput``; eval mode (B, 4 + nc + 1, A) float32: the rotated boxes' centre x, y and
    width, height in input pixels, the sigmoid class scores, then the angle.
    """

    def __init__(
        self, nc: int, ch: Sequence[int], strides: Sequence[int] = (8, 16, 32), reg_max: int = 16, ne: int = 1
    ) -> None:
        super().__init__(nc, ch, strides, reg_max)
        self.ne = ne
        c4 = max(self.ch[0] // 4, ne)
        self.cv4 = nn.ModuleList(
            nn.Sequential(Conv(c, c4, 3), Conv(c4, c4, 3), nn.Conv2d(c4, ne, 1)) for c in ch
        )

    def outputs(self, xs: Sequence[Tensor]) -> ObbOutput:
        """Returns the raw train-mode outputs whatever the mode, the angles in radians."""
        bs = xs[0].shape[0]
        logits = torch.cat([output_branch(self.cv4[i], x).view(bs, self.ne, -1) for i, x in enumerate(xs)], 2)
        return ObbOutput(self.level_maps(xs), (logits.sigmoid() - 0.25) * math.pi)

    def forward(self, xs: list[Tensor]) -> ObbOutput | Tensor:  # type: ignore[override]
        out = self.outputs(xs)
        return out if self.training else self.decode_outputs(out)

    def decode_outputs(self, out: ObbOutput) -> Tensor:  # type: ignore[override]
        """Decodes an ObbOutput to (B, 4 + nc + 1, A) float32: rotated xywh in input pixels, scores, angle.

        The angle is in radians. Computed in float32 as ``Detect.decode``.
        """
        maps = out.maps
        with autocast_off(maps[0].device.type):
            flat = torch.cat([m.flatten(2) for m in maps], 2).float()
            box, cls = flat.split((4 * self.reg_max, self.nc), 1)
            points, strides = self.anchors(maps, torch.float32)
            angles = out.angles.float()
            boxes = dist_to_rotated_box(self.dfl(box), angles, points.unsqueeze(0), dim=1) * strides
            return torch.cat((boxes, cls.sigmoid(), angles), 1)
