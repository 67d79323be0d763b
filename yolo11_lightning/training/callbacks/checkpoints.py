"""The two checkpoints of a run: ``best.ckpt`` follows validation mAP, ``last.ckpt`` is always the newest state.

Since Lightning 2.6, ``ModelCheckpoint(save_last=True)`` writes ``last.ckpt`` only when a top-k checkpoint is
saved at the same step: while the monitored mAP does not improve, ``last.ckpt`` goes stale and a resume
silently repeats every epoch since the last improvement. So ``last`` has its own callback, ``LastCheckpoint``,
a ``ModelCheckpoint`` without a monitor that writes ``last.ckpt``:

- after every training epoch (whatever validation did);
- every ``every_n_train_steps`` optimiser steps, when set;
- every ``every_n_minutes`` of training (default 10), so a hard kill (OOM, node loss) loses at most that;
- when the job is asked to stop (SIGTERM; SIGUSR1 under SLURM; Ctrl-C), then it ends the run with
  ``TrainingPreempted`` (exit 143 / 138 / 130; under SLURM after ``scontrol requeue``), saying what it kept.

Mid-epoch saves happen only right after an optimiser step, where no gradient is half accumulated, so resuming
from any of them repeats and skips no sample. None is made after an epoch's last batch: the epoch-end save
follows right after validation, and Lightning 2.6 restores a checkpoint saved there into loop counters whose
next mid-epoch checkpoint resumes at batch 0 of an epoch already under way (seen in tests/e2e/test_preemption.py's
chaos test; it affects ``ModelCheckpoint(every_n_train_steps=...)`` too). A stop asked for at that point
happens after the epoch-end save. The decisions that depend on one rank (a signal, its clock) are agreed
by every rank at the same boundary: under DDP through the training step's own all-reduce
(``step_exchange.StepExchange``, read one optimiser step later: no extra collective and no host sync per step),
at epoch ends and after validation with one small all-reduce (``preemption.agree``).

``BestCheckpoint`` keeps its best score and path across restarts even when the resumed run writes elsewhere.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
import warnings
from collections.abc import Iterator
from typing import Any

import lightning as L
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn

from yolo11_lightning.training.preemption import (
    STOP_SIGNALS,
    StopRequest,
    TrainingPreempted,
    agree,
    requeue_slurm_job,
    signal_name,
    stop_watching_launched_ranks,
)
from yolo11_lightning.training.step_exchange import StepExchange, signal_flag

log = logging.getLogger(__name__)


def _slurm_auto_requeue(trainer: L.Trainer) -> bool:
    """Tells whether this is a SLURM job whose environment plugin requeues it, Lightning's default there."""
    environment = trainer._accelerator_connector.cluster_environment
    return isinstance(environment, SLURMEnvironment) and environment.auto_requeue


def _at_epoch_end(trainer: L.Trainer) -> bool:
    """Tells whether the epoch's last training batch is done; validation and the epoch-end hooks come next."""
    return bool(trainer.fit_loop.epoch_loop.batch_progress.is_last_batch)


def _training_ends_here(trainer: L.Trainer) -> bool:
    """Tells whether training ends after this optimiser step with batches of the epoch left.

    That is when ``max_steps`` is reached, or on a stop the loop will honour (``max_time``'s ``Timer``,
    ``EarlyStopping``, any callback's ``should_stop``). The epoch-end save that follows would record the epoch
    as done, and a resume would skip its remaining batches; ``LastCheckpoint`` keeps the moment itself
    instead, as for a stop signal.
    """
    if _at_epoch_end(trainer) or trainer.state.fn != TrainerFn.FITTING:
        return False
    max_steps = trainer.max_steps
    if max_steps is not None and max_steps >= 0 and trainer.global_step >= max_steps:
        return True
    return bool(trainer.should_stop) and trainer.fit_loop._can_stop_early


def _settle_step_exchange(trainer: L.Trainer) -> None:
    """Reads what the last optimiser step exchanged before a checkpoint is written.

    So the counts kept in it, skipped steps and substituted images, include that step. It is a host read;
    checkpoints are rare.
    """
    settle = getattr(trainer.lightning_module, "settle_step_exchange", None)
    if callable(settle) and trainer.state.fn == TrainerFn.FITTING:
        settle()


@contextlib.contextmanager
def _dirpath_change_expected() -> Iterator[None]:
    """Silences ModelCheckpoint's "The dirpath has changed" warning while our callbacks load their state.

    The full warning ends "... won't be reloaded". ``BestCheckpoint`` restores its best score in any folder,
    ``LastCheckpoint`` has no score to lose, and ``validate``/``test`` of a training run's checkpoint write
    elsewhere on purpose.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"The dirpath has changed from")
        yield


class BestCheckpoint(ModelCheckpoint):
    """ModelCheckpoint on the task's validation score (``best.ckpt``) whose best score survives any restart.

    ``monitor=None`` (the default) follows the module's task (``Task.checkpoint_monitor``): ``val/mAP50-95``
    for detection, ``val/fitness`` (box + mask, the reference's ``best.pt`` rule) for segmentation. It is
    decided in ``setup``, before Lightning restores callback states, whose key includes the monitor.

    Lightning restores ``best_model_score`` only when the resumed run writes to the same folder; otherwise
    the first validation after a restart would become "best" whatever it scored.
    """

    DEFAULT_MONITOR = "val/mAP50-95"  # a module without a task (a plain LightningModule)

    def __init__(self, monitor: str | None = None, mode: str = "max", filename: str = "best", **kwargs: Any):
        kwargs.setdefault("auto_insert_metric_name", False)
        self._follow_task = monitor is None
        super().__init__(monitor=monitor or self.DEFAULT_MONITOR, mode=mode, filename=filename, **kwargs)
        self.best_epoch: int | None = None  # the epoch whose score is ``best_model_score`` (closing summary)

    def _update_best_and_save(
        self, current: Any, trainer: L.Trainer, monitor_candidates: dict[str, Any]
    ) -> None:
        # Set before the save, which writes this callback's state into the checkpoint.
        best, previous = self.best_model_score, self.best_epoch
        if best is None or (
            float(current) > float(best) if self.mode == "max" else float(current) < float(best)
        ):
            self.best_epoch = int(monitor_candidates.get("epoch", trainer.current_epoch))
        try:
            super()._update_best_and_save(current, trainer, monitor_candidates)
        except BaseException:
            self.best_epoch = previous
            raise

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "best_epoch": self.best_epoch}

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._follow_task:
            task = getattr(pl_module, "task", None)
            self.monitor = getattr(task, "checkpoint_monitor", self.DEFAULT_MONITOR)
        super().setup(trainer, pl_module, stage)

    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        _settle_step_exchange(trainer)
        super()._save_checkpoint(trainer, filepath)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        with _dirpath_change_expected():  # the best score is restored below whatever the folder
            super().load_state_dict(state_dict)
        if self.best_model_score is None and state_dict.get("best_model_score") is not None:
            self.best_model_score = state_dict["best_model_score"]
            self.best_k_models = dict(state_dict.get("best_k_models", {}))
            self.kth_best_model_path = state_dict.get("kth_best_model_path", "")
            self.kth_value = state_dict.get("kth_value", self.kth_value)
        self.best_epoch = state_dict.get("best_epoch", self.best_epoch)


class LastCheckpoint(ModelCheckpoint):
    """Owns ``last.ckpt``: written at every epoch end, every N steps / minutes, and on a stop signal.

    Args:
        dirpath: folder (default: the logger's ``checkpoints`` folder, as ``ModelCheckpoint``).
        every_n_minutes: also save mid-epoch once this much training time passed since the last save
            (0 disables). Bounds the work a SIGKILL can lose.
        every_n_train_steps: also save every this many optimiser steps (0 disables).
        stop_on_signal: on SIGTERM (and SIGUSR1, Ctrl-C) every rank stops after the same optimiser step,
            ``last.ckpt`` is written and the run ends with ``TrainingPreempted`` (exit 128 + signal).
    """

    def __init__(
        self,
        dirpath: str | None = None,
        every_n_minutes: float = 10.0,
        every_n_train_steps: int = 0,
        stop_on_signal: bool = True,
    ) -> None:
        super().__init__(
            dirpath=dirpath, filename=self.CHECKPOINT_NAME_LAST, monitor=None, save_top_k=1, save_last=False,
            every_n_epochs=1, save_on_train_epoch_end=True, enable_version_counter=False,
        )  # fmt: skip
        if every_n_minutes < 0 or every_n_train_steps < 0:
            raise ValueError("every_n_minutes and every_n_train_steps must be >= 0")
        self.every_n_minutes = every_n_minutes
        self.every_n_steps = every_n_train_steps
        self.stop_on_signal = stop_on_signal
        self.stop_request = StopRequest()
        self._stop_at_epoch_end = 0  # agreed stop signal deferred to the epoch-end save
        self._boundary_step = -1
        self._last_save_time = time.monotonic()
        self._saves_asked = 0  # time-based saves rank 0 asked for in this fit (sent through the exchange)
        self._saves_done = 0  # ... and those every rank has acted on
        self._stepped = False  # whether the last training batch ended with an optimiser step
        self._stop_held = False  # a stop asked inside an accumulation window, applied at its optimiser step
        self._saved_at_end = False  # training ended inside an epoch and last.ckpt holds that moment

    # ------------------------------------------------------------------------------------ signals
    def _listen(self, trainer: L.Trainer) -> None:
        # After Lightning registered its own handlers (which exit 0 without saving): ours replace them.
        if self.stop_on_signal and trainer.state.fn == TrainerFn.FITTING:
            self.stop_request.install()
            # Lightning broadcasts its own SIGTERM flag from rank 0 before every training batch and reads it
            # on the host (a collective and a device sync per batch). Its handler is replaced by ours, so the
            # flag stays False: the broadcast only costs. Ours travels with the step exchange instead.
            epoch_loop = trainer.fit_loop.epoch_loop
            if hasattr(type(epoch_loop), "_broadcast_sigterm_tensor"):
                epoch_loop._broadcast_sigterm_tensor = lambda: None

    def on_sanity_check_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._listen(trainer)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._listen(trainer)
        self._boundary_step = trainer.global_step
        self._last_save_time = time.monotonic()
        self._saves_asked = self._saves_done = 0
        self._stepped = self._stop_held = self._saved_at_end = False

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.stop_request.uninstall()
        trainer.fit_loop.epoch_loop.__dict__.pop("_broadcast_sigterm_tensor", None)

    # ------------------------------------------------------------------------------------ saving
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        with _dirpath_change_expected():
            super().load_state_dict(state_dict)

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # Part of the run's identity (``run_identity``), which Lightning does not record.
        seed = os.environ.get("PL_GLOBAL_SEED")
        checkpoint["seed_everything"] = int(seed) if seed is not None else None

    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        _settle_step_exchange(trainer)
        super()._save_checkpoint(trainer, filepath)
        self._last_save_time = time.monotonic()

    def _save_now(self, trainer: L.Trainer) -> None:
        if not self._should_skip_saving_checkpoint(trainer):
            self._save_none_monitor_checkpoint(trainer, self._monitor_candidates(trainer))

    def _clock_due(self) -> bool:
        return (
            self.every_n_minutes > 0 and time.monotonic() - self._last_save_time >= 60 * self.every_n_minutes
        )

    def _agreed_now(self, trainer: L.Trainer, with_clock: bool) -> tuple[int, bool]:
        """Agrees now, by one all-reduce, on the stop signal or 0 and whether a time-based save is due.

        Returns (stop signal or 0, time-based save due), the same on every rank.
        """
        due = with_clock and self._clock_due()
        signum, due_any = agree([float(self.stop_request.signum), float(due)], trainer.strategy.root_device)
        return int(signum), bool(due_any)

    def _agreed_exchanged(self, trainer: L.Trainer, exchange: StepExchange) -> tuple[int, bool]:
        """Returns the stop signal or 0 and whether a time-based save is due, as the step exchange agreed.

        The agreement comes one optimiser step late.

        This rank's values go out with the next training step's all-reduce. The clock is rank 0's: it asks
        for save number k + 1 once its clock is due and save k was done, so a save is asked for once however
        long the answer takes; every rank saves when the agreed number passes the saves done.
        """
        for signum in STOP_SIGNALS:
            exchange.set(signal_flag(signum), float(self.stop_request.signum == signum))
        if trainer.is_global_zero and self._clock_due() and self._saves_asked == self._saves_done:
            self._saves_asked += 1
        exchange.set("save_due", float(self._saves_asked) if trainer.is_global_zero else 0.0)
        agreed = exchange.agreed
        signum = next((s for s in STOP_SIGNALS if agreed.get(signal_flag(s), 0.0) > 0), 0)
        due = agreed.get("save_due", 0.0) > self._saves_done
        if due:
            self._saves_done = int(agreed["save_due"])
        return int(signum), due

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        self._stepped = step != self._boundary_step
        if not self._stepped:  # no optimiser step in this batch: gradients are half accumulated
            self._hold_stop(trainer)
            return
        self._boundary_step = step
        if self._stop_held:
            trainer.should_stop, self._stop_held = True, False
        exchange = getattr(pl_module, "step_exchange", None)
        if trainer.world_size > 1 and isinstance(exchange, StepExchange):
            signum, due = self._agreed_exchanged(trainer, exchange)
        else:  # one process (nothing to agree on, no device read), or a module without the exchange
            signum, due = self._agreed_now(trainer, with_clock=True)
        if _at_epoch_end(trainer):  # the epoch-end save comes next (after validation)
            self._stop_at_epoch_end = self._stop_at_epoch_end or signum
            return
        ends = _training_ends_here(trainer)
        if due or signum or ends or (self.every_n_steps and step % self.every_n_steps == 0):
            self._save_now(trainer)
        self._saved_at_end = ends
        if signum:
            self._stop(trainer, signum)

    def _hold_stop(self, trainer: L.Trainer) -> None:
        """Holds another callback's stop inside an accumulation window until the window's optimiser step.

        Such stops come from max_time's ``Timer`` or ``EarlyStopping`` on mid-epoch validation. Stopping now
        would drop half a gradient whose samples the checkpoint already counts as trained.
        """
        if trainer.should_stop and not _at_epoch_end(trainer) and trainer.state.fn == TrainerFn.FITTING:
            trainer.should_stop, self._stop_held = False, True

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if not trainer.sanity_checking:
            # Validation inside an epoch may have asked to stop (EarlyStopping): at an optimiser step, keep
            # this moment as last.ckpt; inside an accumulation window, stop at its end instead.
            if not self._stepped:
                self._hold_stop(trainer)
            elif _training_ends_here(trainer) and not self._saved_at_end:
                self._save_now(trainer)
                self._saved_at_end = True
        if trainer.state.fn != TrainerFn.FITTING or not self.stop_on_signal:
            return
        signum, _ = self._agreed_now(trainer, with_clock=False)  # every rank ends validation, in step
        if not signum:
            return
        if trainer.sanity_checking:
            self._stop(trainer, signum)  # nothing trained yet, nothing to save
        elif _at_epoch_end(trainer):
            self._stop_at_epoch_end = self._stop_at_epoch_end or signum
        else:  # validation inside an epoch (val_check_interval)
            self._save_now(trainer)
            self._stop(trainer, signum)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        settle = getattr(pl_module, "settle_step_exchange", None)
        if callable(settle):  # what the epoch's last step published (its skipped-step count), before the save
            settle()
        if not self._saved_at_end:  # training ended inside the epoch: last.ckpt already holds where
            super().on_train_epoch_end(trainer, pl_module)  # the epoch-end last.ckpt
        if self.stop_on_signal and trainer.world_size > 1:
            # A signal sent in the epoch's last steps has not travelled with a step exchange yet.
            signum, _ = self._agreed_now(trainer, with_clock=False)
            self._stop_at_epoch_end = self._stop_at_epoch_end or signum
        if self._stop_at_epoch_end:
            self._stop(trainer, self._stop_at_epoch_end)

    def _stop(self, trainer: L.Trainer, signum: int) -> None:
        stop_watching_launched_ranks()  # every rank now leaves with 128 + signal, some sooner than others
        for logger in trainer.loggers:
            logger.save()
        path = self.best_model_path or None
        if signum == signal.SIGUSR1 and trainer.is_global_zero and _slurm_auto_requeue(trainer):
            requeue_slurm_job()
        if trainer.is_global_zero:
            log.warning(_stop_note(trainer, signum, path))
        raise TrainingPreempted(signum, path)


def _stop_note(trainer: L.Trainer, signum: int, path: str | None) -> str:
    """Returns one line on what a stop kept, the position and the file; the CLI adds the resume command."""
    name = signal_name(signum)
    if path is None or trainer.sanity_checking:
        return f"{name}: stopped before any training step; nothing to save"
    epoch_loop = trainer.fit_loop.epoch_loop
    done, total = epoch_loop.batch_progress.current.completed, trainer.num_training_batches
    where = (
        f"epoch {trainer.current_epoch} done"
        if _at_epoch_end(trainer)
        else f"epoch {trainer.current_epoch}, {done} of {total} batches done"
    )
    return (
        f"{name}: stopped at global step {trainer.global_step} ({where}); kept that exact position in {path}"
    )
