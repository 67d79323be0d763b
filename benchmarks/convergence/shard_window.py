"""What the shard-aware training order costs in accuracy: final metric from shards beside the same data from a folder.

A shard folder's training order shuffles the shards, then the samples of each window of ``--data.shard_window``
shards together (``data/sampling/shard_windows.py``); a folder's order shuffles all samples. Same data, seeds and
recipe, each run a ``yolo11-lightning fit`` process; the final EMA weights of each run are scored by our evaluator
on the folder's val split. Variants:

- ``folder``: the folder (a full shuffle; equal to shards with ``--data.shard_window 0``);
- ``dealt``: shards as ``yolo11-lightning shard`` writes them (the training split dealt out: shard k of S holds
  samples k, k + S, ...), read with a small window;
- ``source-order``: the same shards written in the source's order (each shard a run of consecutive samples, as the
  converter wrote them before dealing), the same window. An ImageFolder lists its images class by class, so this
  is the case a window can hurt.

Two sets: ``classify``, the synthetic ImageFolder (class by class on disk), and ``detect``, the hard synthetic
detection set of ``convergence.py``. Shards are cut to ``--shard-images`` images each and the window is
``--window`` shards, so that a window holds a small part of the set (the defaults: 1/8), as 16 shards of 256 MB
do of a large set::

    nice -n 10 python benchmarks/convergence/shard_window.py --task classify --seeds 0 1 2
    nice -n 10 python benchmarks/convergence/shard_window.py --task detect --seeds 0 1 2
    python benchmarks/convergence/shard_window.py --task classify --report

Each run's JSON lands in ``WORKDIR/<task>/results`` and reruns skip it. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from yolo11_lightning.data.shards.writer import dealt_order

REPO = Path(__file__).resolve().parents[2]
VARIANTS = ("folder", "dealt", "source-order")
SETS = {  # per task: images, epochs, batch, image size, metric
    "classify": {"train": 256, "val": 64, "epochs": 10, "batch": 32, "imgsz": 64, "metric": "val/top1"},
    "detect": {"train": 400, "val": 100, "epochs": 15, "batch": 16, "imgsz": 224, "metric": "val/mAP50-95"},
}


def _env(threads: int) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "YOLO_OFFLINE": "1", "WANDB_MODE": "offline",
            "OMP_NUM_THREADS": str(threads)}  # fmt: skip


def make_folder(task: str, root: Path) -> Path:
    """The set of ``task`` (written once): an ImageFolder root (classify) or a dataset yaml (detect)."""
    s = SETS[task]
    if task == "classify":
        from yolo11_lightning.synthetic.classes import make_classes_dataset

        make_classes_dataset(root / "folder", s["train"], s["val"], s["imgsz"], num_classes=3, seed=0)
        return root / "folder"
    from yolo11_lightning.synthetic.hard import make_hard_synthetic_dataset

    return make_hard_synthetic_dataset(root / "folder", s["train"], s["val"], (168, 224), seed=0)


def _source_order(sizes: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """``writer.dealt_order``'s shards and counts, each shard a run of consecutive samples."""
    _, bounds = dealt_order(sizes, limit)
    return np.arange(len(sizes), dtype=np.int64), bounds


def make_shards(task: str, source: Path, out: Path, shard_images: int, source_order: bool) -> None:
    """Shards of about ``shard_images`` images each (written once), dealt or in the source's order."""
    if (out / "index.json").exists():
        return
    from yolo11_lightning.data.shards import writer
    from yolo11_lightning.data.sources.split import dataset_config, load_split

    config = dataset_config(str(source))
    records, _ = load_split(config, "train", verbose=False)
    mean_bytes = statistics.mean(os.stat(records.path(i)).st_size + 1024 for i in range(len(records)))
    if source_order:
        writer.dealt_order = _source_order
    writer.write_shards(config, str(out), task, shard_mb=shard_images * mean_bytes / 2**20)


def fit(task: str, dataset: Path, window: int | None, seed: int, out: Path, args: argparse.Namespace) -> Path:
    """One ``yolo11-lightning fit`` process; its ``last.ckpt``."""
    s = SETS[task]
    command = [
        sys.executable, "-m", "yolo11_lightning", "fit", "--model.task", task, "--data.dataset", str(dataset),
        "--data.image_size", str(s["imgsz"]), "--data.batch_size", str(s["batch"]), "--data.num_workers", "1",
        "--data.seed", str(seed), "--seed_everything", str(seed), "--trainer.max_epochs", str(s["epochs"]),
        "--trainer.accelerator", "cpu", "--trainer.enable_progress_bar", "false",
        "--trainer.default_root_dir", str(out), "--model.log_images", "0",
    ]  # fmt: skip
    if window is not None:
        command += ["--data.shard_window", str(window), "--data.shard_cache_dir", str(out / "cache")]
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "fit.log", "w") as log:
        subprocess.run(["nice", "-n", str(args.nice), *command], check=True, env=_env(1), cwd=out,
                       stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    return next(out.rglob("last.ckpt"))


def score(task: str, weights: Path, source: Path, workdir: Path) -> float:
    """The final metric of ``weights`` on the folder's val split, by our evaluator."""
    import lightning as L

    from yolo11_lightning import YOLO11Module, YOLODataModule
    from yolo11_lightning.model_files.weights import load_model

    s = SETS[task]
    model = load_model(weights, task=None)
    module = YOLO11Module(scale=model.scale, num_classes=model.num_classes, task=model.task, log_images=0)
    module.model.load_state_dict(model.float().state_dict())
    data = YOLODataModule(dataset=str(source), batch_size=s["batch"], image_size=s["imgsz"], num_workers=0,
                          task=task)  # fmt: skip
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        default_root_dir=str(workdir), enable_model_summary=False)  # fmt: skip
    return float(trainer.validate(module, data, verbose=False)[0][s["metric"]])


def run(task: str, variant: str, seed: int, root: Path, source: Path, args: argparse.Namespace) -> dict:
    """One run (skipped when its JSON exists); its row."""
    result = root / "results" / f"{variant}_s{seed}.json"
    if result.exists():
        return json.loads(result.read_text())
    dataset, window = source, None
    if variant != "folder":
        dataset, window = root / variant, args.window
    out = root / "runs" / f"{variant}_s{seed}"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    weights = fit(task, dataset, window, seed, out, args)
    wall = time.perf_counter() - start
    after = resource.getrusage(
        resource.RUSAGE_CHILDREN
    )  # all children of this process: with --jobs 2, a bound
    scored = subprocess.run(
        [sys.executable, __file__, "--task", task, "--score", str(weights), str(source), str(out)],
        check=True, env=_env(1), capture_output=True, text=True,
    )  # fmt: skip
    row = {"variant": variant, "seed": seed, "window": window, "metric": float(scored.stdout.split()[-1]),
           "wall_s": wall, "children_cpu_s": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)}  # fmt: skip
    result.parent.mkdir(parents=True, exist_ok=True)
    result.write_text(json.dumps(row, indent=1))
    print(json.dumps(row), flush=True)
    return row


def report(task: str, root: Path) -> None:
    """The table: every run, then each variant's mean and its paired difference from the folder's."""
    rows = [json.loads(p.read_text()) for p in sorted((root / "results").glob("*.json"))]
    by = {(r["variant"], r["seed"]): r["metric"] for r in rows}
    seeds = sorted({r["seed"] for r in rows})
    metric = SETS[task]["metric"]
    print(f"\n{task}: final {metric} (EMA weights, our evaluator, the folder's val split)\n")
    print(
        "| variant | "
        + " | ".join(f"seed {s}" for s in seeds)
        + " | mean | mean difference from folder (paired) |"
    )
    print("|---|" + "---|" * (len(seeds) + 2))
    for v in VARIANTS:
        values = [by.get((v, s)) for s in seeds]
        if not any(x is not None for x in values):
            continue
        cells = " | ".join("-" if x is None else f"{x:.4f}" for x in values)
        have = [x for x in values if x is not None]
        diffs = [by[(v, s)] - by[("folder", s)] for s in seeds if (v, s) in by and ("folder", s) in by]
        diff = (
            f"{statistics.mean(diffs):+.4f} (per seed {', '.join(f'{d:+.4f}' for d in diffs)})"
            if diffs
            else "-"
        )
        print(f"| {v} | {cells} | {statistics.mean(have):.4f} | {diff if v != 'folder' else ''} |")
    folder = [by[("folder", s)] for s in seeds if ("folder", s) in by]
    if len(folder) > 1:
        print(f"\nseed-to-seed standard deviation of the folder runs: {statistics.stdev(folder):.4f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", choices=tuple(SETS), default="classify")
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--shard-images", type=int, default=16, help="images per shard (about)")
    p.add_argument("--window", type=int, default=2, help="--data.shard_window of the shard runs")
    p.add_argument("--jobs", type=int, default=2, help="runs at once")
    p.add_argument("--nice", type=int, default=10)
    p.add_argument("--workdir", default="runs/shard_window")
    p.add_argument("--report", action="store_true", help="only print the table")
    p.add_argument("--score", nargs=3, metavar=("WEIGHTS", "SOURCE", "WORKDIR"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.score:
        print(score(args.task, *(Path(x) for x in args.score)))
        return
    root = Path(args.workdir).resolve() / args.task
    if not args.report:
        source = make_folder(args.task, root)
        for variant in ("dealt", "source-order"):
            if variant in args.variants:  # each in its own process: the source-order one replaces dealt_order
                code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import shard_window as b; "
                        f"b.make_shards({args.task!r}, b.Path({str(source)!r}), b.Path({str(root / variant)!r}), "
                        f"{args.shard_images}, {variant == 'source-order'})")  # fmt: skip
                subprocess.run([sys.executable, "-c", code], check=True, env=_env(1))
        jobs = [(v, s) for s in args.seeds for v in args.variants]
        with ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(lambda job: run(args.task, job[0], job[1], root, source, args), jobs))
    report(args.task, root)


if __name__ == "__main__":
    main()
