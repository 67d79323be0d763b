"""Exponential moving average of the weights with the reference's ramped decay, on Lightning's WeightAveraging."""

from __future__ import annotations

import math
from typing import Any

import torch
from lightning.pytorch.callbacks import WeightAveraging
from torch import Tensor


def ramped_decay(updates: int, decay: float = 0.9999, tau: float = 2000.0) -> float:
    """EMA decay after ``updates`` optimiser steps: small at first so the average follows early training."""
    return decay * (1 - math.exp(-updates / tau))


class ModelEMA(WeightAveraging):
    """EMA of every float parameter and buffer (BatchNorm statistics included), updated after each optimiser step.

    ``decay(u) = decay * (1 - exp(-u / tau))`` where ``u`` counts updates. Lightning's ``WeightAveraging`` copies
    the model at the first update (the reference blends with decay(1) ~ 5e-4 there: a negligible difference),
    then calls the averaging function with the number of earlier updates, so the k-th update uses ``u = k`` as
    the reference. Integer buffers (``num_batches_tracked``) are copied.
    Validation and the saved ``state_dict`` use the averaged weights; the raw weights travel in the checkpoint
    as ``current_model_state`` so a resume continues both.
    """

    def __init__(self, decay: float = 0.9999, tau: float = 2000.0, **kwargs: Any) -> None:
        self.decay = decay
        self.tau = tau
        super().__init__(multi_avg_fn=self._blend, **kwargs)

    def _blend(self, averaged: list[Tensor], current: list[Tensor], num_averaged: Tensor) -> None:
        # One call per (device, dtype) group; foreach ops keep this a handful of kernels, not one per tensor.
        if not averaged[0].is_floating_point():
            torch._foreach_copy_(averaged, current)
            return
        d = ramped_decay(int(num_averaged) + 1, self.decay, self.tau)
        torch._foreach_lerp_(averaged, current, 1.0 - d)
