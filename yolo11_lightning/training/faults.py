"""Skipping optimiser steps whose loss is not finite, the same way on every rank.

A NaN or inf loss on one rank poisons the all-reduced gradients of every rank, so the only safe move is
for all ranks to drop that optimiser step together. Deciding together needs no extra message: the module
already sums the per-rank loss terms over ranks every step, and a non-finite term on any rank makes that
sum non-finite on all of them. ``NonFiniteStepGuard`` keeps those (already reduced) flags on the device
until the optimiser step, then reads them once: every rank reads the same value, takes the same branch
and reaches the same collectives, so a bad batch never turns into a hang.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


class NonFiniteLossError(RuntimeError):
    """Raised on every rank when too many consecutive optimiser steps had a non-finite loss."""


class NonFiniteStepGuard:
    """Counts optimiser steps skipped for a non-finite loss and stops after ``max_consecutive`` in a row.

    Call ``observe`` with the loss terms of each micro-batch (reduced over ranks when distributed) and
    ``should_skip`` once per optimiser step, after backward. A step is skipped when any micro-batch of its
    accumulation window was non-finite: the gradients it accumulated are unusable.

    Args:
        max_consecutive: consecutive skipped steps that end the run with ``NonFiniteLossError``
            (0: never stop, only skip).
    """

    def __init__(self, max_consecutive: int = 10) -> None:
        if max_consecutive < 0:
            raise ValueError(f"max_skipped_steps must be >= 0, got {max_consecutive}")
        self.max_consecutive = max_consecutive
        self.skipped = 0
        self.consecutive = 0
        self._pending: list[Tensor] = []

    def observe(self, loss_terms: Tensor) -> None:
        """Record one micro-batch's loss terms (any shape); stays on the device, no host sync."""
        self._pending.append(~torch.isfinite(loss_terms.detach()).all())

    def should_skip(self) -> bool:
        """Decide for the optimiser step now due; one host read of the flags observed since the last call.

        Raises:
            NonFiniteLossError: this is the ``max_consecutive``-th skipped step in a row.
        """
        if not self._pending:
            return False
        bad = bool(torch.stack(self._pending).any())
        self._pending.clear()
        if not bad:
            self.consecutive = 0
            return False
        self.skipped += 1
        self.consecutive += 1
        if self.max_consecutive and self.consecutive >= self.max_consecutive:
            raise NonFiniteLossError(
                f"the loss was NaN/inf in {self.consecutive} consecutive optimiser steps (limit "
                f"model.max_skipped_steps={self.max_consecutive}; {self.skipped} skipped in this run): training "
                "has diverged or the data is broken. Lower model.lr0, keep warmup on, check the dataset with "
                "`yolo11-lightning check-data`, or resume from an earlier checkpoint."
            )
        return True

    def state_dict(self) -> dict[str, Any]:
        """Counters, and whether the open accumulation window (one carried over an epoch end) saw a
        non-finite loss: a resume then skips that window's step as the uninterrupted run would."""
        state: dict[str, Any] = {"skipped": self.skipped, "consecutive": self.consecutive}
        if self._pending and bool(torch.stack(self._pending).any()):
            state["window_nonfinite"] = True
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.skipped = int(state.get("skipped", 0))
        self.consecutive = int(state.get("consecutive", 0))
        self._pending.clear()
        if state.get("window_nonfinite"):
            self._pending.append(torch.tensor(True))
