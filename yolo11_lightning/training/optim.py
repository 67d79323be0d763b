"""Optimiser recipe of the reference trainer: parameter groups, nominal batch, warmup and LR schedule.

Every value here is a function of the global batch and global progress (epoch, global batch index),
never of the number of devices, so a run behaves the same on 1 or 64 GPUs and after a resume.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import nn

OptimizerName = Literal["SGD", "AdamW", "auto"]
LRScaling = Literal["none", "linear", "sqrt"]

# Norm layers whose weights get no weight decay (as the reference: every torch.nn norm class).
_NORM_TYPES = tuple(
    getattr(nn, name) for name in dir(nn) if "Norm" in name and isinstance(getattr(nn, name), type)
)


def parameter_groups(model: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter], list[nn.Parameter]]:
    """Split trainable parameters into (biases, norm weights, other weights).

    Biases and norm weights get no weight decay; only the third group (conv/linear weights) decays.
    """
    biases, norm_weights, weights = [], [], []
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if not param.requires_grad:
                continue
            if name == "bias":
                biases.append(param)
            elif isinstance(module, _NORM_TYPES):
                norm_weights.append(param)
            else:
                weights.append(param)
    return biases, norm_weights, weights


def nominal_accumulation(global_batch: int, nominal_batch: int = 64) -> int:
    """Batches accumulated per optimiser step so that each step sees about ``nominal_batch`` images."""
    return max(round(nominal_batch / global_batch), 1)


@dataclass
class OptimizerRecipe:
    """Hyper-parameters of the reference recipe (defaults = REFERENCE.md)."""

    name: OptimizerName = "SGD"
    lr0: float = 0.01
    lrf: float = 0.01
    momentum: float = 0.937
    weight_decay: float = 5e-4
    warmup_epochs: float = 3.0
    warmup_momentum: float = 0.8
    warmup_bias_lr: float = 0.1
    cos_lr: bool = False
    lr_scaling: LRScaling = "none"
    lr_reference_batch: int = 64
    nominal_batch: int = 64

    def resolve(self, global_batch: int, num_classes: int, total_iterations: int) -> OptimizerRecipe:
        """Concrete optimiser for this run: ``auto`` chosen, LR scaled by the batch rule.

        ``auto`` follows the reference: SGD (lr 0.01, momentum 0.9) for long runs (> 10k iterations at
        the nominal batch), else AdamW with an LR derived from the class count and no bias warmup.
        """
        recipe = OptimizerRecipe(**self.__dict__)
        if recipe.name == "auto":
            if total_iterations > 10_000:
                recipe.name, recipe.lr0, recipe.momentum = "SGD", 0.01, 0.9
            else:
                recipe.name, recipe.lr0, recipe.momentum = (
                    "AdamW",
                    round(0.002 * 5 / (4 + num_classes), 6),
                    0.9,
                )
                recipe.warmup_bias_lr = 0.0
        if recipe.lr_scaling != "none":
            ratio = global_batch / recipe.lr_reference_batch
            recipe.lr0 *= ratio if recipe.lr_scaling == "linear" else math.sqrt(ratio)
        return recipe


def build_optimizer(model: nn.Module, recipe: OptimizerRecipe, global_batch: int) -> torch.optim.Optimizer:
    """Optimiser with the three reference groups, in the order biases, decayed weights, norm weights.

    Group 0 must be the biases: the warmup ramps its LR from ``warmup_bias_lr`` down to lr0.
    Weight decay is scaled by the images per optimiser step over the nominal batch.
    """
    biases, norm_weights, weights = parameter_groups(model)
    accumulate = nominal_accumulation(global_batch, recipe.nominal_batch)
    decay = recipe.weight_decay * global_batch * accumulate / recipe.nominal_batch
    groups = [
        {"params": biases, "weight_decay": 0.0},
        {"params": weights, "weight_decay": decay},
        {"params": norm_weights, "weight_decay": 0.0},
    ]
    if recipe.name == "SGD":
        return torch.optim.SGD(groups, lr=recipe.lr0, momentum=recipe.momentum, nesterov=True)
    if recipe.name == "AdamW":
        return torch.optim.AdamW(groups, lr=recipe.lr0, betas=(recipe.momentum, 0.999))
    raise ValueError(f"optimizer must be 'SGD', 'AdamW' or 'auto', got {recipe.name!r}")


class WarmupSchedule:
    """LR and momentum per parameter group as a pure function of (global batch index, epoch).

    After warmup the LR factor follows ``lrf`` linearly (or by a cosine) over the epochs, stepped per
    epoch as the reference. During the first ``warmup_iters`` batches every group's LR rises from 0
    (group 0, the biases: falls from ``warmup_bias_lr``) to its scheduled value and momentum rises
    from ``warmup_momentum``. Being stateless, it resumes exactly from Lightning's loop counters.
    """

    def __init__(self, recipe: OptimizerRecipe, max_epochs: int, batches_per_epoch: int) -> None:
        self.recipe = recipe
        self.max_epochs = max(max_epochs, 1)
        self.batches_per_epoch = batches_per_epoch
        if recipe.warmup_epochs > 0:
            self.warmup_iters = max(round(recipe.warmup_epochs * batches_per_epoch), 100)
        else:
            self.warmup_iters = -1

    def lr_factor(self, epoch: int) -> float:
        """Multiplier of lr0 for a (0-based) epoch."""
        x, lrf, epochs = epoch, self.recipe.lrf, self.max_epochs
        if self.recipe.cos_lr:
            return ((1 - math.cos(x * math.pi / epochs)) / 2) * (lrf - 1) + 1
        return max(1 - x / epochs, 0) * (1.0 - lrf) + lrf

    def values(self, batch_index: int, epoch: int, num_groups: int) -> tuple[list[float], float]:
        """(LR of each group, momentum) for global batch ``batch_index`` (counted from the run's start)."""
        target = self.recipe.lr0 * self.lr_factor(epoch)
        if batch_index > self.warmup_iters:
            return [target] * num_groups, self.recipe.momentum
        xp = [0, self.warmup_iters]
        lrs = [
            float(np.interp(batch_index, xp, [self.recipe.warmup_bias_lr if g == 0 else 0.0, target]))
            for g in range(num_groups)
        ]
        momentum = float(np.interp(batch_index, xp, [self.recipe.warmup_momentum, self.recipe.momentum]))
        return lrs, momentum

    def accumulation(self, batch_index: int, global_batch: int) -> int:
        """Batches per optimiser step at global batch ``batch_index``.

        As the reference: 1 at the start, rising to nominal_batch / global_batch over the warmup (more,
        smaller steps while the LR ramps up), then the nominal-batch count.
        """
        if batch_index > self.warmup_iters:
            return nominal_accumulation(global_batch, self.recipe.nominal_batch)
        ramp = np.interp(batch_index, [0, self.warmup_iters], [1, self.recipe.nominal_batch / global_batch])
        return max(1, round(float(ramp)))

    def apply(self, optimizer: torch.optim.Optimizer, batch_index: int, epoch: int) -> None:
        """Write this batch's LR and momentum into the optimiser's groups."""
        lrs, momentum = self.values(batch_index, epoch, len(optimizer.param_groups))
        for group, lr in zip(optimizer.param_groups, lrs):
            group["lr"] = lr
            if "momentum" in group:
                group["momentum"] = momentum
            elif "betas" in group:
                group["betas"] = (momentum, group["betas"][1])
