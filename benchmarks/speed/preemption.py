"""Work lost to stops and kills, seconds from signal to exit, and checkpoint size / write time.

    python benchmarks/speed/preemption.py                 # yolo11n and yolo11s, 160 px synthetic, CPU
    python benchmarks/speed/preemption.py --scales n --image-size 320

For each scale, one CLI fit per kill kind runs in a subprocess and is signalled from here once it has trained
``--signal-after`` batches (read from Lightning's per-step CSV metrics):

- SIGTERM: every rank stops at the next optimiser step and saves ``last.ckpt`` (exit 143);
- SIGUSR1 (as SLURM sends it, without SLURM here): the same path, exit 138;
- SIGKILL after a time-based save (``--last_checkpoint.every_n_minutes``): nothing runs after the signal.

"Batches lost" = batches trained before the signal minus those the checkpoint holds (negative: the run
finished its accumulation window after the signal and saved more). The checkpoint size and the time of one
``Trainer.save_checkpoint`` (model, EMA, optimiser, loops; atomic write with fsync) are measured in-process.
"""

from __future__ import annotations

import argparse
import csv
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers (_common, ...)

import _common as C
import torch

KINDS = {"SIGTERM": signal.SIGTERM, "SIGUSR1": signal.SIGUSR1, "SIGKILL": signal.SIGKILL}


def _batches_logged(root: Path) -> int:
    """Training batches with a logged loss so far (log_every_n_steps=1 logs every batch)."""
    rows = 0
    for path in root.glob("lightning_logs/*/metrics.csv"):
        with open(path) as f:
            rows += sum(1 for row in csv.DictReader(f) if row.get("train/box_loss"))
    return rows


def _saved_batches(root: Path, batches_per_epoch: int, batch: int) -> int:
    (path,) = root.glob("lightning_logs/*/checkpoints/last.ckpt")
    sampler = torch.load(path, map_location="cpu", weights_only=True, mmap=True)["YOLODataModule"][
        "train_sampler"
    ]
    return sampler["epoch"] * batches_per_epoch + sampler["consumed_samples"] // batch


def kill_run(args: argparse.Namespace, scale: str, kind: str, yaml: Path) -> dict:
    root = Path(tempfile.mkdtemp(prefix=f"preempt-{scale}-{kind}-", dir=C.default_workdir()))
    command = [
        sys.executable, "-m", "yolo11_lightning", "fit", "--config", "configs/quickstart.yaml",
        "--model.scale", scale, "--data.dataset", str(yaml), "--data.image_size", str(args.image_size),
        "--data.batch_size", str(args.batch), "--data.num_workers", "1", "--trainer.accelerator", "cpu",
        "--trainer.max_epochs", "3", "--trainer.log_every_n_steps", "1", "--trainer.enable_progress_bar", "false",
        "--trainer.default_root_dir", str(root), "--model.log_images", "0",
        "--last_checkpoint.every_n_minutes", "0.01" if kind == "SIGKILL" else "10",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        command, cwd=C.REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    while _batches_logged(root) < args.signal_after:
        if proc.poll() is not None:
            raise RuntimeError(f"{scale}/{kind}: the run ended first:\n{proc.stderr.read()[-3000:]}")
        time.sleep(0.05)
    done = _batches_logged(root)
    sent = time.monotonic()
    proc.send_signal(KINDS[kind])
    proc.communicate(timeout=600)
    seconds = time.monotonic() - sent
    saved = _saved_batches(root, args.train // args.batch, args.batch)
    return {
        "exit": proc.returncode,
        "seconds_to_exit": seconds,
        "batches_done": done,
        "batches_lost": done - saved,
    }


def checkpoint_cost(scale: str, yaml: Path, image_size: int) -> tuple[float, float]:
    """(size in MB, seconds per save) of a real checkpoint after one training step."""
    import lightning as L

    from yolo11_lightning import YOLO11Module, YOLODataModule
    from yolo11_lightning.training.checkpointing import use_atomic_checkpoints

    data = YOLODataModule(dataset=str(yaml), batch_size=4, image_size=image_size, num_workers=0)
    module = YOLO11Module(
        scale=scale, num_classes=data.num_classes, class_names=data.class_names, log_images=0
    )
    trainer = L.Trainer(accelerator="cpu", max_steps=1, limit_val_batches=0, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tempfile.mkdtemp(dir=C.default_workdir()))  # fmt: skip
    use_atomic_checkpoints(trainer)
    trainer.fit(module, data)
    path = Path(trainer.default_root_dir) / "x.ckpt"
    times = []
    for _ in range(3):
        start = time.perf_counter()
        trainer.save_checkpoint(path)
        times.append(time.perf_counter() - start)
    return path.stat().st_size / 1e6, C.median(times)


def main() -> None:
    parser = C.parser(__doc__.splitlines()[0])
    parser.add_argument("--scales", default="n,s")
    parser.add_argument("--image-size", type=int, default=160)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--train", type=int, default=64)
    parser.add_argument("--signal-after", type=int, default=5, help="batches trained before the signal")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    C.print_machine_info(args.threads)
    yaml = C.synthetic_yaml(C.default_workdir(), args.train, 16, args.image_size, num_classes=3)
    rows = []
    for scale in args.scales.split(","):
        size, seconds = checkpoint_cost(scale, yaml, args.image_size)
        for kind in KINDS:
            r = kill_run(args, scale, kind, yaml)
            rows.append([f"yolo11{scale}", kind, r["exit"], r["batches_done"], r["batches_lost"],
                         f"{r['seconds_to_exit']:.2f}", f"{size:.1f}", f"{seconds:.3f}"])  # fmt: skip
    caption = (f"{args.image_size} px, global batch {args.batch} (accumulation {max(round(64 / args.batch), 1)} "
               f"after warmup), signal after {args.signal_after} batches")  # fmt: skip
    headers = [
        "model",
        "signal",
        "exit",
        "batches done",
        "batches lost",
        "s to exit",
        "ckpt MB",
        "ckpt write s",
    ]
    C.print_table(caption, headers, rows)


if __name__ == "__main__":
    main()
