"""What each training step on the emu device (``tests/helpers/emulated_gpu.py``) did: host syncs and collectives.

``--trainer.callbacks+=emulated_audit.StepAudit --trainer.callbacks.out_dir DIR`` writes ``DIR/rank<r>.json``
at the end of fit: per training batch, everything recorded from the end of the previous batch to the end of
this one (data fetch, Lightning's loop, forward, loss, backward, optimiser step, callbacks), by site, with the
batch's global step and whether Lightning writes the logs after its accumulation window (``logs``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import emulated_gpu as emu
import lightning as L


class StepAudit(L.Callback):
    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)
        self.rows: list[dict[str, Any]] = []
        self._marks = (0, 0)
        self._logs = False

    def _mark(self) -> None:
        self._marks = (len(emu.LOG.host_syncs), len(emu.LOG.collectives))

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._mark()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # type: ignore[no-untyped-def]
        # Lightning's own rule: the loggers write after the optimiser step of this accumulation window.
        self._logs = bool(trainer._logger_connector.should_update_logs)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # type: ignore[no-untyped-def]
        syncs = emu.LOG.host_syncs[self._marks[0] :]
        collectives = emu.LOG.collectives[self._marks[1] :]
        self.rows.append({
            "epoch": trainer.current_epoch, "batch_idx": batch_idx, "global_step": trainer.global_step,
            "device": str(pl_module.device),
            # The module also logs the loss items at an epoch's last batch (for callbacks that monitor them).
            "logs": self._logs or trainer.fit_loop.epoch_loop.batch_progress.is_last_batch,
            "host_syncs": [[what, where] for what, where in syncs],
            "collectives": [[op, n, where] for op, n, where in collectives],
        })  # fmt: skip
        self._mark()

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        out = {"rank": trainer.global_rank, "world": trainer.world_size, "batches": self.rows,
               "log_every_n_steps": trainer.log_every_n_steps}  # fmt: skip
        (self.out_dir / f"rank{trainer.global_rank}.json").write_text(json.dumps(out, indent=1))
