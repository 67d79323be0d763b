"""The learning-rate monitor of the default callbacks, which stays quiet when the Trainer has no logger."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import LearningRateMonitor


class LearningRates(LearningRateMonitor):
    """Lightning's ``LearningRateMonitor`` (every parameter group's learning rate and momentum, per step), except
    that a Trainer without a logger (``--trainer.logger false``, ``fast_dev_run``'s dummy logger aside) runs
    without it instead of failing at the start of training: there is nowhere to log to, nothing to do."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._without_logger = False

    def on_train_start(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        self._without_logger = not trainer.loggers
        if not self._without_logger:
            super().on_train_start(trainer, *args, **kwargs)

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        if not self._without_logger:
            super().on_train_batch_start(trainer, *args, **kwargs)

    def on_train_epoch_start(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        if not self._without_logger:
            super().on_train_epoch_start(trainer, *args, **kwargs)
