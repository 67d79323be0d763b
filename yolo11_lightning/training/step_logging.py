"""Read the training step's values back on the host: rarely, and the same way on every rank.

The loss items are read once per optimiser step on the steps Lightning's loggers write (``logs_this_batch``); the
non-finite guard's counters come back one optimiser step late through the step exchange's deferred copy
(``training.step_exchange``), or with the loss items on a log step. ``StepLog`` keeps what those reads need
between steps: the last batch's items, the step whose counters are in flight, the epoch's loss sums.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import lightning as L
import torch
from torch import Tensor

from yolo11_lightning.training.nonfinite_steps import NonFiniteStepGuard
from yolo11_lightning.training.step_exchange import StepExchange

log = logging.getLogger(__name__)


def logs_this_batch(trainer: L.Trainer) -> bool:
    """Tells whether the loss items are read back and logged after this batch.

    They are on the optimiser steps Lightning's loggers write (every ``log_every_n_steps``, Lightning's own
    rule ``should_update_logs``; every step under ``fast_dev_run``), and on an epoch's last batch and the
    run's last step, so that the callbacks (``EarlyStopping``, ``ModelCheckpoint`` on a training loss) always
    find the newest values there.
    """
    if trainer.fast_dev_run:
        return True
    epoch_loop = trainer.fit_loop.epoch_loop
    if epoch_loop.batch_progress.is_last_batch:
        return True
    if epoch_loop._should_accumulate():
        return False
    if trainer.max_steps > 0 and trainer.global_step + 1 >= trainer.max_steps:
        return True
    return bool(getattr(trainer._logger_connector, "should_update_logs", True))


class StepLog:
    """Logs the loss items and the skipped-step count of the training steps, and warns about a skipped step once.

    Args:
        guard: the module's non-finite step guard (its counters are read here).
        exchange: the module's step exchange (the guard's counters travel with its flags).
    """

    def __init__(self, guard: NonFiniteStepGuard, exchange: StepExchange) -> None:
        self.guard = guard
        self.exchange = exchange
        self.published_step = -1  # the optimiser step whose values the exchange's pending copy holds
        self.warned_step = -1  # the last skipped step warned about
        self.items: Tensor | None = None  # the last training batch's loss items (device), logged on log steps
        self.batch_images = 0
        self.epoch_loss_sums: list[float] = []  # the loss items read back this epoch, summed (host)
        self.epoch_loss_reads = 0

    def start_fit(self) -> None:
        """Starts a fit with nothing exchanged or warned about yet."""
        self.exchange.reset()
        self.published_step = self.warned_step = -1

    def start_epoch(self) -> None:
        self.epoch_loss_sums, self.epoch_loss_reads = [], 0

    def keep(self, items: Tensor, batch_images: int) -> None:
        """Keeps this batch's device loss items, logged after the optimiser step on log steps."""
        self.items, self.batch_images = items, batch_images

    def log_step(self, log_value: Callable[..., None], step: int, names: Sequence[str], warn: bool) -> None:
        """Logs the loss items and the skipped-step count of optimiser step ``step``, its one host read.

        The items are ``train/<name>_loss``, logged on the steps the loggers write. The progress bar and the
        loggers then hold host values (a device value logged every step would be read back every step). With
        ``warn`` this rank, rank 0, warns.
        """
        counters = self.guard.counters()
        parts = [self.items.detach().float().flatten(), *([counters.float()] if counters is not None else [])]
        host = torch.cat([p.to(parts[0].device) for p in parts]).cpu()
        items = host[: len(names)].tolist()
        self.epoch_loss_sums = [a + b for a, b in zip(self.epoch_loss_sums or [0.0] * len(items), items)]
        self.epoch_loss_reads += 1
        for name, value in zip(names, host):
            log_value(f"train/{name}_loss", value, prog_bar=True, batch_size=self.batch_images)
        if counters is not None:
            self.read_guard(host[len(names) :].tolist(), step, warn)
        if self.guard.skipped:
            log_value("train/skipped_steps", torch.tensor(float(self.guard.skipped)), rank_zero_only=True)

    def publish(self, step: int) -> None:
        """Starts the exchange of optimiser step ``step``'s values, the guard's counters beside the flags."""
        self.exchange.publish(self.guard.counters())
        self.published_step = step

    def settle(self, warn: bool) -> None:
        """Reads what the last optimiser step published: warns about a skipped step, raises at the limit.

        At the limit it raises ``NonFiniteLossError``; reading a step twice does nothing more.
        """
        if self.exchange.advance() and self.exchange.extra:
            self.read_guard(self.exchange.extra, self.published_step, warn)

    def read_guard(self, counters: list[float], step: int, warn: bool) -> None:
        """Reads the guard's counters of optimiser step ``step`` on the host; warns once if it was skipped."""
        if self.guard.read(counters) and step != self.warned_step:
            self.skipped(step, warn)

    def skipped(self, step: int, warn: bool) -> None:
        """Warns, on the warning rank, that optimiser step ``step`` was skipped."""
        self.warned_step = step
        if warn:
            guard = self.guard
            log.warning(
                "step %d: NaN/inf loss on at least one rank; optimiser step skipped on all ranks "
                "(%d skipped, %d in a row, limit %d)", step, guard.skipped, guard.consecutive, guard.max_consecutive,
            )  # fmt: skip

    def epoch_loss_means(self, names: Sequence[str]) -> dict[str, float]:
        """Returns this epoch's loss items, train/<name>_loss, averaged over the steps they were read at."""
        if not self.epoch_loss_reads:
            return {}
        reads = self.epoch_loss_reads
        return {f"train/{n}_loss": v / reads for n, v in zip(names, self.epoch_loss_sums)}
