"""The YOLO11-cls head: ``Classify``, on the classification backbone's last map (P5/32)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from yolo11_lightning.nn.blocks import Conv
from yolo11_lightning.nn.head import autocast_off

__all__ = ["HIDDEN", "Classify"]

HIDDEN = 1280  # width of the head's 1×1 conv (EfficientNet-B0's), at every scale


class Classify(nn.Module):
    """Conv1×1 c1→1280 (BN, SiLU), global average pool, dropout, Linear 1280→nc.

    Train mode: logits (B, nc). Eval mode: ``decode_outputs``, class probabilities (B, nc) float32 (softmax).
    """

    def __init__(self, c1: int, nc: int, hidden: int = HIDDEN, dropout: float = 0.0) -> None:
        super().__init__()
        self.nc = nc
        self.conv = Conv(c1, hidden, 1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.drop = nn.Dropout(p=dropout)
        self.linear = nn.Linear(hidden, nc)

    def outputs(self, xs: Sequence[Tensor]) -> Tensor:
        """Returns (B, nc) logits from the head's input maps, concatenated along channels when several."""
        x = torch.cat(list(xs), 1) if len(xs) > 1 else xs[0]
        return self.linear(self.drop(self.pool(self.conv(x)).flatten(1)))

    def forward(self, xs: list[Tensor]) -> Tensor:
        logits = self.outputs(xs)
        return logits if self.training else self.decode_outputs(logits)

    def decode_outputs(self, logits: Tensor) -> Tensor:
        """Converts (B, nc) logits to (B, nc) float32 probabilities."""
        with autocast_off(logits.device.type):
            return logits.float().softmax(1)

    def reset_classes(self, nc: int) -> None:
        """Builds a new linear layer for ``nc`` classes, initialised as PyTorch and the reference do."""
        ref = self.linear.weight
        self.linear = nn.Linear(self.linear.in_features, nc, device=ref.device, dtype=ref.dtype)
        self.nc = nc
