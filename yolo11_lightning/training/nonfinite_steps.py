"""Skipping optimiser steps whose loss is not finite, the same way on every rank, without stalling the host.

A NaN or inf loss on one rank poisons the all-reduced gradients of every rank, so the only safe move is
for all ranks to drop that optimiser step together. Deciding together needs no extra message: the loss items
are summed over ranks every step (``training.step_exchange``), and a non-finite term on any rank makes that sum
non-finite on all of them. ``NonFiniteStepGuard`` keeps the flag on the device and hands it to the optimiser as
``found_inf``, the flag PyTorch's fused SGD/AdamW kernels skip an update on (the mechanism of ``GradScaler``):
every rank skips the same step and the host never reads the flag. The counters (skipped steps, skipped in a
row) stay on the device too; the module reads them one optimiser step later, through the step exchange's
deferred copy, to warn and to stop the run after too many in a row. An optimiser that cannot take
``found_inf`` gets the same decision from one host read per step (``should_skip``). ``step_unless_nonfinite``
is the optimiser step that hands the flag on: as ``found_inf``, or under a ``GradScaler`` as non-finite gradients.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor


class NonFiniteLossError(RuntimeError):
    """Raised on every rank when too many consecutive optimiser steps had a non-finite loss."""


class NonFiniteStepGuard:
    """Counts optimiser steps skipped for a non-finite loss and stops after ``max_consecutive`` in a row.

    Per micro-batch ``observe`` the loss terms (reduced over ranks when distributed); per optimiser step
    ``close_window`` returns the step's flag (float 0/1 on the device: 1 = skip) and advances the device
    counters; ``read`` takes those counters back as host numbers (one step later) and raises at the limit.
    A step is skipped when any micro-batch of its accumulation window was non-finite.

    Args:
        max_consecutive: consecutive skipped steps that end the run with ``NonFiniteLossError``
            (0: never stop, only skip).
    """

    def __init__(self, max_consecutive: int = 10) -> None:
        if max_consecutive < 0:
            raise ValueError(f"max_skipped_steps must be >= 0, got {max_consecutive}")
        self.max_consecutive = max_consecutive
        self.skipped = 0  # host copies, as of the last ``read``
        self.consecutive = 0
        self.precision: str | None = None  # the Trainer's precision, for the error message
        self._window: Tensor | None = None  # device bool: a non-finite loss in the open window
        self._restored_window = False  # a checkpoint's open window had one
        self._counters: Tensor | None = None  # device (3,): [last step skipped, skipped, in a row]

    def observe(self, loss_terms: Tensor) -> None:
        """Records one micro-batch's loss terms of any shape; stays on the device, without a host sync."""
        bad = ~torch.isfinite(loss_terms.detach()).all()
        if self._restored_window:
            bad = torch.ones_like(bad)
            self._restored_window = False
        self._window = bad if self._window is None else self._window | bad

    def close_window(self) -> Tensor | None:
        """Returns the due optimiser step's flag, a float 0/1 on the device; None if nothing was observed.

        Advances the device counters as if the step were skipped when the flag is 1.
        """
        if self._window is None and self._restored_window:  # a step with no loss since the resume
            self._window, self._restored_window = torch.tensor(True), False
        if self._window is None:
            return None
        flag = self._window.float()
        self._window = None
        if self._counters is None:  # once per fit: the counters restored from a checkpoint go to the device
            self._counters = torch.tensor([0.0, self.skipped, self.consecutive], device=flag.device)
        skipped = self._counters[1] + flag
        consecutive = (self._counters[2] + flag) * flag
        self._counters = torch.stack((flag, skipped, consecutive))
        return flag

    def counters(self) -> Tensor | None:
        """Returns the (3,) device counters [last skipped, skipped, skipped in a row] as of close_window."""
        return self._counters

    def read(self, counters: list[float]) -> bool:
        """Take the counters back as host numbers; True if that step was skipped.

        Raises:
            NonFiniteLossError: that step was the ``max_consecutive``-th skipped step in a row.
        """
        last, self.skipped, self.consecutive = bool(counters[0]), int(counters[1]), int(counters[2])
        if last and self.max_consecutive and self.consecutive >= self.max_consecutive:
            raise NonFiniteLossError(self._message())
        return last

    def should_skip(self) -> bool:
        """Closes the window and decides at once by a host read, for optimisers that cannot take found_inf."""
        if self.close_window() is None:
            return False
        return self.read(self._counters.tolist())

    def _message(self) -> str:
        advice = (
            "Lower model.lr0, keep warmup on, check the dataset with `yolo11-lightning check-data`, or resume "
            "from an earlier checkpoint."
        )
        if self.precision is not None and self.precision.startswith("16"):
            advice = (
                "Under 16-mixed this is often fp16 overflowing in the forward pass rather than divergence (the "
                "GradScaler only guards the backward pass): train with --trainer.precision bf16-mixed (fp32's "
                "range; Ampere GPUs and newer) or 32-true first. If it persists there: " + advice
            )
        return (
            f"the loss was NaN/inf in {self.consecutive} consecutive optimiser steps (limit "
            f"model.max_skipped_steps={self.max_consecutive}; {self.skipped} skipped in this run): training has "
            f"diverged or the data is broken. {advice}"
        )

    def state_dict(self) -> dict[str, Any]:
        """Returns the counters, and whether the open accumulation window saw a non-finite loss.

        The open window may be one carried over an epoch end; a resume then skips that window's step as the
        uninterrupted run would. It reads the device: for checkpoints, not for every step.
        """
        if self._counters is not None:
            _, skipped, consecutive = self._counters.tolist()
            self.skipped, self.consecutive = int(skipped), int(consecutive)
        state: dict[str, Any] = {"skipped": self.skipped, "consecutive": self.consecutive}
        if self._restored_window or (self._window is not None and bool(self._window)):
            state["window_nonfinite"] = True
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.skipped = int(state.get("skipped", 0))
        self.consecutive = int(state.get("consecutive", 0))
        self._counters = None
        self._window = None
        # Kept on the host until the first observed loss says which device the flags live on.
        self._restored_window = bool(state.get("window_nonfinite", False))


def step_unless_nonfinite(
    guard: NonFiniteStepGuard, optimizer: Any, scaler: Any, closure: Callable[[], Any]
) -> bool:
    """Steps the optimiser unless a loss of this step's batches was NaN or inf on any rank.

    Returns True when the step was skipped by a host decision; the caller warns then.

    The flag stays on the device: the optimiser gets it as ``found_inf`` (PyTorch's fused SGD/AdamW skip the
    update on it, as under a GradScaler), and under a GradScaler (``scaler``) a skipped step's gradients are
    made non-finite so that the scaler skips it. An optimiser that takes no ``found_inf`` gets the decision
    from one host read per step. ``closure`` hands the already computed loss back to ``optimizer.step``.
    """
    flag = guard.close_window()
    torch_optimizer = getattr(optimizer, "optimizer", optimizer)
    if flag is not None and scaler is None and not torch_optimizer.defaults.get("fused"):
        # An optimiser that takes no found_inf: decide on the host (one read per step).
        if guard.read(guard.counters().tolist()):
            optimizer.zero_grad(set_to_none=True)
            return True
        optimizer.step(closure=closure)
        return False
    if flag is not None and scaler is not None:
        poison_gradients(torch_optimizer, flag)  # the scaler's own check then skips the step
    elif flag is not None:
        torch_optimizer.found_inf = flag
    try:
        optimizer.step(closure=closure)
    finally:
        torch_optimizer.__dict__.pop("found_inf", None)
    return False


def poison_gradients(optimizer: torch.optim.Optimizer, flag: Tensor) -> None:
    """Adds inf to every gradient when ``flag`` is 1, so a GradScaler skips the step by its own check.

    Nothing is added when it is 0. The check stays on the device: one fused add over the gradients per step, a
    few microseconds on a GPU.
    """
    grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if grads:
        torch._foreach_add_(grads, torch.where(flag > 0, float("inf"), 0.0))
