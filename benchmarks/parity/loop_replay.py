"""Our training loop on the oracle's own batches, from the oracle's own initial weights: does it train the same?

    nice -n 10 python benchmarks/parity/loop_replay.py --task obb --seeds 2 --epochs 30

The oracle's trainer (its defaults; the convergence benchmark's set, batch 16) runs first and records its initial
weights, every training batch exactly as its loader made it (images after augmentation, labels) and the weights,
raw and EMA, at a few iterations. Our ``YOLO11Module``, with the project's default callbacks (the reference
recipe: warmup, accumulation ramp, EMA, clipping), then trains from those initial weights on those batches in the
same order, and records the same snapshots. Everything that can differ is the loop: LR and momentum schedule,
accumulation windows, loss scale, clipping, optimiser, EMA, BatchNorm statistics, the loss and the model.

Training from scratch is chaotic: float rounding alone makes two runs drift apart. A second run of ours starts from
the initial weights with 1e-6 of each tensor's mean magnitude added as noise: its drift from the first run of ours
is the yardstick. Reported per snapshot: ||a - b|| / ||b|| over all float parameters and buffers, for ours against
the oracle and for the perturbed run against ours; and the final EMA models of all three scored by our evaluator
(mAP50-95 on the val split, conf 0.01). One worker process per run; the recorded files stay in ``--workdir``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers (_common, ...)

import _common as C
import torch

BATCH = 16
IMAGE_SIZE = 128
SNAPSHOTS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # iterations (batches) after which weights are compared
CLASS_NAMES = ["rectangle", "ellipse", "triangle"]


def _flat(module: torch.nn.Module) -> torch.Tensor:
    """Every float parameter and buffer of ``module`` as one float32 vector (state_dict order)."""
    return torch.cat(
        [v.detach().float().flatten() for v in module.state_dict().values() if v.is_floating_point()]
    )


def _dataset(task: str, train: int, val: int) -> Path:
    from yolo11_lightning.synthetic.shapes import make_synthetic_dataset

    root = C.default_workdir() / f"{task}_{train}_{val}_{IMAGE_SIZE}"
    return make_synthetic_dataset(root, train, val, IMAGE_SIZE, num_classes=len(CLASS_NAMES), task=task)


def _score(state: dict[str, torch.Tensor], task: str, yaml: str, workdir: Path) -> float:
    """mAP50-95 by our evaluator of a model state (our keys) on the val split."""
    import lightning as L

    from yolo11_lightning import YOLO11Module, YOLODataModule

    module = YOLO11Module(
        scale="n", num_classes=len(CLASS_NAMES), task=task, log_images=0, conf_threshold=0.01
    )
    module.model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    data = YOLODataModule(dataset=yaml, batch_size=BATCH, image_size=IMAGE_SIZE, num_workers=0, task=task)
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        default_root_dir=str(workdir), enable_model_summary=False)  # fmt: skip
    return float(trainer.validate(module, data, verbose=False)[0]["val/mAP50-95"])


# ------------------------------------------------------------------------------------ the oracle records
def worker_oracle(args: Any) -> dict:
    import ultralytics.engine.trainer as oracle_engine
    from ultralytics.models.yolo.detect import DetectionTrainer
    from ultralytics.models.yolo.obb import OBBTrainer

    from yolo11_lightning.model_files.reference import rename_key

    torch.set_num_threads(int(args.threads))
    oracle_engine.check_amp = lambda *a, **k: True  # its AMP check downloads weights; CPU runs fp32 anyway
    trainer_class, model_yaml = (
        (OBBTrainer, "yolo11n-obb.yaml") if args.task == "obb" else (DetectionTrainer, "yolo11n.yaml")
    )
    run_dir = Path(args.out).parent
    trainer = trainer_class(overrides={
        "model": model_yaml, "data": args.yaml, "epochs": int(args.epochs), "imgsz": IMAGE_SIZE, "batch": BATCH,
        "workers": 0, "seed": int(args.seed), "project": str(run_dir), "name": "oracle_run", "exist_ok": True,
        "plots": False, "verbose": False, "device": "cpu", "val": False,
    })  # fmt: skip
    record: dict[str, Any] = {"batches": [], "raw": {}, "ema": {}}
    preprocess = trainer.preprocess_batch

    def recording_preprocess(batch: dict) -> dict:
        record["batches"].append({k: batch[k].clone() for k in ("img", "cls", "bboxes", "batch_idx")})
        return preprocess(batch)

    def on_train_start(tr: Any) -> None:
        torch.set_num_threads(int(args.threads))
        record["init"] = {rename_key(k): v.clone() for k, v in tr.model.state_dict().items()}

    def on_train_batch_end(tr: Any) -> None:
        done = len(record["batches"])
        if done in SNAPSHOTS:
            record["raw"][done], record["ema"][done] = _flat(tr.model), _flat(tr.ema.ema)

    trainer.preprocess_batch = recording_preprocess
    trainer.add_callback("on_train_start", on_train_start)
    trainer.add_callback("on_train_batch_end", on_train_batch_end)
    trainer.train()
    final = {rename_key(k): v.float() for k, v in trainer.ema.ema.state_dict().items()}
    record["raw"]["end"], record["ema"]["end"] = _flat(trainer.model), _flat(trainer.ema.ema)
    record["final"] = final
    torch.save(record, args.out)
    return {"map": _score(final, args.task, args.yaml, run_dir), "iterations": len(record["batches"])}


# ------------------------------------------------------------------------------------ ours replays
def _our_batch(batch: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The oracle's collated batch in our ``DetectionBatch`` layout (targets (N, 6), or (N, 7) with the angle)."""
    images = batch["img"].contiguous(memory_format=torch.channels_last)
    size = images.shape[0]
    index = batch["batch_idx"]
    targets = torch.cat(
        [index.float()[:, None], batch["cls"].view(-1, 1).float(), batch["bboxes"].float()], 1
    )
    return {
        "images": images, "orig_sizes": torch.full((size, 2), IMAGE_SIZE), "scales": torch.full((size,), float("nan")),
        "pads": torch.full((size, 2), float("nan")), "paths": [f"replay_{i}.png" for i in range(size)],
        "targets": targets, "targets_per_image": torch.bincount(index.long(), minlength=size).tolist(),
        "indices": torch.arange(size), "substitutes": torch.full((size,), -1), "substituted": 0, "unreadable": [],
        "missing": 0,
    }  # fmt: skip


def worker_ours(args: Any) -> dict:
    import lightning as L
    from torch.utils.data import DataLoader

    from yolo11_lightning import YOLO11Module
    from yolo11_lightning.cli.lightning_cli import default_callbacks
    from yolo11_lightning.training.callbacks.ema import ModelEMA

    torch.set_num_threads(int(args.threads))
    record = torch.load(args.recorded, weights_only=False)
    batches = [_our_batch(b) for b in record.pop("batches")]
    per_epoch = len(batches) // int(args.epochs)

    class Replay(L.LightningDataModule):
        """The oracle's batches, one epoch's worth per epoch (reloaded every epoch)."""

        batch_size = BATCH
        num_train_samples = per_epoch * BATCH  # what optimizer "auto" reads: the oracle's dataset size

        def train_dataloader(self) -> DataLoader:
            epoch = self.trainer.current_epoch
            return DataLoader(batches[epoch * per_epoch : (epoch + 1) * per_epoch], batch_size=None)

    module = YOLO11Module(
        scale="n", num_classes=len(CLASS_NAMES), class_names=CLASS_NAMES, log_images=0, task=args.task
    )
    init = record["init"]
    eps = float(args.perturb)
    if eps:
        generator = torch.Generator().manual_seed(0)
        init = {k: v + eps * v.abs().mean() * torch.randn(v.shape, generator=generator)
                if v.is_floating_point() and v.numel() > 1 else v for k, v in init.items()}  # fmt: skip
    module.model.load_state_dict(init)
    raw: dict[Any, torch.Tensor] = {}
    ema: dict[Any, torch.Tensor] = {}

    class Snapshots(L.Callback):
        """Raw weights after each snapshot batch; the EMA at the next batch's start (its callback runs after this)."""

        def __init__(self) -> None:
            self.done = 0

        def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any) -> None:
            if self.done in SNAPSHOTS:
                average = next(c for c in trainer.callbacks if isinstance(c, ModelEMA))._average_model
                ema[self.done] = _flat(average.module.model)

        def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any) -> None:
            self.done += 1
            if self.done in SNAPSHOTS:
                raw[self.done] = _flat(pl_module.model)

    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=int(args.epochs), enable_progress_bar=False,
                        callbacks=[Snapshots(), *default_callbacks(checkpoints=False)], logger=False,
                        enable_checkpointing=False, num_sanity_val_steps=0, limit_val_batches=0,
                        reload_dataloaders_every_n_epochs=1, enable_model_summary=False,
                        default_root_dir=str(Path(args.out).parent))  # fmt: skip
    trainer.fit(module, Replay())
    ema["end"] = _flat(module.model)  # WeightAveraging put the EMA into the module at the end of fit
    torch.save({"raw": raw, "ema": ema}, args.out)
    return {"map": _score(module.model.state_dict(), args.task, args.yaml, Path(args.out).parent)}


# ------------------------------------------------------------------------------------ report
def _drift(a: dict, b: dict, key: Any) -> str:
    return f"{float((a[key] - b[key]).norm() / b[key].norm()):.2e}" if key in a and key in b else "-"


def main() -> None:
    ap = C.parser(
        __doc__, worker=("ours", "oracle"), hidden=("--yaml", "--seed", "--out", "--recorded", "--perturb")
    )
    ap.add_argument("--task", choices=("detect", "obb"), default="obb")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--train", type=int, default=256)
    ap.add_argument("--val", type=int, default=32)
    ap.add_argument("--seeds", type=int, nargs="+", default=[2])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--workdir", default=str(C.default_workdir() / "loop_replay"))
    args = ap.parse_args()
    if C.run_as_worker(args, {"ours": worker_ours, "oracle": worker_oracle}):
        return
    yaml = _dataset(args.task, args.train, args.val)
    C.print_machine_info(args.threads)
    for seed in args.seeds:
        folder = Path(args.workdir) / f"{args.task}_e{args.epochs}_t{args.train}_s{seed}"
        folder.mkdir(parents=True, exist_ok=True)
        common = ["--yaml", str(yaml), "--seed", str(seed), "--task", args.task, "--epochs", str(args.epochs),
                  "--threads", str(args.threads)]  # fmt: skip
        recorded = folder / "oracle.pt"
        oracle = C.run_worker(
            __file__, ["oracle", *common, "--out", str(recorded)], args.threads, timeout=6 * 3600
        )
        runs = {}
        for eps in ("0", "1e-6"):
            out = folder / f"ours_{eps}.pt"
            runs[eps] = C.run_worker(__file__, ["ours", *common, "--out", str(out), "--recorded", str(recorded),
                                                "--perturb", eps], args.threads, timeout=6 * 3600)  # fmt: skip
        theirs = torch.load(recorded, weights_only=False)
        ours = torch.load(folder / "ours_0.pt", weights_only=False)
        nudged = torch.load(folder / "ours_1e-6.pt", weights_only=False)
        rows = [[it, _drift(ours["raw"], theirs["raw"], it), _drift(ours["ema"], theirs["ema"], it),
                 _drift(nudged["raw"], ours["raw"], it), _drift(nudged["ema"], ours["ema"], it)]
                for it in (*(i for i in SNAPSHOTS if i <= oracle["iterations"]), "end")]  # fmt: skip
        C.print_table(
            f"yolo11n-{args.task} seed {seed}, {oracle['iterations']} iterations: relative weight distance",
            ["iteration", "ours vs oracle (raw)", "ours vs oracle (EMA)", "ours+1e-6 vs ours (raw)",
             "ours+1e-6 vs ours (EMA)"], rows,
        )  # fmt: skip
        C.print_table(
            f"final EMA mAP50-95 (our evaluator), seed {seed}",
            ["oracle", "ours (its batches, its init)", "ours, init + 1e-6 noise"],
            [[round(oracle["map"], 4), round(runs["0"]["map"], 4), round(runs["1e-6"]["map"], 4)]],
        )


if __name__ == "__main__":
    main()
