"""DataLoader worker process setup: stop signals left to the training process, one OpenCV thread."""

from __future__ import annotations

import signal

import cv2


def ignore_stop_signals_in_worker(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: workers leave SIGTERM/SIGUSR1 to the training process.

    PyTorch's workers die on a SIGTERM that does not come from their parent, so a signal to the whole process
    group would fail the next batch ("DataLoader worker ... is killed by signal") before the training process
    could save (``training.preemption``). Ignored here, they end with their parent, as PyTorch watches it.
    """
    for signum in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(signum, signal.SIG_IGN)


def single_threaded_opencv() -> None:
    """One DataLoader worker = one core: OpenCV's own threads would oversubscribe the CPUs.

    Set in the parent before the workers fork: calling ``cv2.setNumThreads`` inside a forked worker can
    deadlock on the thread pool state copied from the parent (seen in our tests), while a parent with a
    one-thread pool forks cleanly. The reference sets it for the whole process the same way.
    """
    cv2.setNumThreads(1)
