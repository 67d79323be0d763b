"""UnreadableImages: the images the loaders could not read, counted, logged, named once and limited."""

from __future__ import annotations

import logging
import math
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from yolo11_lightning.training.step_exchange import StepExchange

log = logging.getLogger(__name__)


class SubstitutionLimitError(RuntimeError):
    """Too many training images could not be read: the run stops (on every rank together)."""


class UnreadableImages(Callback):
    """Counts, logs and limits the images the loaders could not read; names each file once.

    Training batches carry ``substitutes`` (a sample's own unreadable image was replaced) and
    ``unreadable`` ((path, reason) pairs); evaluation batches carry ``missing`` (images left out of the
    metric, logged per validation as ``val/missing_images``, summed over ranks). Under DDP the substitution
    counts travel with the training step's all-reduce (``step_exchange.StepExchange``: no collective of their
    own, every rank sees the same sum one optimiser step later) and are summed once more at each epoch end;
    they are logged as the run total ``train/substituted_samples``. (With a module that has no step exchange,
    they are summed every ``trainer.log_every_n_steps`` batches and at each epoch's last batch.) When
    more samples of one epoch were substituted than ``max_substituted_fraction`` of the training set
    (at least ``min_limit``), every rank raises ``SubstitutionLimitError`` at the same batch: no hang.

    The limit comes from the DataModule (``max_substituted_fraction``) when it has one.
    """

    def __init__(self, max_substituted_fraction: float | None = None, min_limit: int = 8) -> None:
        self.max_substituted_fraction = max_substituted_fraction
        self.min_limit = min_limit
        self.total = 0
        self.epoch = -1
        self.epoch_count = 0
        self._pending = (
            0  # this rank's substitutions since the last sum over ranks (modules without an exchange)
        )
        self._sent = 0  # this rank's substitutions in this fit, sent through the step exchange
        self._received = 0  # every rank's, as the exchange last agreed
        self._exchange: StepExchange | None = None  # the module's, under DDP
        self._logged_total = 0
        self._named: set[str] = set()
        self._missing = 0

    def fraction(self, trainer: L.Trainer) -> float | None:
        """Returns the share of the training set one epoch may substitute; None or >= 1 sets no limit."""
        if self.max_substituted_fraction is not None:
            return self.max_substituted_fraction
        return getattr(trainer.datamodule, "max_substituted_fraction", 0.01)

    def limit(self, trainer: L.Trainer) -> int | None:
        """Returns the most substituted samples one epoch may have; None sets no limit."""
        fraction = self.fraction(trainer)
        if fraction is None or fraction >= 1:
            return None
        datamodule = trainer.datamodule
        train = getattr(datamodule, "datasets", {}).get("train") if datamodule is not None else None
        return max(self.min_limit, math.floor(fraction * (len(train) if train is not None else 0)))

    def _name(self, unreadable: list[tuple[str, str]], what: str) -> None:
        for path, reason in unreadable:
            if path not in self._named:
                self._named.add(path)
                log.warning("unreadable image %s (%s): %s", path, reason, what)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._sent = self._received = 0  # the step exchange starts afresh with every fit
        exchange = getattr(pl_module, "step_exchange", None)
        self._exchange = exchange if trainer.world_size > 1 and isinstance(exchange, StepExchange) else None

    def _newly_agreed(self) -> int:
        """Returns the substitutions of every rank the step exchange agreed on since the last call."""
        if self._exchange is None:
            return 0
        summed = int(self._exchange.agreed.get("substituted", 0.0))
        # The epoch-end sum may have counted further than the exchange has agreed yet.
        count, self._received = max(summed - self._received, 0), max(summed, self._received)
        return count

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        exchange = getattr(pl_module, "step_exchange", None)
        if trainer.world_size > 1 and isinstance(exchange, StepExchange) and isinstance(batch, dict):
            # Counted before the batch's training step, so that its exchange carries them to every rank.
            self._sent += self._local_count(batch)
            exchange.set("substituted", float(self._sent))

    @staticmethod
    def _local_count(batch: dict) -> int:
        local = batch.get("substituted")
        if local is None and "substitutes" in batch:
            local = int((batch["substitutes"] != -1).sum())
        return int(local or 0)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not isinstance(batch, dict) or "substitutes" not in batch:
            return
        self._name(batch.get("unreadable", []), "training uses a substitute image in its place")
        if self._exchange is not None:
            # Every rank's count as the step exchange agreed it (one optimiser step late): no extra collective.
            count = self._newly_agreed()
        elif trainer.world_size > 1:
            self._pending += self._local_count(batch)
            # The same batches on every rank: a batch-index interval and the epoch's last batch.
            every = max(int(trainer.log_every_n_steps or 1), 1)
            if (batch_idx + 1) % every and not trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
                return
            summed = trainer.strategy.reduce(
                torch.tensor(float(self._pending), device=pl_module.device), reduce_op="sum"
            )
            count, self._pending = round(float(summed)), 0
        else:
            count = self._local_count(batch)
        self._add(trainer, pl_module, count)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        exchange = getattr(pl_module, "step_exchange", None)
        if trainer.world_size > 1 and isinstance(exchange, StepExchange):
            # The epoch's last batches have not travelled with a step exchange yet: count them now, one
            # all-reduce per epoch, so that the epoch's limit sees every substitution of the epoch.
            summed = round(float(trainer.strategy.reduce(
                torch.tensor(float(self._sent), device=pl_module.device), reduce_op="sum"
            )))  # fmt: skip
            count, self._received = max(summed - self._received, 0), max(summed, self._received)
            self._add(trainer, pl_module, count)

    def _add(self, trainer: L.Trainer, pl_module: L.LightningModule, count: int) -> None:
        """Counts more substituted samples, summed over ranks; logs a changed total and stops at the limit."""
        if trainer.current_epoch != self.epoch:
            self.epoch, self.epoch_count = trainer.current_epoch, 0
        self.total += count
        self.epoch_count += count
        if self.total != self._logged_total:  # also counts taken in by a checkpoint save since the last batch
            self._logged_total = self.total
            pl_module.log(
                "train/substituted_samples",
                torch.tensor(float(self.total)),
                rank_zero_only=True,
                batch_size=1,
            )
        limit = self.limit(trainer)
        if limit is not None and self.epoch_count > limit:
            raise SubstitutionLimitError(
                f"{self.epoch_count} training samples of epoch {self.epoch} had an unreadable image and were "
                f"replaced by substitutes, more than the limit of {limit} (data.max_substituted_fraction="
                f"{self.fraction(trainer)} of the training set, at least {self.min_limit}): the data is "
                "going away under the run; check its storage (the warnings above name the files)"
            )

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._missing = 0

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if isinstance(batch, dict) and batch.get("unreadable"):
            self._name(batch["unreadable"], "left out of the validation metric")
            self._missing += int(batch.get("missing", 0))

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Logs val/missing_images, summed over ranks, when an image could not be scored."""
        if trainer.sanity_checking:
            return
        count = self._missing
        if trainer.world_size > 1:  # every rank runs this hook: the collective is matched
            summed = trainer.strategy.reduce(
                torch.tensor(float(count), device=pl_module.device), reduce_op="sum"
            )
            count = round(float(summed))
        if count:
            pl_module.log("val/missing_images", float(count), rank_zero_only=True)

    def state_dict(self) -> dict[str, Any]:
        # The checkpoint callbacks read the last step's exchange before saving: its count belongs in here.
        count = self._newly_agreed()
        self.total += count
        self.epoch_count += count
        return {"total": self.total, "epoch": self.epoch, "epoch_count": self.epoch_count}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.total = int(state_dict.get("total", 0))
        self.epoch = int(state_dict.get("epoch", -1))
        self.epoch_count = int(state_dict.get("epoch_count", 0))
        self._logged_total = self.total
