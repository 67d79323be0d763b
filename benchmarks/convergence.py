"""Convergence: yolo11n from scratch on the synthetic set, ours beside the oracle trainer, same epochs.

    python benchmarks/convergence.py                     # 20 epochs, 256 train / 32 val at 128 px, ~5 min
    python benchmarks/convergence.py --epochs 30 --train 512

Both sides use the quickstart recipe (SGD lr0 0.01, 1 warmup epoch, mosaic off for the last 2 epochs,
batch 16, EMA) and validate every epoch. The final EMA weights of BOTH runs are then scored by the same
evaluator (ours: torchmetrics COCO mAP), so the comparison does not depend on two mAP implementations;
the oracle's own mAP50-95 is printed beside it. Wall time per epoch includes validation on both sides.
Each side runs in its own process, with the same thread count and DataLoader workers.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import _common as C
import torch

RECIPE = {"lr0": 0.01, "warmup_epochs": 1.0, "close_mosaic": 2}


def _score(model_state: dict, yaml: str, image_size: int, workdir: Path) -> float:
    """mAP50-95 of a reference-format or our state dict, by our evaluator on the val split."""
    import lightning as L

    from yolo11_lightning import YOLO11, YOLO11Module, YOLODataModule

    data = YOLODataModule(dataset=yaml, batch_size=16, image_size=image_size, num_workers=0)
    module = YOLO11Module(scale="n", num_classes=data.num_classes, class_names=data.class_names, log_images=0)
    module.model.load_state_dict(YOLO11.from_ultralytics(model_state).state_dict())
    trainer = L.Trainer(accelerator="auto", devices=1, logger=False, enable_progress_bar=False,
                        default_root_dir=str(workdir))  # fmt: skip
    return float(trainer.validate(module, data, verbose=False)[0]["val/mAP50-95"])


def worker_ours(args: argparse.Namespace) -> dict:
    import lightning as L

    from yolo11_lightning import YOLO11Module, YOLODataModule
    from yolo11_lightning.training.cli import default_callbacks

    torch.set_num_threads(args.threads)
    L.seed_everything(0)
    data = YOLODataModule(
        dataset=args.yaml, batch_size=16, image_size=args.image_size, num_workers=args.workers
    )
    module = YOLO11Module(scale="n", num_classes=data.num_classes, class_names=data.class_names, log_images=0,
                          **RECIPE)  # fmt: skip
    trainer = L.Trainer(accelerator="auto", devices=1, max_epochs=args.epochs, enable_progress_bar=False,
                        callbacks=default_callbacks(), default_root_dir=str(Path(args.workdir) / "ours"))  # fmt: skip
    start = time.perf_counter()
    trainer.fit(module, data)
    seconds = time.perf_counter() - start
    own = float(trainer.callback_metrics["val/mAP50-95"])
    return {"seconds_per_epoch": seconds / args.epochs, "own_map": own, "same_evaluator_map": own}


def worker_oracle(args: argparse.Namespace) -> dict:
    trainer = C.oracle_trainer(
        args.yaml, "n", args.image_size, 16, args.workers, args.threads, Path(args.workdir),
        epochs=args.epochs, val=True, optimizer="SGD", name="oracle_convergence", **RECIPE,
    )  # fmt: skip
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    own = float(trainer.metrics.get("metrics/mAP50-95(B)", float("nan")))
    ema_state = {
        f"model.{k}" if not k.startswith("model.") else k: v for k, v in trainer.ema.ema.state_dict().items()
    }
    same = _score(ema_state, args.yaml, args.image_size, Path(args.workdir))
    return {"seconds_per_epoch": seconds / args.epochs, "own_map": own, "same_evaluator_map": same}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--train", type=int, default=256)
    parser.add_argument("--val", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--side", choices=("ours", "oracle"), help=argparse.SUPPRESS)
    parser.add_argument("--yaml", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", default=str(C.default_workdir() / "convergence"))
    args = parser.parse_args()
    if args.worker:
        C.emit(worker_ours(args) if args.side == "ours" else worker_oracle(args))
        return

    yaml = C.synthetic_yaml(C.default_workdir(), args.train, args.val, args.image_size, num_classes=3)
    common = ["--yaml", str(yaml), "--epochs", str(args.epochs), "--image-size", str(args.image_size),
              "--threads", str(args.threads), "--workers", str(args.workers), "--workdir", args.workdir]  # fmt: skip
    print(C.machine_info(args.threads))
    results = {side: C.run_worker(__file__, ["--side", side, *common], args.threads, timeout=3600)
               for side in ("ours", "oracle")}  # fmt: skip
    ours, oracle = results["ours"], results["oracle"]
    print(f"\nyolo11n from scratch, {args.epochs} epochs, {args.train} train / {args.val} val synthetic images, "
          f"{args.image_size} px, batch 16\n")  # fmt: skip
    rows = [
        ["mAP50-95, same evaluator (ours)", ours["same_evaluator_map"], oracle["same_evaluator_map"],
         C.ratio(ours["same_evaluator_map"], oracle["same_evaluator_map"])],
        ["mAP50-95, each side's own evaluator", ours["own_map"], oracle["own_map"], C.ratio(ours["own_map"], oracle["own_map"])],
        ["seconds per epoch (train + val)", ours["seconds_per_epoch"], oracle["seconds_per_epoch"],
         C.ratio(ours["seconds_per_epoch"], oracle["seconds_per_epoch"])],
    ]  # fmt: skip
    print(C.format_table(["figure", "ours", "oracle", "ours/oracle"], rows))


if __name__ == "__main__":
    main()
