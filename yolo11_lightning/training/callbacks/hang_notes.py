"""What ``HangWatchdog`` passes between ranks: the progress note of a rank (where it is in the step, in an
order comparable across ranks) and a client of the job's TCPStore whose calls cannot block for good.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

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
    """A collective or store failure (timeout, lost connection), as opposed to an error in the user's code."""
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
        """``fn(store)`` on the store thread; TimeoutError when it does not answer in time."""
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
