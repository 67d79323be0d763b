"""How many torch threads a CPU training process may use beside its own DataLoader workers, and how they wait.

PyTorch starts one intra-op thread per visible core, and Lightning's launcher splits the cores among the local
ranks, but neither counts the DataLoader workers: on a small machine they share the cores with the training
threads. GNU OpenMP (torch's, on Linux) lets a thread that waits at the end of a parallel region spin for a
while before it sleeps. With the cores shared, the spinning threads burn the time slices the working thread
needs: measured on 2 cores (yolo11n, 224 px, batch 16, 2 workers), torch's 2 threads took 0.9 s per step instead
of 0.3 s beside one other busy process, and 18 s instead of 0.5 s on a crowded machine.

``OMP_WAIT_POLICY=PASSIVE`` makes waiting threads sleep at once. It is read once, when OpenMP is loaded with
torch, so the ``yolo11-lightning`` command sets it before anything imports torch (``wait_passively``) unless the
environment already says otherwise. With passive waits the training process can take every core of its share:
the workers get a core when they need one, and nobody spins. Without them (a notebook that imported torch first,
or ``OMP_WAIT_POLICY=ACTIVE``) the robust choice is the cores the workers leave. ``benchmarks/cpu_default.py``
measures both, idle and beside a busy process, against the reference trainer.

The cores are counted by ``data.cpu_cores.usable_cpus`` (CPU affinity and container quota), which the
DataLoader's ``num_workers: auto`` counts with too.
"""

from __future__ import annotations

import os
import sys

__all__ = ["openmp_waits_passively", "training_threads", "wait_passively"]

WAIT_POLICY = "OMP_WAIT_POLICY"


def wait_passively() -> None:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` for this process and its children, unless the environment already sets a
    policy or torch (and so OpenMP) is already loaded: call it before importing torch."""
    if "torch" not in sys.modules:
        os.environ.setdefault(WAIT_POLICY, "PASSIVE")


def openmp_waits_passively() -> bool:
    """Whether OpenMP threads in this process sleep when they wait (``OMP_WAIT_POLICY=passive``)."""
    return os.environ.get(WAIT_POLICY, "").strip().lower() == "passive"


def training_threads(cpus: int, local_processes: int, loader_workers: int, passive_waits: bool) -> int:
    """Torch threads for one training process: its share of ``cpus`` among ``local_processes`` ranks; with
    spinning waits (``passive_waits=False``) minus its ``loader_workers`` (each a single-threaded process); at
    least 1."""
    share = cpus // max(local_processes, 1)
    return max(1, share if passive_waits else share - max(loader_workers, 0))
