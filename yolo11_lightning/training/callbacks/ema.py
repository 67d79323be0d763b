"""Exponential moving average of the weights with the reference's ramped decay, on Lightning's WeightAveraging."""

from __future__ import annotations

import itertools
import math
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import WeightAveraging
from torch import Tensor


def ramped_decay(updates: int, decay: float = 0.9999, tau: float = 2000.0) -> float:
    """Returns the EMA decay after ``updates`` optimiser steps, small at first to follow early training."""
    return decay * (1 - math.exp(-updates / tau))


class ModelEMA(WeightAveraging):
    """EMA of every float parameter and buffer (BatchNorm statistics included), updated after each optimiser step.

    ``decay(u) = decay * (1 - exp(-u / tau))`` where ``u`` counts updates. Lightning's ``WeightAveraging`` copies
    the model at the first update (the reference blends with decay(1) ~ 5e-4 there: a negligible difference),
    then calls the averaging function with the number of earlier updates, so the k-th update uses ``u = k`` as
    the reference. Integer buffers (``num_batches_tracked``) are copied.
    Validation and the saved ``state_dict`` use the averaged weights; the raw weights travel in the checkpoint
    as ``current_model_state`` so a resume continues both.

    Speed (the update runs after every optimiser step): the tensor pairs are listed once per fit and blended
    with one ``foreach`` call per (device, dtype) group; the update count is kept as a Python int (read from
    the averaged model once per fit, so resuming continues it), so no step reads a device value back to the
    host. The averaged copy is created by Lightning before the strategy moves the module to its device;
    ``on_fit_start`` moves it next to the module so the blend never crosses devices.
    """

    def __init__(self, decay: float = 0.9999, tau: float = 2000.0, **kwargs: Any) -> None:
        self.decay = decay
        self.tau = tau
        super().__init__(multi_avg_fn=self._blend, **kwargs)
        self._groups: list[tuple[list[Tensor], list[Tensor], bool]] | None = None
        self._updates: int | None = None

    def _blend(self, averaged: list[Tensor], current: list[Tensor], num_averaged: Tensor | int) -> None:
        """Blends one device and dtype group: copies integer tensors, lerps float ones by 1 - decay(n + 1).

        ``num_averaged`` may be a tensor (``AveragedModel.update_parameters``) or an int (the fast path).
        """
        if not averaged[0].is_floating_point():
            torch._foreach_copy_(averaged, current)
            return
        d = ramped_decay(int(num_averaged) + 1, self.decay, self.tau)
        torch._foreach_lerp_(averaged, current, 1.0 - d)

    # ------------------------------------------------------------------------------------ device
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # `setup` (where Lightning builds the copy) runs before the strategy moves the module: without this
        # the average stays on the CPU and every update copies the whole model device -> host.
        if self._average_model is not None and self._device is None:
            self._average_model.to(pl_module.device)
        self._groups = None  # tensors may have moved: list them again at the first update
        self._updates = None

    # ------------------------------------------------------------------------------------ update
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        # The parent's rule (once per optimiser step, when should_update says so) with a faster update.
        step_idx = trainer.global_step - 1
        if trainer.global_step > self._latest_update_step and self.should_update(step_idx=step_idx):
            self._update(pl_module)
            self._latest_update_step = trainer.global_step

    def _tensor_groups(self, pl_module: L.LightningModule) -> list[tuple[list[Tensor], list[Tensor], bool]]:
        """Groups (averaged, current, is_float) lists per device and dtype, as AveragedModel pairs them."""
        average = self._average_model
        assert average is not None
        pairs = zip(
            itertools.chain(average.module.parameters(), average.module.buffers()),
            itertools.chain(pl_module.parameters(), pl_module.buffers()),
        )
        groups: dict[tuple[torch.device, torch.dtype], tuple[list[Tensor], list[Tensor]]] = {}
        for averaged, current in pairs:
            if averaged.device != current.device or averaged.dtype != current.dtype:
                return []  # unusual placement (e.g. an explicit CPU average of a GPU model): generic path
            group = groups.setdefault((averaged.device, averaged.dtype), ([], []))
            group[0].append(averaged.detach())
            group[1].append(current.detach())
        return [(a, c, a[0].is_floating_point()) for a, c in groups.values()]

    @torch.no_grad()
    def _update(self, pl_module: L.LightningModule) -> None:
        average = self._average_model
        assert average is not None
        if self._groups is None:
            self._groups = self._tensor_groups(pl_module) if average.use_buffers else []
        if not self._groups:
            # Generic path: Lightning's own update (buffers copied, devices converted).
            average.update_parameters(pl_module)
            self._updates = None
            return
        if self._updates is None:  # one host read per fit: resuming continues the count from the checkpoint
            self._updates = int(average.n_averaged)
        for averaged, current, is_float in self._groups:
            if self._updates == 0 or not is_float:
                torch._foreach_copy_(averaged, current)
            else:
                self._blend(averaged, current, self._updates)
        average.n_averaged += 1  # on the device: no sync
        self._updates += 1
