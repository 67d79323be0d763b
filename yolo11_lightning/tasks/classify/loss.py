"""YOLO11-cls loss: cross-entropy of the logits against the image labels, the mean over the global batch.

``loss, items = ClassificationLoss()(logits, labels)``: logits (B, nc) (the train-mode output of
``create_model(scale, nc, task="classify")``), labels (B,) integer classes in [0, nc); ``items`` the detached (1,)
``(cls,)``, equal to ``loss``. ``loss`` equals the reference's ``v8ClassificationLoss`` (``F.cross_entropy``, mean).

World-size invariance: ``sum_over_ranks`` (as ``DetectionLoss``) receives ``[images, Σ cross-entropy]``; the loss
is this rank's sum divided by max(global images, 1), so the ranks' gradients summed equal one process holding the
whole batch, and the item is the global batch's mean.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["ClassificationLoss"]


class ClassificationLoss(nn.Module):
    """Mean cross-entropy over the (global) batch; see the module docstring."""

    def __init__(self, sum_over_ranks: Callable[[Tensor], Tensor] | None = None) -> None:
        super().__init__()
        self.sum_over_ranks = sum_over_ranks

    def forward(self, logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        if logits.ndim != 2 or labels.shape != logits.shape[:1]:
            raise ValueError(
                f"ClassificationLoss: logits {tuple(logits.shape)} and labels {tuple(labels.shape)}, expected "
                "(B, nc) and (B,)"
            )
        with torch.autocast(logits.device.type, enabled=False):
            logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
            total = F.cross_entropy(logits, labels.to(logits.device).long(), reduction="sum")
            count = logits.new_full((1,), float(logits.shape[0]))  # a host number: no device read
            local = torch.cat((count, total.detach()[None]))
            summed = self.sum_over_ranks(local) if self.sum_over_ranks is not None else local
            divisor = summed[0].clamp(min=1)
            return total / divisor, summed[1:] / divisor
