"""Pose convergence: yolo11n-pose from scratch, ours beside the oracle's ``PoseTrainer``, on the synthetic pose set
(``synthetic.poses``: figures of 5 keypoints, some occluded or unlabelled, ``flip_idx``), each side's
defaults (only data, epochs, image size, batch, loader workers and seed set), equal epochs, several seeds::

    nice -n 10 python benchmarks/convergence/convergence_pose.py --epochs 10 --train 256 --val 64 --image-size 128 --seeds 0 1 2
    python benchmarks/convergence/convergence_pose.py --report

Each job (side, seed) runs in its own process and saves its JSON under ``--workdir/pose_results``; a job whose
JSON exists is skipped. The final EMA weights of BOTH sides are scored by the same evaluator (ours: box mAP50-95 by
torchmetrics COCO and keypoint mAP50-95 by OKS, ``tasks.pose.metric.PoseMAP``; a fresh Trainer on the val split):
the oracle's from its ``last.pt``, read by our safe reader. No side validates during training (``--per-epoch-val``
turns each side's own per-epoch validation back on): training images/s is training images x epochs over the wall
time of the training loop alone (the oracle's CPU validation of an untrained model, 0.001 confidence, takes most of
its epoch time).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers (_common, ...)

import _common as C
import torch

BATCH = 16


def _validate(module: Any, yaml: str, image_size: int, workdir: Path) -> dict[str, float]:
    import lightning as L

    from yolo11_lightning import YOLODataModule

    data = YOLODataModule(dataset=yaml, batch_size=BATCH, image_size=image_size, num_workers=0, task="pose")
    trainer = L.Trainer(accelerator="auto", devices=1, logger=False, enable_progress_bar=False,
                        default_root_dir=str(workdir), enable_model_summary=False)  # fmt: skip
    return {k: float(v) for k, v in trainer.validate(module, data, verbose=False)[0].items()}


def worker_ours(args: argparse.Namespace) -> dict:
    import lightning as L

    from yolo11_lightning import YOLO11Module, YOLODataModule
    from yolo11_lightning.cli.lightning_cli import default_callbacks

    torch.set_num_threads(args.threads)
    L.seed_everything(args.seed)
    data = YOLODataModule(dataset=args.yaml, batch_size=BATCH, image_size=args.image_size, seed=args.seed,
                          task="pose", num_workers=args.workers)  # fmt: skip
    module = YOLO11Module(scale="n", num_classes=data.num_classes, class_names=data.class_names, log_images=0,
                          task="pose", kpt_shape=[5, 3])  # fmt: skip
    workdir = Path(args.workdir) / "runs" / args.name
    validation = {} if args.per_epoch_val else {"limit_val_batches": 0}
    trainer = L.Trainer(accelerator="auto", devices=1, max_epochs=args.epochs, enable_progress_bar=False,
                        callbacks=default_callbacks(), default_root_dir=str(workdir), num_sanity_val_steps=0,
                        enable_model_summary=False, **validation)  # fmt: skip
    start = time.perf_counter()
    trainer.fit(module, data)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, **_validate(module, args.yaml, args.image_size, workdir)}


def worker_oracle(args: argparse.Namespace) -> dict:
    import ultralytics.engine.trainer as oracle_engine
    from ultralytics.models.yolo.pose import PoseTrainer

    from yolo11_lightning import YOLO11Module
    from yolo11_lightning.model_files.weights import load_model

    oracle_engine.check_amp = lambda *a, **k: True  # its AMP check downloads weights; CPU runs fp32 anyway
    workdir = Path(args.workdir) / "runs"
    overrides = {
        "model": "yolo11n-pose.yaml", "data": args.yaml, "epochs": args.epochs, "imgsz": args.image_size,
        "batch": BATCH, "workers": args.workers, "seed": args.seed, "project": str(workdir), "name": args.name,
        "exist_ok": True, "plots": False, "verbose": False, "device": "0" if torch.cuda.is_available() else "cpu",
        "val": bool(args.per_epoch_val),
    }  # fmt: skip
    trainer = PoseTrainer(overrides=overrides)
    trainer.args.workers = args.workers  # it forces 0 workers on CPU: the same loader workers as ours
    trainer.add_callback("on_pretrain_routine_end", lambda tr: torch.set_num_threads(args.threads))
    trainer.add_callback("on_train_start", lambda tr: torch.set_num_threads(args.threads))
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    model = load_model(trainer.last, task=None)
    module = YOLO11Module(scale=model.scale, num_classes=model.num_classes, task="pose",
                          kpt_shape=list(model.kpt_shape), log_images=0)  # fmt: skip
    module.model.load_state_dict(model.float().state_dict())
    return {"seconds": seconds, **_validate(module, args.yaml, args.image_size, workdir / args.name)}


def _yaml(args: argparse.Namespace) -> Path:
    from yolo11_lightning.synthetic.poses import make_synthetic_pose_dataset

    folder = Path(args.workdir) / f"pose_{args.train}_{args.val}_{args.image_size}"
    return make_synthetic_pose_dataset(folder, args.train, args.val, args.image_size)


def report(workdir: Path, train: int | None = None) -> str:
    runs = [json.loads(p.read_text()) for p in sorted((workdir / "pose_results").glob("*.json"))]
    rows = []
    for r in runs:
        images_per_s = r["train"] * r["epochs"] / r["seconds"]
        rows.append([r["side"], r["seed"], r["epochs"], f"{r['val/mAP50-95']:.4f}", f"{r['val/pose_mAP50-95']:.4f}",
                     f"{images_per_s:.1f}", f"{r['seconds']:.0f}"])  # fmt: skip
    out = C.format_table(
        ["side", "seed", "epochs", "box mAP50-95", "pose mAP50-95", "train img/s", "s"], rows
    )
    for metric in ("val/mAP50-95", "val/pose_mAP50-95"):
        means = {
            side: statistics.mean(r[metric] for r in runs if r["side"] == side)
            for side in ("ours", "oracle")
            if any(r["side"] == side for r in runs)
        }
        if len(means) == 2 and means["oracle"] > 0:
            out += f"\n{metric}: ours {means['ours']:.4f} / oracle {means['oracle']:.4f} = {means['ours'] / means['oracle']:.3f}x"
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--train", type=int, default=256)
    p.add_argument("--val", type=int, default=64)
    p.add_argument("--image-size", type=int, default=128)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--sides", nargs="+", default=["ours", "oracle"])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--workdir", type=Path, default=C.default_workdir())
    p.add_argument("--report", action="store_true")
    p.add_argument("--per-epoch-val", type=int, default=0, help="1: each side validates after every epoch")
    p.add_argument("--worker", choices=["ours", "oracle"], help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--name", default="", help=argparse.SUPPRESS)
    p.add_argument("--yaml", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        result = (worker_ours if args.worker == "ours" else worker_oracle)(args)
        print("RESULT " + json.dumps(result))
        return
    if args.report:
        print(report(args.workdir))
        return
    yaml = _yaml(args)
    results = args.workdir / "pose_results"
    results.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        for side in args.sides:
            name = f"pose_{side}_e{args.epochs}_n{args.train}_s{args.image_size}_seed{seed}"
            path = results / f"{name}.json"
            if path.exists():
                continue
            command = [sys.executable, __file__, "--worker", side, "--seed", str(seed), "--name", name,
                       "--yaml", str(yaml), "--epochs", str(args.epochs), "--image-size", str(args.image_size),
                       "--workers", str(args.workers), "--threads", str(args.threads),
                       "--per-epoch-val", str(args.per_epoch_val),
                       "--workdir", str(args.workdir)]  # fmt: skip
            proc = subprocess.run(command, capture_output=True, text=True)
            line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
            if proc.returncode or not line:
                print(f"{name} failed:\n{proc.stderr[-3000:]}")
                continue
            result = {"side": side, "seed": seed, "epochs": args.epochs, "train": args.train,
                      **json.loads(line[-1][7:])}  # fmt: skip
            path.write_text(json.dumps(result))
            print(name, {k: result[k] for k in ("seconds", "val/mAP50-95", "val/pose_mAP50-95")}, flush=True)
    print(report(args.workdir))


if __name__ == "__main__":
    main()
