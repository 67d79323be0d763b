"""Optimiser recipe of the reference trainer: parameter groups, nominal batch, ``auto``, warmup and LR schedule.

Every value here is a function of the global batch and global progress (epoch, global batch index),
never of the number of devices, so a run behaves the same on 1 or 64 GPUs and after a resume.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from yolo11_lightning.errors import UserInputError

OptimizerName = Literal["SGD", "AdamW", "auto"]
LRScaling = Literal["none", "linear", "sqrt"]

# Norm layers whose weights get no weight decay (as the reference: every torch.nn norm class).
_NORM_TYPES = tuple(
    getattr(nn, name) for name in dir(nn) if "Norm" in name and isinstance(getattr(nn, name), type)
)


def parameter_groups(model: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter], list[nn.Parameter]]:
    """Splits trainable parameters into biases, norm weights and other weights.

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
    """Returns the batches accumulated per optimiser step so each step sees about ``nominal_batch`` images."""
    return max(round(nominal_batch / global_batch), 1)


@dataclass
class OptimizerRecipe:
    """Hyper-parameters of the reference recipe (defaults: the reference trainer's; ``docs/defaults.md``).

    ``warmup_target_momentum`` is the momentum the warmup ramps to when it differs from the optimiser's own
    (``auto`` builds SGD with momentum 0.9 but, like the reference, still ramps 0.8 -> the configured 0.937;
    None: ``momentum``).
    """

    name: OptimizerName = "auto"
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
    warmup_target_momentum: float | None = None

    def state_dict(self) -> dict[str, Any]:
        """Returns plain values for a checkpoint; from_state_dict reads them back."""
        return dict(self.__dict__)

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> OptimizerRecipe:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in state.items() if k in known})

    def describe(self) -> str:
        """Describes the recipe in one line for logs: SGD(lr0=0.01, momentum=0.937, warmup_bias_lr=0.1)."""
        return f"{self.name}(lr0={self.lr0:g}, momentum={self.momentum:g}, warmup_bias_lr={self.warmup_bias_lr:g})"

    def resolve(self, global_batch: int, num_classes: int, total_iterations: int) -> OptimizerRecipe:
        """Returns the concrete optimiser for this run: auto chosen, the LR scaled by the batch rule.

        ``auto`` follows the reference trainer: with ``total_iterations = ceil(train images / max(global
        batch, nominal batch)) * epochs``, SGD(lr0 0.01, momentum 0.9) when it exceeds 10,000, else
        AdamW(lr0 = round(0.002 * 5 / (4 + classes), 6), beta1 0.9). Both ignore the configured lr0 and
        momentum and set ``warmup_bias_lr`` to 0; the warmup still ramps momentum towards the configured
        value (the reference does), which only SGD groups have.
        """
        recipe = OptimizerRecipe(**self.__dict__)
        if recipe.name == "auto":
            if total_iterations > 10_000:
                recipe.name, recipe.lr0 = "SGD", 0.01
            else:
                recipe.name, recipe.lr0 = "AdamW", round(0.002 * 5 / (4 + num_classes), 6)
            recipe.warmup_target_momentum, recipe.momentum = self.momentum, 0.9
            recipe.warmup_bias_lr = 0.0
        if recipe.lr_scaling != "none":
            ratio = global_batch / recipe.lr_reference_batch
            recipe.lr0 *= ratio if recipe.lr_scaling == "linear" else math.sqrt(ratio)
        return recipe


def choose_recipe(
    recipe: OptimizerRecipe, global_batch: int, num_classes: int, num_samples: int | None, max_epochs: int
) -> tuple[OptimizerRecipe, str]:
    """Chooses a run's concrete recipe and the log line that says what was chosen.

    ``auto`` is decided from the training-set size, batch and epochs; with ``num_samples`` None (not told) it
    is refused in one line.
    """
    if recipe.name != "auto":
        resolved = recipe.resolve(global_batch, num_classes, total_iterations=0)
        return resolved, f"optimizer: {resolved.describe()}"
    if num_samples is None:
        raise UserInputError(
            "optimizer 'auto' chooses from the training-set size, which this run does not tell: use "
            "YOLODataModule (or a datamodule with a `num_train_samples` attribute), or set "
            "model.optimizer to SGD or AdamW"
        )
    max_epochs = max(max_epochs, 1)
    iterations = math.ceil(num_samples / max(global_batch, recipe.nominal_batch)) * max_epochs
    resolved = recipe.resolve(global_batch, num_classes, iterations)
    said = (
        f"optimizer 'auto' chose {resolved.describe()}: {iterations} iterations (ceil({num_samples} images / "
        f"max(batch {global_batch}, nominal {recipe.nominal_batch})) x {max_epochs} epochs) "
        f"{'>' if resolved.name == 'SGD' else '<='} 10000; lr0 and momentum of the config are ignored"
    )
    return resolved, said


def build_optimizer(model: nn.Module, recipe: OptimizerRecipe, global_batch: int) -> torch.optim.Optimizer:
    """Builds the optimiser with the three reference groups: biases, decayed weights, norm weights.

    Group 0 must be the biases: the warmup ramps its LR from ``warmup_bias_lr`` down to lr0.
    Weight decay is scaled by the images per optimiser step over the nominal batch.

    PyTorch's fused kernel where the parameters' device has one (CUDA, CPU, ...): one launch per step, and it
    skips an update on a device flag (``found_inf``), which lets the non-finite guard skip a step without
    reading the device. The same update rule as the reference's (foreach) SGD/AdamW, to float rounding.
    """
    biases, norm_weights, weights = parameter_groups(model)
    accumulate = nominal_accumulation(global_batch, recipe.nominal_batch)
    decay = recipe.weight_decay * global_batch * accumulate / recipe.nominal_batch
    groups = [
        {"params": biases, "weight_decay": 0.0},
        {"params": weights, "weight_decay": decay},
        {"params": norm_weights, "weight_decay": 0.0},
    ]
    fused = _fused_kernels_for([*biases, *weights, *norm_weights])
    if recipe.name == "SGD":
        optimizer = torch.optim.SGD(
            groups, lr=recipe.lr0, momentum=recipe.momentum, nesterov=True, fused=fused
        )
        if fused:
            # Fused SGD starts its momentum buffers uninitialised when its first step is skipped; zeros give
            # the first step's rule exactly (buffer = gradient, dampening 0) and survive a skipped step.
            for param in optimizer.param_groups[0]["params"] + weights + norm_weights:
                optimizer.state[param]["momentum_buffer"] = torch.zeros_like(param)
        return optimizer
    if recipe.name == "AdamW":
        return torch.optim.AdamW(groups, lr=recipe.lr0, betas=(recipe.momentum, 0.999), fused=fused)
    if recipe.name == "auto":
        raise ValueError("optimizer 'auto' must be resolved first (OptimizerRecipe.resolve)")
    raise ValueError(f"optimizer must be 'SGD', 'AdamW' or 'auto', got {recipe.name!r}")


# Device types with fused SGD/AdamW kernels (PyTorch's own list, plus a registered out-of-tree device).
_FUSED_DEVICES = ("cuda", "cpu", "xpu", "mps")


def _fused_kernels_for(params: list[nn.Parameter]) -> bool | None:
    """Tells whether every parameter is a float tensor on a device with fused kernels: True, else None.

    None keeps PyTorch's default, foreach.
    """
    devices = {*_FUSED_DEVICES, torch._C._get_privateuse1_backend_name()}
    ok = all(
        p.device.type in devices and p.dtype in (torch.float32, torch.float16, torch.bfloat16) for p in params
    )
    return True if params and ok else None


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
        """Returns the multiplier of lr0 for a 0-based epoch."""
        x, lrf, epochs = epoch, self.recipe.lrf, self.max_epochs
        if self.recipe.cos_lr:
            return ((1 - math.cos(x * math.pi / epochs)) / 2) * (lrf - 1) + 1
        return max(1 - x / epochs, 0) * (1.0 - lrf) + lrf

    @property
    def target_momentum(self) -> float:
        """The momentum the warmup ends at."""
        target = self.recipe.warmup_target_momentum
        return self.recipe.momentum if target is None else target

    def values(self, batch_index: int, epoch: int, num_groups: int) -> tuple[list[float], float | None]:
        """Returns each group's LR and the SGD momentum at the run's global batch ``batch_index``.

        Momentum is None when the optimiser keeps its own (no warmup): the reference sets it only while
        warming up, so afterwards it stays at the warmup's last value (``target_momentum``).
        """
        target = self.recipe.lr0 * self.lr_factor(epoch)
        if batch_index > self.warmup_iters:
            return [target] * num_groups, (self.target_momentum if self.warmup_iters >= 0 else None)
        xp = [0, self.warmup_iters]
        lrs = [
            float(np.interp(batch_index, xp, [self.recipe.warmup_bias_lr if g == 0 else 0.0, target]))
            for g in range(num_groups)
        ]
        momentum = float(np.interp(batch_index, xp, [self.recipe.warmup_momentum, self.target_momentum]))
        return lrs, momentum

    def accumulation(self, batch_index: int, global_batch: int) -> int:
        """Returns the batches per optimiser step at global batch ``batch_index``.

        As the reference: 1 at the start, rising to nominal_batch / global_batch over the warmup (more,
        smaller steps while the LR ramps up), then the nominal-batch count.
        """
        if batch_index > self.warmup_iters:
            return nominal_accumulation(global_batch, self.recipe.nominal_batch)
        ramp = np.interp(batch_index, [0, self.warmup_iters], [1, self.recipe.nominal_batch / global_batch])
        return max(1, round(float(ramp)))

    def apply(self, optimizer: torch.optim.Optimizer, batch_index: int, epoch: int) -> None:
        """Write this batch's LR, and SGD's momentum, into the optimiser's groups.

        Adam-style betas are left as built, as the reference does (it ramps only groups with a momentum).
        """
        lrs, momentum = self.values(batch_index, epoch, len(optimizer.param_groups))
        for group, lr in zip(optimizer.param_groups, lrs):
            group["lr"] = lr
            if momentum is not None and "momentum" in group:
                group["momentum"] = momentum
