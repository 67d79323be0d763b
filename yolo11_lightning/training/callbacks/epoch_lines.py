"""Progress as one line per epoch, for output that is not a terminal (a redirected log, CI, a batch job).

Lightning's progress bars redraw themselves with carriage returns and cursor-up escapes: in a file, a 2.5-minute
quickstart leaves 148 KB of them. The CLI uses ``EpochLines`` instead when stdout is not a TTY
(``lightning_cli.progress_for_output``); ``--trainer.enable_progress_bar false`` prints neither, and a progress
bar named in ``--trainer.callbacks`` (``lightning.pytorch.callbacks.TQDMProgressBar``) is used as given.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ProgressBar


def _value(value: Any) -> str:
    number = float(value.item() if hasattr(value, "item") else value)
    return f"{number:.4g}"


class EpochLines(ProgressBar):
    """After each training epoch (and its validation), one line on stdout from global rank zero::

        epoch 3/20: 16 batches in 9 s (1.78 it/s); train/box_loss 2.41, ..., img/s 28.6; val/mAP50-95 0.0123, ...

    The training values are the progress bar's (the newest step's), the validation ones the epoch's scalars
    (per-class values, ``val/AP/<class>``, are left to metrics.csv and the closing summary).
    """

    def __init__(self) -> None:
        super().__init__()
        self._enabled = True
        self._started = 0.0
        self._batches = 0

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._started, self._batches = time.monotonic(), 0

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._batches += 1

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._enabled:
            return
        batches = self._batches
        seconds = max(time.monotonic() - self._started, 1e-9)
        shown = self.get_metrics(trainer, pl_module).items()
        train = {k: v for k, v in shown if k != "v_num" and not k.startswith("val/")}
        val = {
            k: v
            for k, v in trainer.callback_metrics.items()
            if k.startswith("val/") and k.count("/") == 1 and getattr(v, "numel", lambda: 1)() == 1
        }
        parts = [
            f"epoch {trainer.current_epoch + 1}/{trainer.max_epochs}: {batches} batches in {seconds:.0f} s "
            f"({batches / seconds:.2f} it/s)",
            ", ".join(f"{k} {_value(v)}" for k, v in train.items() if not isinstance(v, str | dict)),
            ", ".join(f"{k} {_value(v)}" for k, v in sorted(val.items())),
        ]
        sys.stdout.write("; ".join(p for p in parts if p) + "\n")
        sys.stdout.flush()
