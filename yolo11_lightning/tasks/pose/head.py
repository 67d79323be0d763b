"""The YOLO11-pose head: ``Pose``, the detection head plus K·D keypoint channels per anchor."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from yolo11_lightning.nn.blocks import Conv
from yolo11_lightning.nn.head import Detect, autocast_off, output_branch

__all__ = ["Pose", "PoseOutput"]


class PoseOutput(NamedTuple):
    """Train-mode output of ``Pose`` (what ``PoseLoss`` takes).

    maps: the detection level maps (B, 4·reg_max + nc, H_i, W_i); keypoints: (B, K·D, A) raw keypoint channels,
    per keypoint (x, y[, visibility logit]), anchors in the maps' order (P3, P4, P5, each row-major).
    """

    maps: list[Tensor]
    keypoints: Tensor


class Pose(Detect):
    """Detect plus keypoints: ``K·D`` channels per anchor for ``kpt_shape`` (K keypoints, D = 2 or 3 values).

    Keypoint branch ``cv4[i]``: Conv3×3→c4, Conv3×3→c4, Conv2d 1×1→K·D (bias), c4 = max(ch[0] // 4, K·D).
    A keypoint's raw (x, y) are offsets from its anchor's cell: x = (2·raw_x + cell_x) · stride pixels, with
    cell_x the anchor's column (its centre minus 0.5); the third value is a visibility logit.

    Train mode returns a ``PoseOutput``; eval mode (B, 4 + nc + K·D, A) float32: ``Detect.decode`` then the
    keypoints decoded (``decode_keypoints``).
    """

    def __init__(
        self, nc: int, ch: Sequence[int], strides: Sequence[int] = (8, 16, 32), reg_max: int = 16,
        kpt_shape: tuple[int, int] = (17, 3),
    ) -> None:  # fmt: skip
        super().__init__(nc, ch, strides, reg_max)
        self.kpt_shape = (int(kpt_shape[0]), int(kpt_shape[1]))
        self.nk = self.kpt_shape[0] * self.kpt_shape[1]
        c4 = max(self.ch[0] // 4, self.nk)
        self.cv4 = nn.ModuleList(
            nn.Sequential(Conv(c, c4, 3), Conv(c4, c4, 3), nn.Conv2d(c4, self.nk, 1)) for c in ch
        )

    def outputs(self, xs: Sequence[Tensor]) -> PoseOutput:
        """Returns the raw train-mode outputs, whatever the mode."""
        bs = xs[0].shape[0]
        keypoints = torch.cat(
            [output_branch(self.cv4[i], x).view(bs, self.nk, -1) for i, x in enumerate(xs)], 2
        )
        return PoseOutput(self.level_maps(xs), keypoints)

    def forward(self, xs: list[Tensor]) -> PoseOutput | Tensor:  # type: ignore[override]
        out = self.outputs(xs)
        return out if self.training else self.decode_outputs(out)

    def decode_outputs(self, out: PoseOutput) -> Tensor:  # type: ignore[override]
        """Decodes a PoseOutput to (B, 4 + nc + K·D, A) float32: boxes, scores, then input-pixel keypoints."""
        return torch.cat((self.decode(out.maps), self.decode_keypoints(out.keypoints, out.maps)), 1)

    def decode_keypoints(self, keypoints: Tensor, maps: Sequence[Tensor]) -> Tensor:
        """Decodes (B, K·D, A) raw keypoints to float32: per keypoint x, y in input pixels and any visibility.

        The visibility, when D = 3, is in (0, 1); the shape stays (B, K·D, A).
        """
        k, d = self.kpt_shape
        with autocast_off(keypoints.device.type):
            points, strides = self.anchors(maps, torch.float32)  # (2, A) cell centres in grid units, (1, A)
            raw = keypoints.float().unflatten(1, (k, d))  # (B, K, D, A)
            xy = (raw[:, :, :2] * 2.0 + (points - 0.5)) * strides
            decoded = torch.cat((xy, raw[:, :, 2:].sigmoid()), 2) if d == 3 else xy
            return decoded.flatten(1, 2)
