"""Callbacks that record and disturb CLI training runs for the resume, fault and multi-node tests.

They are named in the test configs by class path (``fault_callbacks.RecordSamples``), so the runs go
through the real front door (``python -m yolo11_lightning fit``, torchrun, Lightning's DDP launcher);
the tests put this folder on PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn


def _attempt() -> int:
    """torchrun's restart count (0 outside torchrun)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def _skipped_steps(pl_module: L.LightningModule) -> int:
    """Steps the non-finite guard skipped so far, read from the device (its host copy is one step late)."""
    counters = pl_module.step_guard.counters()
    return int(counters[1]) if counters is not None else pl_module.step_guard.skipped


class FreezeBatchNorm(Callback):
    """BatchNorm in eval mode: per-rank batch statistics would differ between world sizes (ARCHITECTURE.md, world-size invariance)."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        for module in pl_module.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.eval()


class RecordSamples(Callback):
    """One JSON line per event and rank in ``out_dir/rank<R>-attempt<A>-pid<P>.jsonl``.

    ``start``: where training (re)started and which checkpoint IO the strategy uses. ``batch``: the sample
    ids, learning rates, skipped-step count and a parameter checksum after each training batch. ``end``:
    the raw (non-EMA) model weights are saved to ``final-rank<R>.pt``.
    """

    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)

    def _write(self, trainer: L.Trainer, record: dict) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        name = f"rank{trainer.global_rank}-attempt{_attempt()}-pid{os.getpid()}.jsonl"
        with open(self.out_dir / name, "a") as f:
            f.write(json.dumps({"rank": trainer.global_rank, "attempt": _attempt(), **record}) + "\n")

    def on_train_start(self, trainer, pl_module):
        self._write(trainer, {
            "event": "start", "checksum": float(sum(p.detach().double().abs().sum() for p in pl_module.model.parameters())), "world": trainer.world_size, "num_nodes": trainer.num_nodes,
            "global_step": trainer.global_step, "epoch": trainer.current_epoch,
            "checkpoint_io": type(trainer.strategy.checkpoint_io).__name__,
        })  # fmt: skip

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        with torch.no_grad():
            checksum = float(sum(p.detach().double().abs().sum() for p in pl_module.model.parameters()))
        self._write(trainer, {
            "event": "batch", "world": trainer.world_size, "epoch": trainer.current_epoch, "batch_idx": batch_idx,
            "global_step": trainer.global_step, "indices": batch["indices"].tolist(),
            "lr": [g["lr"] for g in trainer.optimizers[0].param_groups],
            "skipped": _skipped_steps(pl_module), "checksum": checksum,
        })  # fmt: skip

    def on_train_end(self, trainer, pl_module):
        self.out_dir.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().clone() for k, v in pl_module.model.state_dict().items()}
        torch.save(state, self.out_dir / f"final-rank{trainer.global_rank}.pt")
        self._write(trainer, {"event": "end", "global_step": trainer.global_step})


class StopAt(Callback):
    """All ranks end the process abruptly (``os._exit``, no clean-up) when batch ``(epoch, batch_idx)`` starts.

    Stands in for a job killed right after a checkpoint: nothing after it is saved. A barrier first, so
    every rank has left the previous step's collectives and no rank is left waiting for a dead one.
    """

    EXIT_CODE = 75

    def __init__(self, epoch: int, batch_idx: int) -> None:
        self.at = (epoch, batch_idx)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if (trainer.current_epoch, batch_idx) == self.at:
            trainer.strategy.barrier("stop_at")
            os._exit(self.EXIT_CODE)


class ShouldStopAt(Callback):
    """Asks the Trainer to stop (``trainer.should_stop``, as ``EarlyStopping`` or ``max_time``'s ``Timer`` do) at the
    end of batch ``(epoch, batch_idx)``, on every rank: a clean end of ``fit`` inside an epoch."""

    def __init__(self, epoch: int, batch_idx: int) -> None:
        self.at = (epoch, batch_idx)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if (trainer.current_epoch, batch_idx) == self.at:
            trainer.should_stop = True


class KillRankAt(Callback):
    """Rank ``rank`` SIGKILLs itself when batch ``(epoch, batch_idx)`` starts, in torchrun's first attempt only."""

    def __init__(self, rank: int, epoch: int, batch_idx: int) -> None:
        self.rank, self.at = rank, (epoch, batch_idx)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if (
            _attempt() == 0
            and trainer.global_rank == self.rank
            and (trainer.current_epoch, batch_idx) == self.at
        ):
            os.kill(os.getpid(), signal.SIGKILL)


class NaNLossOnRank(Callback):
    """Rank ``rank``'s loss becomes NaN at the given global steps (the model's outputs reaching the loss are
    poisoned, as a diverging model's would be); other ranks stay finite."""

    def __init__(self, rank: int, steps: list[int]) -> None:
        self.rank, self.steps = rank, set(steps)
        self.active = False

    def on_train_start(self, trainer, pl_module):
        pl_module.criterion.register_forward_pre_hook(self._poison)

    def _poison(self, module, inputs):
        if not self.active:
            return None
        feats, *rest = inputs
        return ([f * float("nan") for f in feats], *rest)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.active = trainer.global_rank == self.rank and trainer.global_step in self.steps


class RaiseOnRank(Callback):
    """Rank ``rank`` raises when global step ``step`` starts; the other ranks carry on into the collectives."""

    def __init__(self, rank: int, step: int) -> None:
        self.rank, self.step = rank, step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            raise RuntimeError(f"injected failure on rank {self.rank} at step {self.step}")


class HangOnRank(Callback):
    """Rank ``rank`` stops responding (sleeps) when global step ``step`` starts: the others wait in a collective."""

    def __init__(self, rank: int, step: int, seconds: float = 600.0) -> None:
        self.rank, self.step, self.seconds = rank, step, seconds

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            time.sleep(self.seconds)


class SlowBatches(Callback):
    """Every rank sleeps ``seconds`` after each training batch (after RecordSamples wrote it, before the
    checkpoint callbacks run), so a test can act mid-epoch: send a signal, cut a link."""

    def __init__(self, seconds: float = 0.3) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        time.sleep(self.seconds)


class FlatMetric(Callback):
    """The monitored validation mAP is 0 every epoch: best.ckpt is never improved on after epoch 0."""

    def on_validation_end(self, trainer, pl_module):
        trainer.callback_metrics["val/mAP50-95"] = torch.tensor(0.0)


class SlowValidation(Callback):
    """Every validation batch of training (not the sanity check) sleeps ``seconds`` after touching ``marker``,
    so a test can signal the run while it validates."""

    def __init__(self, marker: str, seconds: float = 1.0) -> None:
        self.marker, self.seconds = Path(marker), seconds

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if not trainer.sanity_checking:
            self.marker.touch()
            time.sleep(self.seconds)
