"""Stop requests from the outside world (SIGTERM, SLURM's SIGUSR1, Ctrl-C), agreed on by every rank.

Schedulers ask a job to stop with a signal and a grace period: Kubernetes, spot instances, ``scancel``
and torchrun send SIGTERM; SLURM sends SIGUSR1 (``--signal=SIGUSR1@120``) before a time limit when the job
may be requeued. Lightning 2.6 turns SIGTERM into a ``SystemExit`` without a code (exit 0, nothing saved)
and saves SLURM's checkpoint inside the signal handler, in the middle of a batch.

Here a signal only raises a flag (``StopRequest``): handlers run between Python bytecodes of the main thread
and must not start collectives. The ranks then agree at the next optimiser-step boundary with one
all-reduce of the flag (``agree``): a signal that reached only some ranks, or reached them at different
moments, stops them all after the same batch. ``LastCheckpoint`` (``training.callbacks.checkpoints``) then writes the
exact position and raises ``TrainingPreempted`` (exit code 128 + signal: 143 for SIGTERM, 130 for Ctrl-C).

Ctrl-C (SIGINT) is a stop request like SIGTERM while a fit trains: Lightning would otherwise turn it into a
``KeyboardInterrupt`` that loses the partial epoch and exits 1. A second Ctrl-C stops the process at once, without
saving (``last.ckpt`` keeps its previous state: files are written atomically).

Before a fit's ``StopRequest`` takes the signals over (while the ranks start, meet and read their data), a SIGTERM
would kill the launching process where it stands, and the ranks Lightning launched beside it would wait for it: a
rank still connecting to the process group's store waits out the group's timeout (30 minutes by default).
``stop_signals_end_startup`` makes such a SIGTERM raise ``StoppedBeforeTraining`` instead (exit 143, nothing to
save), so the CLI can end those ranks as it does after any failure.

DataLoader workers ignore these signals (``data.loader_workers.ignore_stop_signals_in_worker``): a scheduler that
signals the whole process group (or Ctrl-C in a terminal) would otherwise kill them, and the main process would
fail on its next batch before it could save. Workers still end with their parent: PyTorch's watch it, and the CLI
ends them when a run stops or fails (``data.loader_workers.end_loader_workers``), so no exit waits on them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

import torch

from yolo11_lightning.data.loader_workers import end_loader_workers

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


class TrainingPreempted(SystemExit):
    """Every rank stopped at the same batch after a stop signal; the checkpoint holds the exact position.

    A ``SystemExit`` whose code is ``128 + signal`` (143 for SIGTERM, 138 for SIGUSR1, 130 for Ctrl-C), the
    shell's convention for "ended by this signal", so restart policies keyed on the exit code see a job that did
    not finish.
    """

    def __init__(self, signum: int, checkpoint: str | None) -> None:
        super().__init__(128 + signum)
        self.signum = signum
        self.checkpoint = checkpoint

    def __str__(self) -> str:
        name = signal_name(self.signum)
        where = f"; resume with --ckpt_path last ({self.checkpoint})" if self.checkpoint else ""
        return f"training stopped by {name} at an optimiser-step boundary{where}"


class StoppedBeforeTraining(SystemExit):
    """A stop signal that arrived before training started: nothing to save. Exit code ``128 + signal``."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum

    def __str__(self) -> str:
        return f"stopped by {signal_name(self.signum)} before training started: nothing to save"


@contextlib.contextmanager
def stop_signals_end_startup() -> Iterator[None]:
    """While the block runs, a SIGTERM still at its default action (which ends the process where it stands) raises
    ``StoppedBeforeTraining`` in the main thread instead, until something else takes it over: a fit's
    ``StopRequest`` does at its sanity check or first batch. Afterwards the default comes back.

    A handler set by the caller is left alone, and so is SIGINT (Lightning turns Ctrl-C into its own stop).
    Off the main thread nothing changes.
    """
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL
    ):
        yield
        return

    def stop(signum: int, frame: FrameType | None) -> None:
        raise StoppedBeforeTraining(signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        # Lightning's teardown puts back the handler it found, this one; a handler set since then stays.
        if signal.getsignal(signal.SIGTERM) is stop:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def signal_name(signum: int) -> str:
    """Names a signal: SIGTERM, SIGUSR1; "Ctrl-C (SIGINT)" for the one a user sends from the terminal."""
    name = signal.Signals(signum).name
    return f"Ctrl-C ({name})" if signum == signal.SIGINT else name


class StopRequest:
    """Signal handlers that record the first stop signal; ``signum`` is 0 until one arrives.

    A second Ctrl-C ends the process at once (exit 130) without saving; other repeated signals change nothing.
    """

    def __init__(self, signals: tuple[int, ...] = STOP_SIGNALS) -> None:
        self.signals = signals
        self.signum = 0
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # os.write is async-signal-safe; logging from a handler can deadlock on the handler's own lock.
        if not self.signum:
            self.signum = signum
            again = " (Ctrl-C again stops at once, without saving)" if signum == signal.SIGINT else ""
            os.write(2, f"[rank pid {os.getpid()}] received {signal_name(signum)}: stopping at the next "
                        f"optimiser step, after saving a checkpoint{again}\n".encode())  # fmt: skip
        elif signum == signal.SIGINT:
            os.write(2, f"[rank pid {os.getpid()}] second Ctrl-C: stopped at once, nothing saved\n".encode())
            try:  # no waiting for the killed workers: PyTorch's SIGCHLD handler would raise in the wait
                end_loader_workers(wait=False)
            finally:
                os._exit(128 + signum)

    def install(self) -> None:
        """Takes over the stop signals on the main thread, idempotently; elsewhere it does nothing."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in self.signals:
            current = signal.getsignal(signum)
            if current != self._handle:
                self._previous.setdefault(signum, current)
                signal.signal(signum, self._handle)

    def uninstall(self) -> None:
        """Gives the signals back to the handlers found at the first install."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()


def agree(local: list[float], device: torch.device) -> list[float]:
    """Returns the element-wise maximum of ``local`` over all ranks by one small all-reduce.

    Without distribution it returns ``local`` itself.

    Every rank must call it at the same point of the loop: callers use optimiser-step boundaries and the end
    of validation, which every rank reaches in the same order.
    """
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return list(local)
    if torch.distributed.get_world_size() == 1:
        return list(local)
    flags = torch.tensor(local, dtype=torch.float64 if device.type == "cpu" else torch.float32, device=device)
    torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
    return flags.tolist()


def requeue_slurm_job() -> None:
    """Requeues the job by scontrol requeue as Lightning's SLURM auto-requeue does, on global rank 0 only."""
    array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
    job_id = (
        f"{array_job}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array_job else os.environ.get("SLURM_JOB_ID")
    )
    if not job_id:
        log.warning("SLURM requeue asked, but SLURM_JOB_ID is not set: requeue the job yourself")
        return
    try:
        result = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        log.warning("could not requeue SLURM job %s (%s): requeue it yourself", job_id, error)
        return
    if result.returncode:
        log.warning("`scontrol requeue %s` failed (%d): %s", job_id, result.returncode, result.stderr.strip())
    else:
        log.info("requeued SLURM job %s", job_id)


def stop_watching_launched_ranks() -> None:
    """Keep Lightning's child-process observer from SIGKILLing this process when a rank leaves first.

    With ``devices > 1`` and no torchrun, the launching process runs a thread that, as soon as one of the
    ranks it started exits with a non-zero code, kills them all and itself. A preempted run exits with 143 on
    every rank on purpose, and a rank that has less to do at the end (rank 0 writes the files) can leave a
    moment earlier. Called once the ranks agreed to stop: the observer then watches nothing, and the CLI's
    ``end_launched_ranks`` (with its grace period) ends any rank that does not leave on its own.
    """
    from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver

    for thread in threading.enumerate():
        if isinstance(thread, _ChildProcessObserver):
            thread._child_processes = []  # a new list: the launcher's own `procs` stays as it is
