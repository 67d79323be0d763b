"""The CPU default: whole-run wall time of a short CLI fit under each thread option, idle and beside a busy process.

One run = one fresh process, from start to exit, as a user times it: ``yolo11-lightning fit`` on the built-in
synthetic set (yolo11n, batch 16, 2 loader workers, no validation) for ``--epochs`` epochs, and the reference
trainer (``YOLO(...).train``) on the same data, as shipped: its own CPU choices (0 workers, ``cores - 1``
threads), its end-of-run validation skipped like ours. Each condition runs every variant once per round, the
variants alternating, so slow drifts of the machine hit all of them alike::

    python benchmarks/speed/cpu_default.py                      # idle and loaded, 2 rounds
    python benchmarks/speed/cpu_default.py --conditions idle --rounds 1 --variants threads1 threads2

"Loaded" starts one busy process (a Python spin loop, same priority) for the whole condition: another job on
the same node, as on shared CI machines; "crowded" starts three. Variants differ only in
``--machine.cpu_threads`` and the OpenMP environment of the process (``OMP_WAIT_POLICY``, ``GOMP_SPINCOUNT``:
GNU OpenMP's waiting threads spin 300,000 times by default, burning the core another thread needs when the
cores are shared; ``training/cpu_threads.py``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers (_common, ...)

from _common import (
    REPO,
    default_workdir,
    load_average,
    median,
    parser,
    print_machine_info,
    print_table,
    synthetic_yaml,
)

# name -> (extra CLI options, extra environment); "reference" is the oracle's trainer.
VARIANTS: dict[str, tuple[list[str], dict[str, str]]] = {
    "auto": ([], {}),  # what a user gets: --machine.cpu_threads auto and the package's OpenMP setting
    "threads1": (["--machine.cpu_threads", "1"], {"OMP_WAIT_POLICY": "ACTIVE"}),
    "threads2": (["--machine.cpu_threads", "2"], {"OMP_WAIT_POLICY": "ACTIVE"}),
    "threads2_passive": (["--machine.cpu_threads", "2"], {"OMP_WAIT_POLICY": "PASSIVE"}),
    "threads1_passive": (["--machine.cpu_threads", "1"], {"OMP_WAIT_POLICY": "PASSIVE"}),
    # An empty OMP_WAIT_POLICY: OpenMP's own default (a bounded spin), which the command does not replace.
    "threads2_unset": (["--machine.cpu_threads", "2"], {"OMP_WAIT_POLICY": ""}),
    "threads2_spin1k": (["--machine.cpu_threads", "2"], {"OMP_WAIT_POLICY": "", "GOMP_SPINCOUNT": "1000"}),
    "threads2_spin10k": (["--machine.cpu_threads", "2"], {"OMP_WAIT_POLICY": "", "GOMP_SPINCOUNT": "10000"}),
    "threads2_spin100k": (
        ["--machine.cpu_threads", "2"],
        {"OMP_WAIT_POLICY": "", "GOMP_SPINCOUNT": "100000"},
    ),
    "threads2_passive_1worker": (
        ["--machine.cpu_threads", "2", "--data.num_workers", "1"],
        {"OMP_WAIT_POLICY": "PASSIVE"},
    ),
    "reference": ([], {}),
}

BUSY = {"idle": 0, "loaded": 1, "crowded": 3}  # condition -> busy processes beside the run

REFERENCE_SCRIPT = """
import sys, torch
from ultralytics import YOLO
from ultralytics.engine.trainer import BaseTrainer
BaseTrainer.validate = lambda self: ({}, 0.0)  # no validation, as on our side
yaml, epochs, size, batch, project = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
YOLO("yolo11n.yaml").train(
    data=yaml, epochs=epochs, imgsz=size, batch=batch, workers=2, device="cpu", val=False, plots=False,
    amp=False, project=project, name="ref", exist_ok=True, verbose=False, seed=0, deterministic=False,
)
"""


@contextlib.contextmanager
def busy_processes(count: int) -> Iterator[None]:
    """``count`` spinning Python processes while the block runs."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def run_variant(name: str, args: Any, yaml: Path, workdir: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process tree) of one whole run."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "YOLO_OFFLINE": "1", "WANDB_MODE": "offline"}
    env.pop("OMP_NUM_THREADS", None)
    env.pop("OMP_WAIT_POLICY", None)
    env.pop("GOMP_SPINCOUNT", None)
    options, extra_env = VARIANTS[name]
    env.update(extra_env)
    run_dir = Path(tempfile.mkdtemp(dir=workdir, prefix=f"{name}_"))
    if name == "reference":
        command = [
            sys.executable, "-c", REFERENCE_SCRIPT, str(yaml), str(args.epochs), str(args.image_size),
            str(args.batch), str(run_dir),
        ]  # fmt: skip
    else:
        command = [
            sys.executable, "-m", "yolo11_lightning", "fit", "--config", "quickstart",
            "--data.dataset", str(yaml), "--data.image_size", str(args.image_size),
            "--data.batch_size", str(args.batch), "--data.num_workers", "2",
            "--trainer.max_epochs", str(args.epochs), "--trainer.limit_val_batches", "0",
            "--trainer.num_sanity_val_steps", "0", "--trainer.default_root_dir", str(run_dir),
            "--trainer.enable_progress_bar", "false", *options,
        ]  # fmt: skip
    start = time.perf_counter()
    before = os.times()
    proc = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - start
    after = os.times()
    if proc.returncode:
        raise RuntimeError(f"{name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return wall, cpu


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--conditions", nargs="+", default=["idle", "loaded"], choices=list(BUSY))
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--image-size", type=int, default=320)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--train", type=int, default=256, help="training images of the synthetic set")
    args = ap.parse_args()
    print_machine_info()
    workdir = default_workdir() / "cpu_default"
    workdir.mkdir(parents=True, exist_ok=True)
    yaml = synthetic_yaml(workdir, args.train, 16, args.image_size)
    rows = []
    for condition in args.conditions:
        walls: dict[str, list[float]] = {n: [] for n in args.variants}
        cpus: dict[str, list[float]] = {n: [] for n in args.variants}
        with busy_processes(BUSY[condition]):
            time.sleep(1.0)
            for round_index in range(args.rounds):
                order = args.variants if round_index % 2 == 0 else list(reversed(args.variants))
                for name in order:
                    wall, cpu = run_variant(name, args, yaml, workdir)
                    walls[name].append(wall)
                    cpus[name].append(cpu)
                    print(
                        f"{condition} {name}: {wall:.1f} s wall, {cpu:.1f} s CPU ({load_average()})",
                        flush=True,
                    )
        reference = median(walls["reference"]) if "reference" in walls else float("nan")
        for name in args.variants:
            wall = median(walls[name])
            lead = reference / wall if reference == reference else float("nan")
            rows.append([condition, name, wall, median(cpus[name]), lead])
    print_table(
        f"Whole {args.epochs}-epoch run, yolo11n, {args.image_size} px, batch {args.batch}, {args.train} images; "
        "median of the rounds; lead = reference wall / variant wall",
        ["condition", "variant", "wall s", "CPU s", "lead over reference"],
        rows,
    )


if __name__ == "__main__":
    main()
