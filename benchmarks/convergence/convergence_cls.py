"""Convergence of YOLO11n-cls from scratch: ours beside the oracle's ``ClassificationTrainer``, same data, same epochs.

The data is the synthetic classification set (``yolo11_lightning.synthetic.classes``: one shape per image,
in its class's hue band, distractors; ``--any-hue``: any colour, the outline alone tells the class) written as an
ImageFolder root, which both sides read as is (ours:
``--data.dataset <root>``, the oracle: ``data=<root>``; class names the sorted folders on both). Each side runs
with its defaults (ours: ``YOLO11Module`` / ``YOLODataModule``; the oracle: its default configuration), only the
data, epochs, image size, batch, seed, workers and device set. The final EMA weights of both sides (ours:
``last.ckpt``; the oracle: ``last.pt``, read by our safe reader) are scored by the same evaluator: our evaluation
transform (pixel-equal to the oracle's) and ``ClassificationAccuracy`` (equal to its validator's numbers).

Throughput, end to end: training images (images x epochs) over the wall time of the whole run (start-up, training,
per-epoch validation), both sides measured alike; and each side's own training speed (``train_speed``)::

    nice -n 10 python benchmarks/convergence/convergence_cls.py --epochs 10 --train 384 --val 96 --classes 5 --seeds 0 1 2

Prints a table per seed and the means, and writes it as JSON under ``--workdir``. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _env(threads: int) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "YOLO_OFFLINE": "1", "WANDB_MODE": "offline",
            "OMP_NUM_THREADS": str(threads)}  # fmt: skip


def run_ours(root: Path, out: Path, args: argparse.Namespace, seed: int) -> tuple[Path, float]:
    command = [
        sys.executable, "-m", "yolo11_lightning", "fit", "--model.task", "classify", "--data.dataset", str(root),
        "--data.image_size", str(args.imgsz), "--data.batch_size", str(args.batch), "--data.num_workers",
        str(args.workers), "--data.seed", str(seed), "--seed_everything", str(seed), "--trainer.max_epochs",
        str(args.epochs), "--trainer.accelerator", "cpu", "--trainer.enable_progress_bar", "false",
        "--trainer.default_root_dir", str(out), "--model.log_images", "0", "--trainer.log_every_n_steps", "1",
    ]  # fmt: skip
    start = time.perf_counter()
    subprocess.run(command, check=True, env=_env(args.threads), cwd=out.parent, capture_output=True)
    return next(out.rglob("last.ckpt")), time.perf_counter() - start


_ORACLE = """
import sys, torch
torch.set_num_threads(int(sys.argv[7]))
from ultralytics import YOLO
YOLO("yolo11n-cls.yaml").train(data=sys.argv[1], epochs=int(sys.argv[2]), imgsz=int(sys.argv[3]),
    batch=int(sys.argv[4]), seed=int(sys.argv[5]), workers=int(sys.argv[8]), device="cpu", project=sys.argv[6],
    name="run", exist_ok=True, plots=False, verbose=False, amp=False)
"""


def run_oracle(root: Path, out: Path, args: argparse.Namespace, seed: int) -> tuple[Path, float]:
    command = [sys.executable, "-c", _ORACLE, str(root), str(args.epochs), str(args.imgsz), str(args.batch),
               str(seed), str(out), str(args.threads), str(args.workers)]  # fmt: skip
    start = time.perf_counter()
    subprocess.run(command, check=True, env=_env(args.threads), cwd=out.parent, capture_output=True)
    return out / "run" / "weights" / "last.pt", time.perf_counter() - start


def train_speed(out: Path, args: argparse.Namespace) -> float:
    """Each side's own measure of training speed: ours, the mean of the logged ``perf/images_per_second``
    (training steps); the oracle, training images over its ``results.csv`` time (training and validation)."""
    import csv

    logged = next(out.rglob("metrics.csv"), None)
    if logged is not None:
        speeds = [
            float(r["perf/images_per_second"])
            for r in csv.DictReader(logged.open())
            if r.get("perf/images_per_second")
        ]
        return sum(speeds) / max(len(speeds), 1)
    rows = list(csv.DictReader((out / "run" / "results.csv").open()))
    return args.train * args.epochs / float(rows[-1]["time"].strip() or "nan")


def score(weights: Path, root: Path, imgsz: int) -> dict[str, float]:
    """Top-1 / top-5 of a model file (ours or the reference's) on the val split, by our evaluator."""
    import torch

    from yolo11_lightning.data.image_dataset import ImageDataset
    from yolo11_lightning.data.sources.split import dataset_config, load_split
    from yolo11_lightning.model_files.weights import load_model
    from yolo11_lightning.tasks import get_task
    from yolo11_lightning.tasks.classify.metric import ClassificationAccuracy

    config = dataset_config(root)
    records, _ = load_split(config, "val", verbose=False)
    data = ImageDataset(records, imgsz, augment=False, task=get_task("classify"))
    model = load_model(weights, task=None).eval()
    metric = ClassificationAccuracy()
    with torch.no_grad():
        for start in range(0, len(data), 64):
            samples = [data[i] for i in range(start, min(start + 64, len(data)))]
            images = torch.stack([s["image"] for s in samples]).float() / 255
            labels = torch.tensor([int(s["labels"][0, 0]) for s in samples])
            metric.update(model(images), labels, torch.tensor([s["index"] for s in samples]))
    return {k: float(v) for k, v in metric.compute().items()}


def report(rows: list[dict]) -> None:
    """The table: every run, then each side's means, and the ratio of the mean top-1s."""
    columns = [("top1", ".4f"), ("top5", ".4f"), ("loss", ".4f"), ("wall_s", ".1f"), ("images_per_s", ".1f"),
               ("train_images_per_s", ".1f")]  # fmt: skip
    print(f"\n{'side':<8}{'seed':>6}" + "".join(f"{c:>20}" for c, _ in columns))
    for r in rows:
        print(f"{r['side']:<8}{r['seed']:>6}" + "".join(f"{r[c]:>20{f}}" for c, f in columns))
    means = {}
    for side in ("ours", "oracle"):
        mine = [r for r in rows if r["side"] == side]
        means[side] = {c: statistics.mean(r[c] for r in mine) for c, _ in columns}
        print(f"{side:<8}{'mean':>6}" + "".join(f"{means[side][c]:>20{f}}" for c, f in columns))
    ratio = means["ours"]["top1"] / max(means["oracle"]["top1"], 1e-9)
    print(f"ours / oracle mean top-1: {ratio:.3f} (target >= 0.95)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workdir", default="runs/convergence_cls")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--train", type=int, default=384)
    p.add_argument("--val", type=int, default=96)
    p.add_argument("--classes", type=int, default=5)
    p.add_argument("--imgsz", type=int, default=64)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument(
        "--any-hue", action="store_true", help="shapes in any hue: the outline alone tells the class"
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads per run (both sides)")
    p.add_argument("--workers", type=int, default=0, help="loader workers per run (both sides)")
    p.add_argument(
        "--report",
        action="store_true",
        help="only print the table of --workdir's results.json (or of --workdir, a results file)",
    )
    args = p.parse_args()
    if args.report:
        saved = Path(args.workdir)
        report(json.loads((saved if saved.is_file() else saved / "results.json").read_text())["rows"])
        return

    from yolo11_lightning.synthetic.classes import make_classes_dataset

    work = Path(args.workdir).resolve()
    root = work / "data"
    make_classes_dataset(
        root, args.train, args.val, args.imgsz, args.classes, seed=0, class_hues=not args.any_hue
    )
    rows = []
    for seed in args.seeds:
        for side, runner in (("ours", run_ours), ("oracle", run_oracle)):
            out = work / f"{side}-seed{seed}"
            weights, seconds = runner(root, out, args, seed)
            row = {"side": side, "seed": seed, **score(weights, root, args.imgsz), "wall_s": seconds,
                   "images_per_s": args.train * args.epochs / seconds, "train_images_per_s": train_speed(out, args)}  # fmt: skip

            rows.append(row)
            print(json.dumps(row), flush=True)
    (work / "results.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    report(rows)


if __name__ == "__main__":
    main()
