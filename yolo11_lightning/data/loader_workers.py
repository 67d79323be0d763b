"""DataLoader workers: how many (``num_workers: auto``), and their process setup (stop signals left to the
training process, one OpenCV thread, ended when the training process exits)."""

from __future__ import annotations

import multiprocessing
import signal
import threading

import cv2

from yolo11_lightning.data.sampling.partner_pools import RECENT_SPACING, workers_decoding_once

# The most workers ``auto`` gives a device. One worker makes ~290 training images/s at 640 px with mosaic
# (benchmarks/README.md, "Training data pipeline": 294 with the default "recent" partners, one shared server
# core), so 16 make ~4700, 2-4x what a GPU consumes (yolo11s at 640 on an H100-class GPU: on the order of
# 1000-2000 images/s). Each worker beyond that only adds memory: its own copy of the records, its decode
# cache and its prefetched batches in the shared-memory queue.
MAX_AUTO_WORKERS = 16


def auto_num_workers(cores_per_rank: int, decode_once: bool) -> tuple[int, str]:
    """Loader workers per device for ``num_workers: auto``, and how they were derived.

    The rank's cores minus one for the training process itself, within [0, ``MAX_AUTO_WORKERS``]. With
    ``decode_once`` (``"recent"`` mosaic partners decoded from files), rounded down to a divisor of
    ``RECENT_SPACING`` (1, 2, 4, 8): other counts give the same samples but decode a sample's partners again
    (``data.sampling.partner_pools``: 2.63 decodes per sample with 3 workers against 1.46 with 4), so 8 workers make
    ~2350 images/s where 11 would make fewer.
    """
    workers = min(max(cores_per_rank - 1, 0), MAX_AUTO_WORKERS)
    how = f"{cores_per_rank} core(s) per rank minus the training process"
    if workers == MAX_AUTO_WORKERS:
        how += f", at most {MAX_AUTO_WORKERS}"
    if decode_once and workers_decoding_once(workers) != workers:
        workers = workers_decoding_once(workers)
        how += f", rounded down to a divisor of {RECENT_SPACING} ('recent' mosaic partners decoded once)"
    return workers, how


def ignore_stop_signals_in_worker(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: workers leave SIGTERM/SIGUSR1/SIGINT to the training process.

    PyTorch's workers die on a SIGTERM that does not come from their parent (and leave on Ctrl-C's SIGINT, which a
    terminal sends to the whole process group), so the next batch would fail ("DataLoader worker ... is killed by
    signal") before the training process could save (``training.preemption``). Ignored here, they end with their
    parent: PyTorch's workers watch it, and ``end_loader_workers`` ends them when a run fails or is stopped.
    """
    for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)


def end_loader_workers(wait: bool = True) -> None:
    """SIGKILL this process's daemonic ``multiprocessing`` children (DataLoader workers): a run ended by an exception.

    At interpreter exit, ``multiprocessing`` SIGTERMs its daemonic children and then waits for them. Workers ignore
    SIGTERM (above), and persistent workers of a loader whose iterator was not shut down (a stop or an error
    during validation leaves it referenced by the traceback) wait for their next index forever: the process would
    hang at exit (seen: over 2 minutes after a Ctrl-C during validation). These are the children ``multiprocessing``
    would end there (PyTorch's workers are its only daemonic ones here), and their batches are of no use any more.
    ``wait=False`` does not reap them (a process about to ``os._exit``).
    """
    if threading.current_thread() is threading.main_thread():
        # PyTorch's SIGCHLD handler raises "DataLoader worker ... is killed by signal" for the workers killed here,
        # from inside whatever runs then (the wait below): the run is over, its loaders with it.
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for child in multiprocessing.active_children():
        if child.daemon:
            child.kill()
            if wait:
                child.join(timeout=5)


def single_threaded_opencv() -> None:
    """One DataLoader worker = one core: OpenCV's own threads would oversubscribe the CPUs.

    Set in the parent before the workers fork: calling ``cv2.setNumThreads`` inside a forked worker can
    deadlock on the thread pool state copied from the parent (seen in our tests), while a parent with a
    one-thread pool forks cleanly. The reference sets it for the whole process the same way.
    """
    cv2.setNumThreads(1)
