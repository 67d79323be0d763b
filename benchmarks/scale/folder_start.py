"""Folder start from outside: each side's own command line, process start -> first training batch, cold and
warm, and the peak memory of the whole process tree (summed RSS and summed PSS), at 100k images.

    python benchmarks/scale/folder_start.py                          # 100k images, workers 2 and 0, 2 rounds
    python benchmarks/scale/folder_start.py --workers 2 --rounds 1   # one setting
    python benchmarks/scale/folder_start.py --images 10000 --sides ours
    python benchmarks/scale/folder_start.py --own-install VENV/bin/python   # + ours in its own install

``--own-install``: the interpreter of an environment holding only this package and its dependencies (``python -m venv
VENV && VENV/bin/pip install -e .``), measured as a third side, "ours-own". The development install also holds the
oracle's and the extras' packages, and Lightning imports some of them whenever they are installed: torchmetrics
imports ``scipy.signal`` (~0.8 CPU s), the CSV logger's storage check imports ``s3fs`` (~0.3 CPU s).

Data (``_scale_data``, as ``scale.py``): tiny JPEGs in folders of 10,000, 1-3 boxes each, generated once under
``--data`` (default: $BENCH_DIR) and reused. Both sides run as separate processes through their command lines,
``yolo11-lightning fit`` and the reference's ``yolo train`` (YOLO_OFFLINE=1), with the same model (yolo11n from
its yaml), image size, batch, loader workers and image cache (off); one torch thread (OMP_NUM_THREADS=1).
The reference's trainer sets ``workers=0`` on a CPU device; here its ``workers`` is set back to the value asked
for (as ``scale.py`` does): at 0 it is its default CPU run, at 2 ours is (``data.num_workers`` defaults to 2).

Cold: both sides' label caches deleted first; warm: the cache the cold run wrote. Time: from the process's
start (just before ``Popen``) to the end of the first training batch's backward pass (``torch.Tensor.backward``,
wrapped in the child process, which then ends the run). Memory: every 50 ms this script reads each process
of the tree (the run and all its children: DataLoader workers, label check processes): RSS from
``/proc/<pid>/statm`` and PSS from ``/proc/<pid>/smaps_rollup``; the peak of each sum is reported. RSS counts a
page shared by N processes N times (forked DataLoader workers share the parent's pages until written), PSS
counts it once in total. "anon PSS": the PSS of anonymous and shared memory alone (``Pss_Anon`` + ``Pss_Shmem``):
the memory the run allocated, without the library files it maps, whose PSS also depends on which other processes
of the machine map the same files (this script's own process maps torch: a side run from another install shares
none of its libraries with it). CPU seconds: user + system of every process of the tree, last seen.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1]
MIB = 1 << 20
PAGE = os.sysconf("SC_PAGE_SIZE")
TICK = os.sysconf("SC_CLK_TCK")
STAMP = "FIRST_BACKWARD_END "
SIDES = ("ours", "reference")


# ------------------------------------------------------------------------------------ in the measured process
def run_side(side: str, workers: int, argv: list[str]) -> None:
    """Run ``side``'s command line (``argv``) in this process; print a stamp and end at the first backward."""
    import multiprocessing

    sys.path.insert(0, str(BENCHMARKS.parent))  # this checkout's package, as _common does
    import torch

    backward = torch.Tensor.backward

    def first_backward(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        backward(self, *args, **kwargs)
        print(STAMP + repr(time.time()), flush=True)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # torch's handler would raise on the workers' ends
        for child in multiprocessing.active_children():  # DataLoader workers
            child.kill()  # ours ignore SIGTERM
        os._exit(0)

    torch.Tensor.backward = first_backward
    # Before the import: ultralytics reads sys.argv when imported.
    sys.argv = ["yolo11-lightning" if side == "ours" else "yolo", *argv]
    if side == "ours":
        from yolo11_lightning.cli.main import main as cli
    else:
        import ultralytics.engine.trainer as engine
        from ultralytics.cfg import entrypoint as cli

        init = engine.BaseTrainer.__init__

        def keep_workers(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            init(self, *args, **kwargs)
            self.args.workers = workers  # undo its CPU override (workers=0): the workers asked for

        engine.BaseTrainer.__init__ = keep_workers
    sys.exit(cli())


# ------------------------------------------------------------------------------------ measuring
def _tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (from /proc/<pid>/task/*/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                todo += [int(c) for c in Path(f"/proc/{p}/task/{task}/children").read_text().split()]
        except OSError:
            pass
    return out


def _sample(pid: int) -> tuple[int, int, int, float] | None:
    """RSS bytes, PSS bytes, anonymous and shared-memory PSS bytes and CPU seconds of one process; None once it
    ended."""
    try:
        rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
        pss = owned = 0
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                pss = int(line.split()[1]) * 1024
            elif line.startswith(("Pss_Anon:", "Pss_Shmem:")):
                owned += int(line.split()[1]) * 1024
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(stat[11]) + int(stat[12])) / TICK  # utime, stime
    except (OSError, IndexError, ValueError):
        return None
    return rss, pss, owned, cpu


def measure(side: str, yaml: Path, workers: int, args, workdir: Path) -> dict:
    """One start of ``side`` in a fresh process: seconds to the first batch, peak RSS / PSS, CPU seconds."""
    if side.startswith("ours"):
        argv = [
            "fit", "--data.dataset", str(yaml), "--data.image_size", str(args.imgsz),
            "--data.batch_size", str(args.batch), "--data.num_workers", str(workers),
            "--data.cache_images", "false", "--model.scale", "n", "--trainer.max_epochs", "1",
            "--trainer.default_root_dir", str(workdir / "ours"),
        ]  # fmt: skip
    else:
        argv = [
            "train", f"data={yaml}", "model=yolo11n.yaml", f"imgsz={args.imgsz}", f"batch={args.batch}",
            f"workers={workers}", "cache=False", "epochs=1", "plots=False", "device=cpu",
            f"project={workdir}", "name=reference", "exist_ok=True",
        ]  # fmt: skip
    python = args.own_install if side == "ours-own" else sys.executable
    worker_side = "ours" if side.startswith("ours") else side
    command = [python, __file__, "--worker", worker_side, "--keep-workers", str(workers), "--", *argv]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env.update(YOLO_OFFLINE="1", WANDB_MODE="offline", PYTHONUNBUFFERED="1")
    for folder in ("ours", "reference"):  # a fresh run folder: no earlier versions to list
        shutil.rmtree(workdir / folder, ignore_errors=True)
    out = workdir / f"{side}.log"
    peak_rss = peak_pss = peak_owned = peak_main_pss = 0
    cpu: dict[int, float] = {}
    with open(out, "w") as log:
        start = time.time()
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
        while proc.poll() is None:
            rss = pss = owned = main_pss = 0
            for pid in _tree(proc.pid):
                got = _sample(pid)
                if got is not None:
                    rss, pss, owned, cpu[pid] = rss + got[0], pss + got[1], owned + got[2], got[3]
                    main_pss = got[1] if pid == proc.pid else main_pss
            peak_rss = max(peak_rss, rss)
            peak_owned = max(peak_owned, owned)
            if pss > peak_pss:
                peak_pss, peak_main_pss = pss, main_pss
            time.sleep(0.05)
    text = out.read_text()
    stamps = [line for line in text.splitlines() if line.startswith(STAMP)]
    if proc.returncode != 0 or not stamps:
        raise RuntimeError(f"{side} failed (exit {proc.returncode}):\n{text[-4000:]}")
    return {
        "first_batch_s": float(stamps[-1][len(STAMP) :]) - start,
        "cpu_s": sum(cpu.values()),
        "processes": len(cpu),
        "peak_rss_mib": peak_rss / MIB,
        "peak_pss_mib": peak_pss / MIB,
        "peak_anon_pss_mib": peak_owned / MIB,
        "main_pss_mib": peak_main_pss / MIB,  # the training process's share at the PSS peak
    }


def delete_caches(yaml: Path) -> None:
    """Both sides' label caches (``<labels folder>.cache`` and ``<labels folder>.<split>.cache.npz``)."""
    for pattern in ("*.cache", "*.cache.npz"):
        for path in (yaml.parent / "labels").rglob(pattern):
            path.unlink()


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":  # the measured process: side, workers, --, argv
        run_side(sys.argv[2], int(sys.argv[4]), sys.argv[6:])
        return
    sys.path.insert(0, str(BENCHMARKS))  # the shared helpers (_common, _scale_data)
    import _common as C
    import _scale_data

    ap = C.parser(__doc__)
    ap.add_argument("--images", type=int, default=100_000)
    ap.add_argument("--data", default=None, help="where the generated images go (default: $BENCH_DIR)")
    ap.add_argument("--workers", type=int, nargs="+", default=[2, 0], help="loader workers of both sides")
    ap.add_argument("--imgsz", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2, help="cold + warm starts per side and setting")
    ap.add_argument("--sides", nargs="+", default=list(SIDES), choices=SIDES)
    ap.add_argument(
        "--own-install", default=None, help="python of an install of only this package: side ours-own"
    )
    args = ap.parse_args()
    if args.own_install:
        args.sides.insert(args.sides.index("ours") + 1 if "ours" in args.sides else 0, "ours-own")
    yaml = _scale_data.scale_dataset(Path(args.data) if args.data else C.default_workdir(), args.images)
    workdir = C.default_workdir() / "folder_start_runs"
    workdir.mkdir(parents=True, exist_ok=True)
    C.print_machine_info(1)
    results: dict[tuple, list[dict]] = {}
    for setting in args.workers:
        for r, side in C.rounds(args.sides, args.rounds):
            for kind in ("cold", "warm"):
                if kind == "cold":
                    delete_caches(yaml)
                res = measure(side, yaml, setting, args, workdir)
                load = C.load_average()
                print(
                    f"workers {setting} {side} {kind} (round {r}, load {load}): {json.dumps(res)}", flush=True
                )
                results.setdefault((setting, side, kind), []).append(res)
    rows = []
    for (setting, side, kind), runs in results.items():
        rows.append([
            setting, side, kind, *(C.median([r[k] for r in runs]) for k in
                                   ("first_batch_s", "cpu_s", "peak_rss_mib", "peak_pss_mib", "peak_anon_pss_mib",
                                    "main_pss_mib")),
            max(r["processes"] for r in runs),
        ])  # fmt: skip
    headers = [
        "workers",
        "side",
        "start",
        "first batch s",
        "CPU s",
        "peak RSS MiB",
        "peak PSS MiB",
        "anon PSS MiB",
    ]
    caption = f"{args.images} images, imgsz {args.imgsz}, batch {args.batch}: median of {args.rounds}"
    C.print_table(f"{caption} (load {C.load_average()})", [*headers, "main PSS MiB", "processes"], rows)


if __name__ == "__main__":
    main()
