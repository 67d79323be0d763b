"""How many torch threads a CPU training process may use beside its own DataLoader workers, and how they wait.

PyTorch starts one intra-op thread per visible core, and Lightning's launcher splits the cores among the local
ranks, but neither counts the DataLoader workers: on a small machine they share the cores with the training
threads. GNU OpenMP (torch's, on Linux) lets a thread that waits at the end of a parallel region spin before it
sleeps, 300,000 times by default. With the cores shared, spinning threads burn the time slices the working
thread needs. Measured on 2 cores, whole 2-epoch runs (yolo11n, 320 px, batch 16, 2 workers;
``benchmarks/cpu_default.py``), torch's 2 threads against 1: 20 s against 33 s on an idle machine, but 51-71 s
against 44 s beside one other busy process (145 s with 100,000 spins).

``GOMP_SPINCOUNT=1000`` keeps a spin of a microsecond or two, which catches the short hand-overs of an idle
machine, and then sleeps: 19 s idle, 37 s beside a busy process (the reference trainer: 37 s both). It is read
once, when OpenMP is loaded with torch, so the ``yolo11-lightning`` command sets it before anything imports torch
(``spin_briefly``) unless the environment already sets a policy (``OMP_WAIT_POLICY``, ``GOMP_SPINCOUNT``). With
brief (or passive) waits the training process takes every core of its share, the workers beside it. Without
them (a notebook that imported torch first, ``OMP_WAIT_POLICY=ACTIVE``) the robust choice is the cores the
workers leave.

The cores are counted by ``data.cpu_cores.usable_cpus`` (CPU affinity and container quota), which the
DataLoader's ``num_workers: auto`` counts with too.
"""

from __future__ import annotations

import os
import sys

__all__ = ["openmp_waits_briefly", "spin_briefly", "training_threads"]

WAIT_POLICY = "OMP_WAIT_POLICY"
SPIN_COUNT = "GOMP_SPINCOUNT"
BRIEF_SPINS = 1000  # spins before a waiting thread sleeps: ~1-2 us (GNU OpenMP's default: 300,000)


def spin_briefly() -> None:
    """Sets GOMP_SPINCOUNT to BRIEF_SPINS for this process and its children; call it before importing torch.

    The children are DDP ranks and loader workers. Nothing is set when the environment already sets a wait
    policy or torch, and so OpenMP, is already loaded.
    """
    if "torch" not in sys.modules and WAIT_POLICY not in os.environ and SPIN_COUNT not in os.environ:
        os.environ[SPIN_COUNT] = str(BRIEF_SPINS)


def openmp_waits_briefly() -> bool:
    """Tells whether waiting OpenMP threads in this process sleep at once or after a brief spin.

    They do with OMP_WAIT_POLICY passive, or, without a policy, a GOMP_SPINCOUNT of at most BRIEF_SPINS.
    """
    policy = os.environ.get(WAIT_POLICY, "").strip().lower()
    if policy in ("passive", "active"):
        return policy == "passive"
    try:
        return float(os.environ[SPIN_COUNT]) <= BRIEF_SPINS
    except (KeyError, ValueError):
        return False


def training_threads(cpus: int, local_processes: int, loader_workers: int, brief_waits: bool) -> int:
    """Returns the torch threads for one training process: its share of ``cpus`` among the local ranks.

    With spinning waits (``brief_waits=False``) its ``loader_workers``, each a single-threaded process, are
    subtracted; at least 1.
    """
    share = cpus // max(local_processes, 1)
    return max(1, share if brief_waits else share - max(loader_workers, 0))
