"""Convergence of YOLO11n-obb from scratch: ours beside the oracle's OBBTrainer, same data, same epochs, same evaluator.

The synthetic OBB set (``make_synthetic_dataset(task="obb")``: rotated elongated shapes, 3 classes, labelled with
their oriented boxes' corners). Each side trains with its own defaults (ours: ``YOLO11Module(task="obb")`` and
``YOLODataModule`` defaults; the oracle: ``OBBTrainer`` with only model, data, epochs, imgsz, batch, workers and
seed set), one process per (side, seed). The final EMA weights of BOTH sides are scored by our evaluator
(``tasks.obb.metric.ObbMAP``, the reference OBB validator's rules, at conf 0.01 as its default) on the val
split, so the comparison does not depend on two mAP implementations; each side's own last validation is
reported too. Training images/s: training images seen / wall time of the fit (validation included on both sides).
Results are saved as JSON under ``--workdir/results``; a job whose JSON exists is skipped::

    nice -n 10 python benchmarks/convergence/convergence_obb.py --epochs 30 --train 256 --val 32 --image-size 128 --seeds 0 1 2

``--mosaic-partners dataset --sides ours`` reruns our side with mosaic partners drawn from the whole set (the
oracle's rule) instead of our default pool, into its own results folder. ``--init oracle --sides ours`` starts
our side from the oracle's initial weights for the same seed (its trainer is built and stopped before its first
batch), so that a seed's two runs differ only in data pipeline and loop: the outcome here depends on the initial
weights as much as on anything else, and this pairs the seeds.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers (_common, ...)

import _common as C
import torch

BATCH = 16
CONF = 0.01  # the reference OBB validator's default score threshold, used by our evaluator for both sides


def _score(module: Any, yaml: str, image_size: int, workdir: Path) -> float:
    """mAP50-95 of ``module`` on the val split by our evaluator, in a fresh Trainer."""
    import lightning as L

    from yolo11_lightning import YOLODataModule

    module.hparams.conf_threshold = CONF
    data = YOLODataModule(dataset=yaml, batch_size=BATCH, image_size=image_size, num_workers=0, task="obb")
    trainer = L.Trainer(accelerator="auto", devices=1, logger=False, enable_progress_bar=False,
                        default_root_dir=str(workdir), enable_model_summary=False)  # fmt: skip
    return float(trainer.validate(module, data, verbose=False)[0]["val/mAP50-95"])


def _oracle_initial_weights(args: Any) -> dict[str, torch.Tensor]:
    """The oracle trainer's initial weights for ``args.seed`` (under our keys), taken at its train start."""
    import ultralytics.engine.trainer as oracle_engine
    from ultralytics.models.yolo.obb import OBBTrainer

    from yolo11_lightning.model_files.reference import rename_key

    class Started(Exception):
        pass

    def take(tr: Any) -> None:
        weights.update({rename_key(k): v.clone() for k, v in tr.model.state_dict().items()})
        raise Started

    weights: dict[str, torch.Tensor] = {}
    oracle_engine.check_amp = lambda *a, **k: True
    trainer = OBBTrainer(overrides={
        "model": "yolo11n-obb.yaml", "data": args.yaml, "epochs": int(args.epochs), "imgsz": int(args.image_size),
        "batch": BATCH, "workers": 0, "seed": int(args.seed), "project": str(Path(args.workdir) / "runs"),
        "name": f"oracle_init_s{args.seed}", "exist_ok": True, "plots": False, "verbose": False, "device": "cpu",
    })  # fmt: skip
    trainer.add_callback("on_train_start", take)
    with contextlib.suppress(Started):
        trainer.train()
    return weights


def worker_ours(args: Any) -> dict:
    import lightning as L

    from yolo11_lightning import YOLO11Module, YOLODataModule
    from yolo11_lightning.cli.lightning_cli import default_callbacks

    # Before our seeding: the oracle's trainer seeds the global generators too.
    initial = _oracle_initial_weights(args) if args.init == "oracle" else None
    torch.set_num_threads(int(args.threads))
    L.seed_everything(int(args.seed))
    partners = {"mosaic_partners": args.mosaic_partners} if args.mosaic_partners else {}
    data = YOLODataModule(dataset=args.yaml, batch_size=BATCH, image_size=int(args.image_size), seed=int(args.seed),
                          num_workers=int(args.workers), task="obb", **partners)  # fmt: skip
    module = YOLO11Module(scale="n", num_classes=3, class_names=["rectangle", "ellipse", "triangle"], log_images=0,
                          task="obb")  # fmt: skip
    if initial is not None:
        module.model.load_state_dict(initial)
    workdir = Path(args.workdir) / "runs" / f"ours_s{args.seed}"
    trainer = L.Trainer(accelerator="auto", devices=1, max_epochs=int(args.epochs), enable_progress_bar=False,
                        callbacks=default_callbacks(), default_root_dir=str(workdir), num_sanity_val_steps=0,
                        enable_model_summary=False)  # fmt: skip
    start = time.perf_counter()
    trainer.fit(module, data)
    seconds = time.perf_counter() - start
    own = float(trainer.callback_metrics.get("val/mAP50-95", float("nan")))
    return {"seconds": seconds, "images": int(args.epochs) * int(args.train), "own_map": own,
            "same_evaluator_map": _score(module, args.yaml, int(args.image_size), workdir)}  # fmt: skip


def worker_oracle(args: Any) -> dict:
    import ultralytics.engine.trainer as oracle_engine
    from ultralytics.models.yolo.obb import OBBTrainer

    from yolo11_lightning import YOLO11Module
    from yolo11_lightning.model_files.weights import load_model

    oracle_engine.check_amp = lambda *a, **k: True  # its AMP check downloads weights; CPU runs fp32 anyway
    workdir = Path(args.workdir) / "runs"
    trainer = OBBTrainer(overrides={
        "model": "yolo11n-obb.yaml", "data": args.yaml, "epochs": int(args.epochs), "imgsz": int(args.image_size),
        "batch": BATCH, "workers": int(args.workers), "seed": int(args.seed), "project": str(workdir),
        "name": f"oracle_s{args.seed}", "exist_ok": True, "plots": False, "verbose": False, "device": "cpu",
    })  # fmt: skip
    trainer.args.workers = int(args.workers)  # it forces 0 workers on CPU: the same loader workers as ours
    trainer.add_callback("on_train_start", lambda tr: torch.set_num_threads(int(args.threads)))
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    own = float(trainer.metrics.get("metrics/mAP50-95(B)", float("nan")))
    model = load_model(trainer.last, task=None)  # its final EMA weights, read by our safe reader
    module = YOLO11Module(scale="n", num_classes=model.num_classes, task=model.task, log_images=0)
    module.model.load_state_dict(model.float().state_dict())
    same = _score(module, args.yaml, int(args.image_size), workdir / f"oracle_s{args.seed}")
    return {"seconds": seconds, "images": int(args.epochs) * int(args.train), "own_map": own,
            "same_evaluator_map": same}  # fmt: skip


def main() -> None:
    ap = C.parser(__doc__, worker=("ours", "oracle"), hidden=("--yaml", "--seed"))
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--train", type=int, default=128)
    ap.add_argument("--val", type=int, default=32)
    ap.add_argument("--image-size", type=int, default=128)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--workdir", default=str(C.default_workdir() / "convergence_obb"))
    ap.add_argument("--mosaic-partners", default="", help="ours only: --data.mosaic_partners (default: ours)")
    ap.add_argument("--init", default="ours", choices=("ours", "oracle"), help="ours only: initial weights")
    ap.add_argument("--sides", nargs="+", default=["ours", "oracle"], choices=("ours", "oracle"))
    args = ap.parse_args()
    if C.run_as_worker(args, {"ours": worker_ours, "oracle": worker_oracle}):
        return
    from yolo11_lightning.synthetic.shapes import make_synthetic_dataset

    root = C.default_workdir() / f"obb_{args.train}_{args.val}_{args.image_size}"
    yaml = make_synthetic_dataset(root, args.train, args.val, args.image_size, num_classes=3, task="obb")
    variant = f"_{args.mosaic_partners}" if args.mosaic_partners else ""
    variant += "_oracle_init" if args.init == "oracle" else ""
    results_dir = Path(args.workdir) / f"results_e{args.epochs}_t{args.train}_s{args.image_size}{variant}"
    results_dir.mkdir(parents=True, exist_ok=True)
    C.print_machine_info(args.threads)
    rows: list[list[Any]] = []
    figures: dict[str, list[dict]] = {side: [] for side in args.sides}
    for seed in args.seeds:
        for side in args.sides:
            out = results_dir / f"{side}_s{seed}.json"
            if not out.exists():
                common = ["--yaml", str(yaml), "--seed", str(seed), "--epochs", str(args.epochs), "--train",
                          str(args.train), "--image-size", str(args.image_size), "--threads", str(args.threads),
                          "--workers", str(args.workers), "--workdir", args.workdir,
                          "--mosaic-partners", args.mosaic_partners, "--init", args.init]  # fmt: skip
                result = C.run_worker(__file__, [side, *common], args.threads, timeout=6 * 3600)
                out.write_text(json.dumps(result))
            result = json.loads(out.read_text())
            figures[side].append(result)
            rows.append([side, seed, result["same_evaluator_map"], result["own_map"],
                         result["images"] / result["seconds"]])  # fmt: skip
    for side in args.sides:
        done = figures[side]
        rows.append([side, "mean", statistics.mean(r["same_evaluator_map"] for r in done),
                     statistics.mean(r["own_map"] for r in done),
                     statistics.mean(r["images"] / r["seconds"] for r in done)])  # fmt: skip
    caption = (f"yolo11n-obb from scratch, each side's defaults, {args.epochs} epochs, {args.train} train / {args.val} "
               f"val synthetic OBB images at {args.image_size} px, batch {BATCH}; final EMA scored by our OBB mAP")  # fmt: skip
    C.print_table(
        caption, ["side", "seed", "mAP50-95 (same evaluator)", "mAP50-95 (own)", "train images/s"], rows
    )
    if set(args.sides) == {"ours", "oracle"}:
        ours = statistics.mean(r["same_evaluator_map"] for r in figures["ours"])
        oracle = statistics.mean(r["same_evaluator_map"] for r in figures["oracle"])
        print(f"\nours / oracle mean mAP50-95 (same evaluator): {C.ratio(ours, oracle)} (target >= 0.95)")


if __name__ == "__main__":
    main()
