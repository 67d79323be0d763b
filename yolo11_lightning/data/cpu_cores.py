"""How many CPU cores this process, and each training process of this node, may really run on.

``os.cpu_count()`` reports the host's cores, also in a container limited to a few and in a SLURM job given a
share of the node. ``usable_cpus`` counts what this process may run on: its CPU affinity and the cgroup CPU
quota. ``cores_per_rank`` splits a node's cores among its local ranks, preferring what SLURM allocated when
the job runs under it. The DataLoader's ``num_workers: auto`` (``data.loader_workers``) and the CPU threads of
``--machine.cpu_threads auto`` (``training.cpu_threads``) are sized from them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["cgroup_cpu_limit", "cores_per_rank", "usable_cpus"]


def cgroup_cpu_limit(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The container's CPU quota in cores (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``), None if unlimited."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


def usable_cpus() -> int:
    """Cores this process may use: its affinity mask, capped by the cgroup quota (rounded up), at least 1."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    limit = cgroup_cpu_limit()
    if limit is not None:
        cpus = min(cpus, math.ceil(limit))
    return max(1, cpus)


def _slurm_int(environ: Mapping[str, str], key: str) -> int | None:
    """A positive integer SLURM variable (``SLURM_CPUS_ON_NODE`` may read ``"96"``), else None."""
    try:
        value = int(environ.get(key, ""))
    except ValueError:
        return None
    return value if value > 0 else None


def cores_per_rank(local_ranks: int, environ: Mapping[str, str] | None = None) -> tuple[int, str]:
    """Cores one of the ``local_ranks`` training processes of this node may use, and how that was derived.

    Under SLURM: ``SLURM_CPUS_PER_TASK`` when set (one task per rank, so these are the rank's cores), else
    ``SLURM_CPUS_ON_NODE`` (the job's cores on this node) split among the local ranks. Elsewhere this
    process's ``usable_cpus`` split among them (Lightning's launcher and torchrun start every rank with the
    same affinity). Never more than ``usable_cpus``: a rank that srun pinned to its own cores sees only those.
    At least 1.

    Returns:
        (cores, a short account such as ``"96 usable cores / 8 local ranks"``).
    """
    environ = os.environ if environ is None else environ
    ranks = max(local_ranks, 1)
    usable = usable_cpus()
    per_task = _slurm_int(environ, "SLURM_CPUS_PER_TASK")
    on_node = _slurm_int(environ, "SLURM_CPUS_ON_NODE")
    if per_task is not None:
        cores, how = per_task, f"SLURM_CPUS_PER_TASK={per_task}"
    elif on_node is not None:
        cores, how = on_node // ranks, f"SLURM_CPUS_ON_NODE={on_node} / {ranks} local rank(s)"
    else:
        cores, how = usable // ranks, f"{usable} usable core(s) / {ranks} local rank(s)"
    if cores > usable:
        cores, how = usable, f"{how}, capped at this process's {usable} usable core(s)"
    return max(cores, 1), how
