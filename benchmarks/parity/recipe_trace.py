"""The optimiser recipe over the first iterations, traced batch by batch on both sides and compared.

    python benchmarks/parity/recipe_trace.py                      # 500 iterations, 64 px, three settings
    python benchmarks/parity/recipe_trace.py --iterations 200 --settings auto-adamw

For every training batch both sides log: each parameter group's LR, momentum (SGD) or betas (Adam),
weight decay; whether an optimiser step happened after the batch (the accumulation); the EMA decay used
by the last EMA update; and at each optimiser step the total gradient norm before clipping. The oracle is
hooked through its callbacks and a wrapper of its ``optimizer_step``; ours through a Lightning callback
(``on_train_batch_end`` for the groups, ``on_before_optimizer_step`` for the gradient norm).

Settings (same data, same batch 16, small hard set so 500 iterations span several epochs):
  auto-adamw  each side's defaults with a short run (``auto`` picks AdamW on both)
  auto-sgd    defaults with a huge ``max_epochs`` so ``auto`` picks SGD (> 10k nominal iterations)
  sgd         explicit SGD lr0 0.01, momentum 0.937, 3 warmup epochs
The report lists, per quantity, the first iteration where the sides differ and the largest difference.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers (_common, ...)

import _common as C
import _fit as F
import torch

SETTINGS: dict[str, tuple[int, dict[str, Any]]] = {  # name -> (epochs, recipe overrides)
    "auto-adamw": (50, {}),
    "auto-sgd": (4000, {}),
    "sgd": (50, {"optimizer": "SGD", "lr0": 0.01, "momentum": 0.937, "warmup_epochs": 3.0}),
}


def _groups(optimizer: torch.optim.Optimizer) -> list[dict[str, float]]:
    out = []
    for g in optimizer.param_groups:
        row = {"lr": float(g["lr"]), "weight_decay": float(g["weight_decay"])}
        if "momentum" in g:
            row["momentum"] = float(g["momentum"])
        if "betas" in g:
            row["beta1"], row["beta2"] = float(g["betas"][0]), float(g["betas"][1])
        out.append(row)
    return out


def _grad_norm(parameters) -> float:
    grads = [p.grad.detach().flatten() for p in parameters if p.grad is not None]
    return float(torch.cat(grads).norm()) if grads else float("nan")


def trace_ours(args: argparse.Namespace, epochs: int, recipe: dict[str, Any]) -> list[dict]:
    import lightning as L

    from yolo11_lightning import YOLO11Module, YOLODataModule
    from yolo11_lightning.training.callbacks.ema import ModelEMA, ramped_decay

    torch.set_num_threads(args.threads)
    L.seed_everything(0)
    data = YOLODataModule(
        dataset=args.yaml, batch_size=16, image_size=args.image_size, num_workers=args.workers
    )
    module = YOLO11Module(scale="n", num_classes=data.num_classes, class_names=data.class_names, log_images=0,
                          **recipe)  # fmt: skip
    rows: list[dict] = []
    pending: dict[str, float] = {}

    class Trace(L.Callback):
        def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
            pending["grad_norm"] = _grad_norm(pl_module.parameters())

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            ema = next(c for c in trainer.callbacks if isinstance(c, ModelEMA))
            # this callback may run before the EMA's own on_train_batch_end: count its pending update
            updates = (ema._updates or 0) + int(trainer.global_step > ema._latest_update_step)
            rows.append({
                "iteration": len(rows), "epoch": trainer.current_epoch, "steps": trainer.global_step,
                "groups": _groups(trainer.optimizers[0]), "ema_updates": updates,
                "ema_decay": ramped_decay(updates, ema.decay, ema.tau) if updates else 0.0,
                "grad_norm": pending.pop("grad_norm", None),
                "optimizer": type(trainer.optimizers[0]).__name__,
            })  # fmt: skip
            if len(rows) >= args.iterations:
                trainer.should_stop = True

    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=epochs, limit_val_batches=0,
                        num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[Trace()],
                        default_root_dir=str(Path(args.workdir) / "ours"))  # fmt: skip
    trainer.fit(module, data)
    return rows[: args.iterations]


def trace_oracle(args: argparse.Namespace, epochs: int, recipe: dict[str, Any]) -> list[dict]:
    import torch as _torch
    import ultralytics.engine.trainer as oracle_engine
    from ultralytics.models.yolo.detect import DetectionTrainer

    oracle_engine.check_amp = lambda *a, **k: True
    overrides = {"model": "yolo11n.yaml", "data": args.yaml, "epochs": epochs, "imgsz": args.image_size,
                 "batch": 16, "workers": args.workers, "device": "cpu", "val": False, "save": False,
                 "plots": False, "verbose": False, "project": str(Path(args.workdir)), "name": "oracle",
                 "exist_ok": True, "seed": 0, **recipe}  # fmt: skip
    trainer = DetectionTrainer(overrides=overrides)
    trainer.args.workers = args.workers
    trainer.add_callback("on_train_start", lambda tr: _torch.set_num_threads(args.threads))
    rows: list[dict] = []
    pending: dict[str, float] = {}
    original_step = trainer.optimizer_step

    def optimizer_step() -> None:
        pending["grad_norm"] = _grad_norm(trainer.model.parameters())
        original_step()

    trainer.optimizer_step = optimizer_step

    def record(tr: Any) -> bool:
        updates = tr.ema.updates
        rows.append({
            "iteration": len(rows), "epoch": tr.epoch, "steps": updates, "groups": _groups(tr.optimizer),
            "ema_updates": updates, "ema_decay": tr.ema.decay(updates) if updates else 0.0,
            "grad_norm": pending.pop("grad_norm", None), "accumulate": tr.accumulate,
            "optimizer": type(tr.optimizer).__name__,
        })  # fmt: skip
        return len(rows) >= args.iterations

    F.train_oracle_until(trainer, record)
    return rows[: args.iterations]


def compare(ours: list[dict], oracle: list[dict]) -> list[list[Any]]:
    """Rows (quantity, first differing iteration, ours there, oracle there, max |difference|).

    Gradient norms depend on the random init and data order, so they are compared as medians per
    window of 100 iterations (ours / oracle) instead.
    """

    def flat(row: dict) -> dict[str, float]:
        out = {
            "optimizer steps so far": row["steps"],
            "EMA updates": row["ema_updates"],
            "EMA decay": row["ema_decay"],
        }
        for g, group in enumerate(row["groups"]):
            for k, v in group.items():
                out[f"group {g} {k}"] = v
        return out

    keys: list[str] = []
    for r in (ours[0], oracle[0]):
        keys += [k for k in flat(r) if k not in keys]
    table = []
    for key in keys:
        first, worst, at = None, 0.0, None
        for i, (a, b) in enumerate(zip(ours, oracle)):
            fa, fb = flat(a).get(key), flat(b).get(key)
            diff = math.inf if fa is None or fb is None else abs(fa - fb)
            if diff > 1e-9 and first is None:
                first, at = i, (fa, fb)
            worst = max(worst, diff)
        table.append([key, "-" if first is None else first, "-" if at is None else at[0],
                      "-" if at is None else at[1], worst])  # fmt: skip
    n = min(len(ours), len(oracle))
    for start in range(0, n, 100):
        norms = [[r["grad_norm"] for r in side[start : start + 100] if r["grad_norm"] is not None]
                 for side in (ours, oracle)]  # fmt: skip
        if all(norms):
            a, b = statistics.median(norms[0]), statistics.median(norms[1])
            table.append([f"median grad norm (pre-clip), it. {start}-{start + 99}", "-", a, b, a / b])
    return table


def worker(args: argparse.Namespace) -> dict:
    """One side's trace of one setting (a worker process)."""
    epochs, recipe = SETTINGS[args.setting]
    fn = trace_ours if args.side == "ours" else trace_oracle
    return {"rows": fn(args, epochs, recipe)}


def main() -> None:
    parser = C.parser(__doc__.splitlines()[0], worker=True, hidden=("--side", "--setting", "--yaml"))
    parser.add_argument("--iterations", type=int, default=500)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--train", type=int, default=160)
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--workdir", default=str(C.default_workdir() / "recipe_trace"))
    args = parser.parse_args()
    if C.run_as_worker(args, worker):
        return
    from yolo11_lightning.synthetic.hard import make_hard_synthetic_dataset

    yaml = make_hard_synthetic_dataset(
        C.default_workdir() / f"hard_{args.train}_16_48x64", args.train, 16, (48, 64)
    )
    out = Path(args.workdir)
    out.mkdir(parents=True, exist_ok=True)
    for setting in args.settings:
        traces = {}
        for side in ("ours", "oracle"):
            path = out / f"{setting}_{side}.json"
            if not path.exists():
                common = ["--side", side, "--setting", setting, "--yaml", str(yaml), "--iterations",
                          str(args.iterations), "--image-size", str(args.image_size), "--threads",
                          str(args.threads), "--workers", str(args.workers), "--workdir", str(out / setting)]  # fmt: skip
                path.write_text(
                    json.dumps(C.run_worker(__file__, common, args.threads, timeout=1800)["rows"])
                )
            traces[side] = json.loads(path.read_text())
        ours, oracle = traces["ours"], traces["oracle"]
        print(f"\n{setting}: ours {ours[0]['optimizer']}, oracle {oracle[0]['optimizer']}, "
              f"{min(len(ours), len(oracle))} iterations")  # fmt: skip
        print(C.format_table(["quantity", "first differing iteration", "ours there", "oracle there",
                              "max abs diff (grad: ratio)"], compare(ours, oracle)))  # fmt: skip


if __name__ == "__main__":
    main()
