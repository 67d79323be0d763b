"""Shared pieces of the benchmarks: machine description, alternating timing, tables, command line, workers,
datasets (the measured training runs of both sides are in ``_fit``).

Benchmarks run as scripts (``python benchmarks/<group>/x.py``), so this module is imported as ``_common``
once the script's first lines have put ``benchmarks/`` on ``sys.path``. The reference package (ultralytics,
AGPL) is an oracle here only: it is imported inside the functions that need it, never by the
``yolo11_lightning`` package.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run from anywhere without installing the package
    sys.path.insert(0, str(REPO))
os.environ.setdefault("YOLO_OFFLINE", "1")  # the oracle must never reach the network
os.environ.setdefault("WANDB_MODE", "offline")

RESULT_TAG = "BENCH_RESULT "  # prefix of the JSON line a worker subprocess prints


# ------------------------------------------------------------------------------------ machine
def cpu_name() -> str:
    """CPU model name (from /proc/cpuinfo on Linux)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(module: str) -> str:
    try:
        return __import__(module).__version__
    except Exception:  # not installed, or its import fails: say so instead of stopping the benchmark
        return "-"


def machine_info(threads: int | None = None) -> str:
    """One paragraph: device, cores, threads, load average and package versions."""
    if torch.cuda.is_available():
        device = f"{torch.cuda.get_device_name()} (CUDA {torch.version.cuda})"
    else:
        device = "CPU only"
    load = " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "-"
    lines = [
        f"machine: {cpu_name()}, {os.cpu_count()} cores, {device}; load average {load}",
        f"torch threads {threads if threads is not None else torch.get_num_threads()}; python "
        f"{platform.python_version()}, torch {torch.__version__}, lightning {_version('lightning')}, "
        f"torchvision {_version('torchvision')}, ultralytics {_version('ultralytics')} (oracle)",
    ]
    return "\n".join(lines)


def print_machine_info(threads: int | None = None) -> None:
    """The header every benchmark prints first (``machine_info``), flushed before the measuring starts."""
    print(machine_info(threads), flush=True)


def load_average() -> str:
    """The 1-minute load average, to show how busy the machine was while measuring."""
    return f"{os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else "-"


# ------------------------------------------------------------------------------------ timing
def sync(device: torch.device | str) -> None:
    """Wait for queued device work, so wall-clock time covers it."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], Any], device: torch.device | str = "cpu") -> float:
    """Seconds of one call of ``fn``, device work included."""
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def alternate(
    fns: Sequence[Callable[[], Any]], rounds: int, warmup: int = 1, device: torch.device | str = "cpu"
) -> list[list[float]]:
    """Seconds of each call of every ``fn``, measured in alternating rounds.

    Round i runs the functions in order, round i+1 in reverse, so load from other processes and slow
    drifts (thermal, caches) hit all of them alike. Returns one list of ``rounds`` timings per function.
    """
    for _ in range(warmup):
        for fn in fns:
            fn()
    times: list[list[float]] = [[] for _ in fns]
    order = list(range(len(fns)))
    for r in range(rounds):
        for i in order if r % 2 == 0 else order[::-1]:
            times[i].append(time_call(fns[i], device))
    return times


def rounds(items: Sequence[Any], count: int) -> Iterator[tuple[int, Any]]:
    """``(round, item)`` for ``count`` rounds over ``items``: in order on even rounds, reversed on odd ones.

    The same alternation as ``alternate``, for runs that are whole worker processes.
    """
    for r in range(count):
        for item in items if r % 2 == 0 else items[::-1]:
            yield r, item


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def spread(values: Sequence[float]) -> float:
    """Half the min-max range over the median, in percent: how noisy a figure is."""
    if len(values) < 2:
        return float("nan")
    m = statistics.median(values)
    return 50.0 * (max(values) - min(values)) / m if m else float("nan")


def ratio(ours: float, theirs: float) -> str:
    """``ours / theirs`` as text; '-' when the oracle figure is missing."""
    if not theirs or theirs != theirs or ours != ours:
        return "-"
    return f"{ours / theirs:.2f}"


# ------------------------------------------------------------------------------------ tables
def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (readable in a terminal, pasteable into a script's results file)."""

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return "-" if v != v else f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
        return str(v)

    text = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in text)) if text else len(h) for i, h in enumerate(headers)]
    line = lambda cells: "| " + " | ".join(c.rjust(w) for c, w in zip(cells, widths)) + " |"  # noqa: E731
    return "\n".join(
        [line(headers), "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|", *map(line, text)]
    )


def print_table(caption: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """``caption`` between blank lines, then the table (``format_table``)."""
    print(f"\n{caption}\n")
    print(format_table(headers, rows))


# ------------------------------------------------------------------------------------ command line
def parser(
    description: str | None, worker: bool | Sequence[str] = False, hidden: Sequence[str] = ()
) -> argparse.ArgumentParser:
    """The argument parser of a benchmark script.

    ``description`` (usually the module docstring) is shown in ``--help`` as written. ``worker``: the script
    starts itself as worker subprocesses (``run_worker``), which get the hidden ``--worker`` option, a flag
    (``True``) or one of the given kinds; ``hidden``: further hidden string options the parent passes its
    workers (for example ``"--yaml"``, ``"--workdir"``).
    """
    ap = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    if worker is True:
        ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    elif worker:
        ap.add_argument("--worker", choices=tuple(worker), help=argparse.SUPPRESS)
    for option in hidden:
        ap.add_argument(option, help=argparse.SUPPRESS)
    return ap


def run_as_worker(
    args: argparse.Namespace, work: Callable[[argparse.Namespace], Any] | dict[str, Callable[..., Any]]
) -> bool:
    """In a worker process (``--worker`` given): run ``work`` (or ``work[args.worker]``), emit the dict it
    returns (a worker that emits itself returns None), and return True; in the parent return False."""
    if not args.worker:
        return False
    fn = work[args.worker] if isinstance(work, dict) else work
    result = fn(args)
    if result is not None:
        emit(result)
    return True


# ------------------------------------------------------------------------------------ data
def synthetic_yaml(
    root: str | Path,
    num_train: int,
    num_val: int,
    image_size: int,
    num_classes: int = 8,
    task: str = "detect",
) -> Path:
    """A synthetic dataset (1-8 objects per image), reused when already generated.

    ``task="segment"``: the segmentation set (YOLO-seg polygon rows, exact outlines) of the same shapes.
    Its yaml has no ``path`` key, so the oracle reads it as well as ``YOLODataModule`` does.
    """
    from yolo11_lightning.synthetic.shapes import make_synthetic_dataset

    name = f"syn_{num_train}_{num_val}_{image_size}_{num_classes}" + ("" if task == "detect" else f"_{task}")
    return make_synthetic_dataset(
        Path(root) / name, num_train=num_train, num_val=num_val, image_size=image_size,
        num_classes=num_classes, max_objects=8, min_objects=1, seed=0, task=task,
    )  # fmt: skip


def default_workdir() -> Path:
    """Where benchmarks keep generated data and run folders between runs (not in git)."""
    path = Path(os.environ.get("BENCH_DIR", "/tmp/yolo11_lightning_bench"))
    path.mkdir(parents=True, exist_ok=True)
    return path


# ------------------------------------------------------------------------------------ workers
def emit(result: dict[str, Any]) -> None:
    """Print a worker's result as one tagged JSON line (the parent picks it from stdout)."""
    print(RESULT_TAG + json.dumps(result), flush=True)


def run_worker(
    script: str | Path, args: Sequence[str], threads: int, timeout: float = 900, env: dict | None = None
) -> dict[str, Any]:
    """Run ``python script --worker ...args`` in a fresh process and return the dict it emitted.

    A fresh process per measurement gives both sides the same start: thread settings, allocator and
    imports (the oracle changes global state on import: OpenCV threads, OMP_NUM_THREADS).
    """
    full_env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "PYTHONUNBUFFERED": "1",
        "PYTHONWARNINGS": "ignore",
        **(env or {}),
    }
    proc = subprocess.run(
        [sys.executable, str(script), "--worker", *args],
        env=full_env, capture_output=True, text=True, timeout=timeout, cwd=REPO,
    )  # fmt: skip
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG) :])
    raise RuntimeError(
        f"worker {script} {' '.join(args)} failed (exit {proc.returncode}):\n"
        f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    )


def window_ends(count: int, skip: int, cycle: int = 1) -> tuple[int, int]:
    """Indices of the two stamps ``steady_rate`` reads among ``count`` step stamps: the end of step ``skip - 1``
    and the end of the last whole ``cycle`` after it (the stamps to take after a device sync)."""
    if skip < 1:
        raise ValueError("skip must be >= 1: the first step has no start stamp")
    if count < skip + cycle:
        raise ValueError(f"need at least {skip + cycle} steps, got {count}")
    return skip - 1, skip - 1 + (count - skip) // cycle * cycle


def steady_rate(stamps: Sequence[float], items_per_step: int, skip: int, cycle: int = 1) -> float:
    """Items per second between step ``skip`` and the last whole ``cycle`` of steps after it.

    ``stamps[i]`` is the time step i ended. Whole accumulation cycles keep the share of optimiser
    steps exact; the first ``skip`` steps (allocator warm-up, first optimiser step) are left out.
    """
    first, last = window_ends(len(stamps), skip, cycle)
    return items_per_step * (last - first) / (stamps[last] - stamps[first])


# ------------------------------------------------------------------------------------ oracle
def oracle_available() -> bool:
    try:
        import ultralytics  # noqa: F401
    except ImportError:
        return False
    return True
