"""Callbacks that break a CLI run's data for tests/e2e/test_data_faults.py.

Named in the test command lines by class path (``data_faults.BreakImages``); the tests put this folder on
PYTHONPATH (``cli_runs.cli_env``).
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback


class BreakImages(Callback):
    """Rank 0 deletes ``delete`` and truncates ``corrupt`` (to 40 bytes), then every rank meets at a barrier.

    At the start of batch ``(epoch, batch_idx)``, or in ``setup`` (after the DataModule loaded its records)
    when ``at_setup``: a dataset going away under a running job.
    """

    def __init__(
        self,
        delete: list[str],
        corrupt: list[str],
        epoch: int = 0,
        batch_idx: int = 0,
        at_setup: bool = False,
    ) -> None:
        self.delete, self.corrupt = delete, corrupt
        self.at, self.at_setup = (epoch, batch_idx), at_setup

    def _break(self, trainer: L.Trainer) -> None:
        if trainer.global_rank == 0:
            for path in self.delete:
                os.remove(path)
            for path in self.corrupt:
                data = Path(path).read_bytes()
                Path(path).write_bytes(data[:40])
        trainer.strategy.barrier("break_images")

    def setup(self, trainer, pl_module, stage):
        if self.at_setup:
            self._break(trainer)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if not self.at_setup and (trainer.current_epoch, batch_idx) == self.at:
            self._break(trainer)


class RecordSubstitutes(Callback):
    """One JSON line per training batch and rank: sample ids and their substitutes (-1: none)."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.out_dir.mkdir(parents=True, exist_ok=True)
        row = {
            "rank": trainer.global_rank, "epoch": trainer.current_epoch, "batch_idx": batch_idx,
            "world": trainer.world_size, "indices": batch["indices"].tolist(),
            "substitutes": batch["substitutes"].tolist(),
        }  # fmt: skip
        with open(self.out_dir / f"rank{trainer.global_rank}-pid{os.getpid()}.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")


class CopyCheckpointAt(Callback):
    """Rank 0 copies the newest ``last*.ckpt`` to ``target`` when batch ``(epoch, batch_idx)`` starts."""

    def __init__(self, target: str, epoch: int, batch_idx: int) -> None:
        self.target, self.at = Path(target), (epoch, batch_idx)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_rank == 0 and (trainer.current_epoch, batch_idx) == self.at:
            # Not trainer.log_dir: it broadcasts from rank 0, a collective rank 0 must not run alone.
            found = Path(trainer.default_root_dir).glob("lightning_logs/*/checkpoints/last*.ckpt")
            found = sorted(found, key=lambda p: p.stat().st_mtime_ns)
            self.target.write_bytes(found[-1].read_bytes())  # the newest: written after the last step


class FullDiskForValidationImages(Callback):
    """Saving every picture fails as on a full disk (``ValidationImages`` and ``ResultPictures`` draw on rank 0
    only)."""

    def setup(self, trainer, pl_module, stage):
        from yolo11_lightning.training.callbacks import _pictures

        def no_space(path, image):
            raise OSError(errno.ENOSPC, "No space left on device", path)

        _pictures.save_rgb = no_space


class DropRecordOnRank(Callback):
    """The process of local rank ``rank`` loads split ``split`` without its image ``index``.

    Set up in ``__init__``, which runs in every rank's process before the DataModule loads anything: the
    stand-in for a node whose dataset copy lacks one file.
    """

    def __init__(self, rank: int, split: str, index: int) -> None:
        if int(os.environ.get("LOCAL_RANK", "0")) != rank:
            return
        from yolo11_lightning.training import datamodule

        original = datamodule.load_split

        def load_split(config, name, *args, **kwargs):
            records, report = original(config, name, *args, **kwargs)
            if name == split:
                records = records[:index] + records[index + 1 :]
            return records, report

        datamodule.load_split = load_split
