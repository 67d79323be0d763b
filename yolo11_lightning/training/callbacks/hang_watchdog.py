"""Hang diagnosis: which rank stopped making progress, and where every rank's threads are.

A hung rank shows up on the others only as a collective timeout that names no rank. :class:`HangWatchdog`
keeps, on every rank, a note of the last training hook it passed (batch start, forward, backward, optimiser
step, batch end, validation, checkpoint: plain attribute writes, no device sync, no collective). A daemon thread
publishes that note with a beat counter to the job's TCPStore (``MASTER_ADDR:MASTER_PORT``, over a
connection of its own) every ``interval`` seconds. When a rank's own progress stalls for ``deadline``
seconds (shorter than the collective timeout), it

- writes the Python stacks of all its threads (``faulthandler``) to ``<log_dir>/hang/rank<R>.txt``;
- reads the other ranks' notes and names the ones that fell behind (an earlier point in the step than the
  furthest rank) or stopped answering (beat counter frozen: process stopped, host or link down);
- logs that report, and adds it to the error that ends the run (the collective timeout), so the error
  names the laggard and the stack file to read.

A rank stuck where no timeout reaches it (a store call, a kernel) ends itself ``exit_after`` seconds into a
stall (exit code :data:`EXIT_CODE`), so a cut-off node does not hold its devices forever.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import math
import os
import queue
import socket
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from torch import nn

log = logging.getLogger(__name__)

# Progress phases in the order a rank passes them within one batch.
PHASES = ("batch start", "forward", "backward", "after backward", "optimiser step", "batch end")
EPOCH_END = 10**9  # sorts after every batch of the epoch


@dataclass
class _Note:
    """Where a rank is: ``key`` orders progress across ranks (stage, epoch, batch, phase)."""

    key: tuple[int, int, int, int]
    where: str
    since: float  # time.monotonic() of the last progress


def _describe(stage: str, epoch: int, batch: int, phase: str, step: int) -> str:
    at = "epoch end" if batch == EPOCH_END else f"batch {batch}"
    return f"{stage} {at} ({phase}), epoch {epoch}, global step {step}"


def _is_distributed_error(error: BaseException) -> bool:
    """Tells whether an error is a collective or store failure, such as a timeout or a lost connection.

    As opposed to an error in the user's code.
    """
    import torch.distributed as dist

    text = str(error).lower()
    return isinstance(error, dist.DistError) or any(w in text for w in ("timed out", "timeout", "connection"))


class _BoundedStore:
    """A client of the job's TCPStore whose calls return or fail within ``timeout`` seconds.

    A TCPStore call on a connection whose peer vanished (link down, host gone) can block for good, so the
    calls run on a daemon thread of their own; while one is stuck, the next ones fail at once.
    """

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self._requests: queue.Queue = queue.Queue()
        self._pending: threading.Event | None = None
        self._since = 0.0
        self._lock = threading.Lock()
        self._store: Any = None
        threading.Thread(target=self._serve, name="HangWatchdog-store", daemon=True).start()

    def _serve(self) -> None:
        from torch.distributed import TCPStore

        while True:
            fn, box, done = self._requests.get()
            try:
                if self._store is None:
                    self._store = TCPStore(self.host, self.port, is_master=False, wait_for_workers=False,
                                           timeout=timedelta(seconds=self.timeout))  # fmt: skip
                box.append((True, fn(self._store)))
            except Exception as error:
                self._store = None  # reconnect on the next call
                box.append((False, error))
            done.set()

    def call(self, fn: Any) -> Any:
        """Runs fn(store) on the store thread; raises TimeoutError when it does not answer in time."""
        with self._lock:
            if self._pending is not None and not self._pending.is_set():
                raise TimeoutError(
                    f"the store at {self.host}:{self.port} has not answered for {time.monotonic() - self._since:.0f} s"
                )
            box: list = []
            self._pending, self._since = threading.Event(), time.monotonic()
            self._requests.put((fn, box, self._pending))
            if not self._pending.wait(self.timeout):
                raise TimeoutError(
                    f"the store at {self.host}:{self.port} did not answer within {self.timeout:g} s"
                )
        ok, value = box[0]
        if not ok:
            raise value
        return value


EXIT_CODE = 86  # a rank that ended itself after ``exit_after`` seconds without progress
DEFAULT_DEADLINE_S = 600.0  # without a collective timeout to derive it from


class HangWatchdog(Callback):
    """Stack dumps and the name of the rank that fell behind, when training stops making progress.

    Args:
        deadline: seconds without progress on a rank before it dumps its stacks and reports; default: half
            the strategy's collective timeout (``DDPStrategy(timeout=...)``), else 600 s. ``0``: off.
        interval: seconds between heartbeats published to the store; default ``deadline / 5`` in 1-30 s.
        exit_after: seconds without progress after which the rank ends itself (exit code 86); default: the
            collective timeout plus ``deadline``, else never. ``0``: never.

    Only the first HangWatchdog in ``trainer.callbacks`` is active, so one you add (``--trainer.callbacks+=``)
    replaces the default one, which LightningCLI appends after yours.
    """

    def __init__(
        self, deadline: float | None = None, interval: float | None = None, exit_after: float | None = None
    ) -> None:
        for name, value in (("deadline", deadline), ("interval", interval), ("exit_after", exit_after)):
            if value is not None and (not math.isfinite(value) or value < 0):
                raise ValueError(f"HangWatchdog {name}={value}: must be a number of seconds >= 0")
        self._deadline, self._interval, self._exit_after = deadline, interval, exit_after
        self.deadline = self.interval = 0.0
        self.exit_after: float | None = None
        self.active = False  # set up for a fit and the first HangWatchdog of the trainer
        self.report: str | None = None  # the last stall report of this rank
        self.stack_file: Path | None = None
        self._note = _Note((0, 0, 0, 0), "start-up", time.monotonic())
        self._stage, self._epoch, self._batch, self._step = "train", 0, 0, 0
        self._armed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._hook: Any = None
        self._store: Any = None
        self._peers: dict[int, tuple[int, float, dict]] = {}  # rank -> (beat, seen changing at, note)

    # ------------------------------------------------------------------------------------ progress notes
    def _progress(self, phase: str, batch: int | None = None) -> None:
        if batch is not None:
            self._batch = batch
        stage = 0 if self._stage == "train" else 1
        self._note = _Note(
            (self._epoch, stage, self._batch, PHASES.index(phase) if phase in PHASES else 0),
            _describe(self._stage, self._epoch, self._batch, phase, self._step),
            time.monotonic(),
        )

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stage, self._epoch, self._step = "train", trainer.current_epoch, trainer.global_step
        self._progress("batch start", 0)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._stage, self._step = "train", trainer.global_step
        self._progress("batch start", batch_idx)

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: Any) -> None:
        self._progress("backward")

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._progress("after backward")

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any
    ) -> None:
        self._progress("optimiser step")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:  # fmt: skip
        self._step = trainer.global_step
        self._progress("batch end", batch_idx)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stage = "train"
        self._progress("epoch end", EPOCH_END)

    def on_validation_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:  # fmt: skip
        self._stage = "validation"
        self._progress("batch start", batch_idx)

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:  # fmt: skip
        self._progress("batch end", batch_idx)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stage = "validation"
        self._progress("epoch end", EPOCH_END)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        saving = ", saving a checkpoint"
        where = self._note.where if self._note.where.endswith(saving) else self._note.where + saving
        self._note = _Note(self._note.key, where, time.monotonic())

    # ------------------------------------------------------------------------------------ life cycle
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        mine = [c for c in trainer.callbacks if isinstance(c, HangWatchdog)]
        self.active = mine[0] is self  # LightningCLI appends its default callbacks after yours
        timeout = getattr(trainer.strategy, "_timeout", None)
        timeout_s = timeout.total_seconds() if isinstance(timeout, timedelta) else None
        distributed = trainer.world_size > 1 and timeout_s is not None
        self.deadline = self._deadline if self._deadline is not None else (
            timeout_s / 2 if distributed else DEFAULT_DEADLINE_S
        )  # fmt: skip
        self.interval = self._interval or min(max(self.deadline / 5, 1.0), 30.0)
        if self._exit_after is not None:
            self.exit_after = self._exit_after or None
        else:
            self.exit_after = timeout_s + self.deadline if distributed else None
        self.rank, self.world = trainer.global_rank, trainer.world_size
        self.hostname, self.pid = socket.gethostname(), os.getpid()
        log_dir = trainer.log_dir  # a broadcast: every rank calls setup, so it is symmetric
        self.hang_dir = Path(log_dir or trainer.default_root_dir) / "hang"
        env = trainer.strategy.cluster_environment if self.world > 1 else None
        self._address = (env.main_address, env.main_port) if env is not None else None
        self._prefix = f"hang_watchdog/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.active or self.deadline <= 0:
            return
        self._progress("batch start", 0)
        wrapper = trainer.strategy.model
        if isinstance(wrapper, nn.Module) and wrapper is not pl_module:
            # The DDP wrapper's own forward pre-hook runs after every on_train_batch_start callback and
            # before DDP's first collective of the step (bucket rebuild, buffer broadcast).
            self._hook = wrapper.register_forward_pre_hook(lambda module, args: self._progress("forward"))
        self._armed = True
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, name="HangWatchdog", daemon=True)
        self._thread.start()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._disarm()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._disarm()

    def _disarm(self) -> None:
        self._armed = False
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        """Names the ranks that fell behind, and the stack files, in the error that ends the run."""
        if not self._armed or not hasattr(exception, "add_note"):
            return
        if self.report is None and self.world > 1 and _is_distributed_error(exception):
            self._observe_peers(time.monotonic())  # e.g. a peer's process died before the deadline
            self._stalled(time.monotonic() - self._note.since)
        if self.report is not None:  # never replaces the error: _stalled logs its own failures
            exception.add_note(self.report)

    # ------------------------------------------------------------------------------------ the thread
    def _watch(self) -> None:
        published = 0.0
        beat = 0
        while not self._stop.wait(min(1.0, self.interval)):
            now = time.monotonic()
            stalled = now - self._note.since
            if now - published >= self.interval:
                beat += 1
                published = now
                self._publish(beat, stalled)
            if stalled < self.deadline / 2:
                self.report, self._peers = None, {}
                continue
            self._observe_peers(now)
            if stalled >= self.deadline and self.report is None:
                self._stalled(stalled)
            if self.exit_after is not None and stalled >= self.exit_after:
                log.error(
                    f"HangWatchdog: rank {self.rank} made no progress for {stalled:.0f} s (exit_after="
                    f"{self.exit_after:g} s), still at {self._note.where}: ending the process (exit code "
                    f"{EXIT_CODE}). {self.report or ''}"
                )
                sys.stderr.flush()
                os._exit(EXIT_CODE)

    def _connect(self) -> _BoundedStore | None:
        if self._store is None and self._address is not None:
            self._store = _BoundedStore(*self._address, timeout=max(2.0 * self.interval, 2.0))
        return self._store

    def _publish(self, beat: int, stalled: float) -> None:
        note = {"beat": beat, "key": self._note.key, "where": self._note.where, "stalled_s": round(stalled, 1),
                "host": self.hostname, "pid": self.pid, "time": time.time()}  # fmt: skip
        try:
            store = self._connect()
            if store is not None:
                store.call(lambda s: s.set(f"{self._prefix}{self.rank}", json.dumps(note)))
            self._store_error = None
        except Exception as error:  # the store's host is unreachable: keep trying, report it when stalled
            self._store_error = error

    def _observe_peers(self, now: float) -> None:
        """Read every other rank's note; remember when its beat last changed."""
        if self.world <= 1:
            return
        keys = [f"{self._prefix}{rank}" for rank in range(self.world)]

        def read(store: Any) -> dict[int, dict]:
            return {
                r: json.loads(store.get(k)) for r, k in enumerate(keys) if r != self.rank and store.check([k])
            }

        try:
            notes = self._connect().call(read)
            self._store_error = None
        except Exception as error:
            self._store_error = error
            return
        for rank, note in notes.items():
            old = self._peers.get(rank)
            changed = old is None or old[0] != note["beat"]
            self._peers[rank] = (note["beat"], now if changed else old[1], note)

    def _stalled(self, stalled: float) -> None:
        """Dumps this rank's stacks, names the laggards, logs and keeps the report; errors are only logged."""
        try:
            self._dump_stacks(stalled)
        except OSError as error:
            log.error(
                f"HangWatchdog: could not write the stacks of rank {self.rank} to {self.stack_file}: {error}"
            )
        try:
            self.report = self._diagnose(stalled)
        except Exception as error:
            self.report = f"HangWatchdog: rank {self.rank} made no progress for {stalled:.0f} s ({error!r})"
        log.error(self.report)

    def _dump_stacks(self, stalled: float) -> None:
        self.stack_file = self.hang_dir / f"rank{self.rank}.txt"
        self.hang_dir.mkdir(parents=True, exist_ok=True)
        with open(self.stack_file, "a") as f:
            f.write(
                f"--- rank {self.rank} of {self.world}, host {self.hostname}, pid {self.pid}, "
                f"{time.strftime('%Y-%m-%d %H:%M:%S')}: no progress for {stalled:.0f} s, at {self._note.where}\n"
            )
            f.flush()
            faulthandler.dump_traceback(f, all_threads=True)

    def _diagnose(self, stalled: float) -> str:
        me = f"rank {self.rank} ({self.hostname}, pid {self.pid})"
        head = f"HangWatchdog: {me} made no progress for {stalled:.0f} s, at {self._note.where}."
        stacks = (
            f"Python stacks of every live rank: {self.hang_dir}/rank<R>.txt (this rank: {self.stack_file})."
        )
        if self.world <= 1:
            return f"{head} {stacks}"
        parts = [head]
        if self._store_error is not None:
            host, port = self._address
            parts.append(
                f"The job's store at {host}:{port} (rank 0's host) did not answer ({self._store_error}): this "
                "rank lost its connection to rank 0 (network link down, or rank 0's host is gone)."
            )
        now = time.monotonic()
        window = 2.5 * self.interval
        # Silent: its beat did not change while we watched, or its last one is old by the wall clock
        # (clocks of different hosts may disagree by far less than the window).
        silent = {
            r: p for r, p in self._peers.items() if max(now - p[1], time.time() - p[2]["time"]) >= window
        }
        missing = [r for r in range(self.world) if r != self.rank and r not in self._peers]
        live = {r: p[2] for r, p in self._peers.items() if r not in silent}
        live[self.rank] = {"key": list(self._note.key), "where": self._note.where, "host": self.hostname,
                           "pid": self.pid, "stalled_s": stalled}  # fmt: skip
        furthest = max(tuple(n["key"]) for n in live.values())
        behind = {r: n for r, n in live.items() if tuple(n["key"]) < furthest}
        for rank, (_, seen, note) in sorted(silent.items()):
            parts.append(
                f"Not answering: rank {rank} ({note['host']}, pid {note['pid']}): no heartbeat for "
                f"{max(now - seen, time.time() - note['time']):.0f} s, last at {note['where']} (process stopped, or its host or link is down)."
            )
        if missing and self._store_error is None:
            parts.append(f"Never published a heartbeat: rank(s) {', '.join(map(str, missing))}.")
        for rank, note in sorted(behind.items()):
            parts.append(
                f"Fell behind: rank {rank} ({note['host']}, pid {note['pid']}) is at {note['where']}, "
                f"stuck for {float(note['stalled_s']):.0f} s; read {self.hang_dir}/rank{rank}.txt."
            )
        if not (silent or missing or behind or self._store_error):
            parts.append("Every rank is at the same point: a collective none of them finished (network?).")
        parts.append(stacks)
        return " ".join(parts)
