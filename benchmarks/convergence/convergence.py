"""Convergence: yolo11n from scratch, ours beside the oracle trainer, same data, same epochs, same evaluator.

Three modes.

``--mode easy`` (the earlier benchmark): the built-in synthetic shapes at 128 px, the quickstart recipe on
both sides (SGD lr0 0.01, 1 warmup epoch, mosaic off for the last 2 epochs), one run per side::

    python benchmarks/convergence/convergence.py --mode easy --epochs 20 --train 256 --val 32

``--mode hard`` (default): the harder set of ``yolo11_lightning.synthetic.hard`` (look-alike classes,
clutter, small and overlapping objects, non-square images). Each job is one (side, setting, horizon,
seed, variant) and runs in its own process; its result is saved as JSON under ``--workdir/results`` and
a job whose JSON exists is skipped, so the run is incremental and a partial run still gives figures::

    nice -n 10 python benchmarks/convergence/convergence.py --settings defaults sgd --horizons 15 --seeds 0 1 2
    python benchmarks/convergence/convergence.py --report            # table + curves PNG from the saved JSON

Settings: ``defaults`` is each side's defaults (ours: ``YOLO11Module``/``YOLODataModule`` defaults; the
oracle: its default configuration with only data, epochs, imgsz, batch and workers set); ``sgd`` is an
explicit recipe on both sides (SGD, lr0 0.01, momentum 0.937, weight decay 5e-4, 3 warmup epochs, the
other knobs at their shared defaults). Variants ``globalpool``, ``batchpool`` and ``recentpool`` (ours only)
set ``--data.mosaic_partners`` to ``dataset`` (the whole training set), ``batch`` (the sample's global batch)
or ``recent`` (that batch and 3 earlier ones, 8 apart). ``base`` is our default, which was ``batch`` in the
results of commits before 0a75faa, ``dataset`` from then, and ``recent`` since the session-5 runs (results
``convergence_hard_whole_set``: its ``base`` runs are ``dataset``, its ``recentpool`` runs the new default).
Variant ``shipped`` (both sides): the loader workers and torch threads each side picks by itself on this
machine, as a user gets them (ours: ``YOLODataModule``'s default workers, torch's default threads; the
oracle: its CPU overrides kept, 0 workers and ``cores - 1`` threads), for the whole-run wall time as shipped::

    python benchmarks/convergence/convergence.py --variants shipped --horizons 15 --seeds 0 1 --jobs 1 --nice 0

The final EMA weights of BOTH sides are scored by the same evaluator (ours: torchmetrics COCO mAP on the
val split, a fresh Trainer), so the comparison does not depend on two mAP implementations. The per-epoch
curves are each side's own validation of its EMA model (ours: our evaluator; the oracle: its own).
CPU time is user + system of the job's process tree (``os.wait4``), DataLoader workers included.

``--mode seg`` (issue 17): yolo11n-seg from scratch on the synthetic segmentation set
(``make_synthetic_dataset(task="segment")``: 3 classes, exact polygons), ours (``YOLO11Module(task="segment")``)
beside the oracle's ``SegmentationTrainer``, the explicit SGD recipe of ``SEG_RECIPE`` on both sides; the same
job runner, JSON and report as the hard mode, with box AND mask mAP50-95. The oracle's final EMA model is read
from its ``last.pt`` by our safe reader (``model_files.weights.load_model(path, task=None)``) and scored by our
evaluator, as ours is::

    nice -n 10 python benchmarks/convergence/convergence.py --mode seg --epochs 20 --seeds 0 1 --jobs 1
    python benchmarks/convergence/convergence.py --mode seg --report --png benchmarks/convergence/figures/convergence_seg.png
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers (_common, ...)

import _common as C
import _fit as F
import torch

from yolo11_lightning.model_files.weights import load_model

RECIPE = {"lr0": 0.01, "warmup_epochs": 1.0, "close_mosaic": 2}  # the easy mode's recipe
SGD_RECIPE = {"optimizer": "SGD", "lr0": 0.01, "momentum": 0.937, "weight_decay": 5e-4, "warmup_epochs": 3.0}
# Segmentation: the SGD recipe with mosaic and its switch-off said explicitly (data settings on our side).
SEG_RECIPE = {**SGD_RECIPE, "mosaic": 1.0, "close_mosaic": 5}
SEG_DATA_KEYS = ("mosaic", "close_mosaic")  # YOLODataModule's; the rest are YOLO11Module's
BATCH = 16
OURS_ONLY_VARIANTS = ("globalpool", "batchpool", "recentpool")  # mosaic partner modes of our DataModule


# ------------------------------------------------------------------------------------ scoring
def _validate_metrics(module: Any, yaml: str, image_size: int, workdir: Path) -> dict[str, float]:
    """Every validation figure of ``module`` (its task's: box, and for segment mask mAP) on the val split,
    by our evaluator, in a fresh Trainer."""
    import lightning as L

    from yolo11_lightning import YOLODataModule

    data = YOLODataModule(dataset=yaml, batch_size=BATCH, image_size=image_size, num_workers=0,
                          task=module.task.name)  # fmt: skip
    trainer = L.Trainer(accelerator="auto", devices=1, logger=False, enable_progress_bar=False,
                        default_root_dir=str(workdir), enable_model_summary=False)  # fmt: skip
    return {k: float(v) for k, v in trainer.validate(module, data, verbose=False)[0].items()}


def _validate(module: Any, yaml: str, image_size: int, workdir: Path) -> float:
    """Box mAP50-95 of ``module`` on the val split, by our evaluator, in a fresh Trainer."""
    return _validate_metrics(module, yaml, image_size, workdir)["val/mAP50-95"]


def _score(model_state: dict, yaml: str, image_size: int, workdir: Path) -> float:
    """mAP50-95 of a reference-format state dict, by our evaluator on the val split."""
    from yolo11_lightning import YOLO11Module, YOLODataModule

    data = YOLODataModule(dataset=yaml, batch_size=BATCH, image_size=image_size, num_workers=0)
    module = YOLO11Module(scale="n", num_classes=data.num_classes, class_names=data.class_names, log_images=0)
    module.model.load_state_dict(load_model(model_state).state_dict())
    return _validate(module, yaml, image_size, workdir)


# ------------------------------------------------------------------------------------ easy mode
def worker_easy_ours(args: argparse.Namespace) -> dict:
    import lightning as L

    from yolo11_lightning import YOLO11Module, YOLODataModule
    from yolo11_lightning.cli.lightning_cli import default_callbacks

    torch.set_num_threads(args.threads)
    L.seed_everything(0)
    data = YOLODataModule(
        dataset=args.yaml, batch_size=BATCH, image_size=args.image_size, num_workers=args.workers
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


def worker_easy_oracle(args: argparse.Namespace) -> dict:
    trainer = F.oracle_trainer(
        args.yaml, "n", args.image_size, BATCH, args.workers, args.threads, Path(args.workdir),
        epochs=args.epochs, val=True, optimizer="SGD", name="oracle_convergence", **RECIPE,
    )  # fmt: skip
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    own = float(trainer.metrics.get("metrics/mAP50-95(B)", float("nan")))
    same = _score(_oracle_ema_state(trainer), args.yaml, args.image_size, Path(args.workdir))
    return {"seconds_per_epoch": seconds / args.epochs, "own_map": own, "same_evaluator_map": same}


def main_easy(args: argparse.Namespace) -> None:
    yaml = C.synthetic_yaml(C.default_workdir(), args.train, args.val, args.image_size, num_classes=3)
    common = ["--mode", "easy", "--yaml", str(yaml), "--epochs", str(args.epochs),
              "--image-size", str(args.image_size), "--threads", str(args.threads),
              "--workers", str(args.workers), "--workdir", args.workdir]  # fmt: skip
    C.print_machine_info(args.threads)
    results = {side: C.run_worker(__file__, ["--side", side, *common], args.threads, timeout=3600)
               for side in ("ours", "oracle")}  # fmt: skip
    ours, oracle = results["ours"], results["oracle"]
    caption = (f"yolo11n from scratch, {args.epochs} epochs, {args.train} train / {args.val} val synthetic images, "
               f"{args.image_size} px, batch {BATCH}")  # fmt: skip
    rows = [
        ["mAP50-95, same evaluator (ours)", ours["same_evaluator_map"], oracle["same_evaluator_map"],
         C.ratio(ours["same_evaluator_map"], oracle["same_evaluator_map"])],
        ["mAP50-95, each side's own evaluator", ours["own_map"], oracle["own_map"], C.ratio(ours["own_map"], oracle["own_map"])],
        ["seconds per epoch (train + val)", ours["seconds_per_epoch"], oracle["seconds_per_epoch"],
         C.ratio(ours["seconds_per_epoch"], oracle["seconds_per_epoch"])],
    ]  # fmt: skip
    C.print_table(caption, ["figure", "ours", "oracle", "ours/oracle"], rows)


# ------------------------------------------------------------------------------------ hard mode: workers
def _oracle_ema_state(trainer: Any) -> dict:
    return {
        f"model.{k}" if not k.startswith("model.") else k: v for k, v in trainer.ema.ema.state_dict().items()
    }


def _hard_result(
    seconds: float, curve: list[float], same: float, optimizer: Any, mask_curve: list[float] | None = None,
    same_mask: float | None = None,
) -> dict:  # fmt: skip
    """What a hard- or seg-mode worker reports: time, per-epoch curve, final mAP by both evaluators,
    optimiser; in seg mode also the mask mAP50-95 curve and final figure."""
    result = {
        "seconds": seconds, "curve": curve, "own_map": curve[-1] if curve else float("nan"),
        "same_evaluator_map": same, "optimizer": type(optimizer).__name__,
        "optimizer_lr0": optimizer.param_groups[0].get("initial_lr", optimizer.defaults.get("lr")),
    }  # fmt: skip
    if mask_curve is not None:
        result.update(
            mask_curve=mask_curve, own_mask_map=mask_curve[-1] if mask_curve else float("nan"),
            same_evaluator_mask_map=same_mask,
        )  # fmt: skip
    return result


def _task(args: argparse.Namespace) -> str:
    return "segment" if args.mode == "seg" else "detect"


def _recipe(args: argparse.Namespace) -> dict[str, Any]:
    """The explicit recipe of a job (both sides), empty for each side's defaults."""
    if args.mode == "seg":
        return dict(SEG_RECIPE)
    return dict(SGD_RECIPE) if args.setting == "sgd" else {}


def worker_hard_ours(args: argparse.Namespace) -> dict:
    import lightning as L

    from yolo11_lightning import YOLO11Module, YOLODataModule
    from yolo11_lightning.cli.lightning_cli import default_callbacks

    shipped = args.variant == "shipped"
    if not shipped:
        torch.set_num_threads(args.threads)
    L.seed_everything(args.seed)

    task = _task(args)
    options = _recipe(args)
    data_options = {k: options.pop(k) for k in SEG_DATA_KEYS if k in options}
    partners = {"globalpool": "dataset", "batchpool": "batch", "recentpool": "recent"}.get(args.variant)
    if partners:
        data_options["mosaic_partners"] = partners
    loader = {} if shipped else {"num_workers": args.workers}  # shipped: the DataModule's default workers
    data = YOLODataModule(dataset=args.yaml, batch_size=BATCH, image_size=args.image_size, seed=args.seed, task=task,
                    **loader, **data_options)  # fmt: skip
    module = YOLO11Module(scale="n", num_classes=data.num_classes, class_names=data.class_names, log_images=0,
                          task=task, **options)  # fmt: skip
    curve: list[float] = []
    mask_curve: list[float] = []

    class Curve(L.Callback):
        def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            if not trainer.sanity_checking:
                metrics = trainer.callback_metrics
                curve.append(float(metrics.get("val/mAP50-95", float("nan"))))
                mask_curve.append(float(metrics.get("val/mask_mAP50-95", float("nan"))))

    workdir = Path(args.workdir) / "runs" / args.name
    trainer = L.Trainer(accelerator="auto", devices=1, max_epochs=args.epochs, enable_progress_bar=False,
                        callbacks=[*default_callbacks(), Curve()], default_root_dir=str(workdir),
                        num_sanity_val_steps=0, enable_model_summary=False)  # fmt: skip
    start = time.perf_counter()
    trainer.fit(module, data)
    seconds = time.perf_counter() - start
    optimizer = trainer.optimizers[0]
    same = _validate_metrics(
        module, args.yaml, args.image_size, workdir
    )  # the EMA weights (swapped in at fit end)
    if task == "detect":
        return _hard_result(seconds, curve, same["val/mAP50-95"], optimizer)
    return _hard_result(
        seconds, curve, same["val/mAP50-95"], optimizer, mask_curve, same["val/mask_mAP50-95"]
    )


def worker_hard_oracle(args: argparse.Namespace) -> dict:
    import torch as _torch
    import ultralytics.engine.trainer as oracle_engine
    from ultralytics.models.yolo.detect import DetectionTrainer
    from ultralytics.models.yolo.segment import SegmentationTrainer

    oracle_engine.check_amp = lambda *a, **k: True  # its AMP check downloads weights; CPU runs fp32 anyway
    task = _task(args)
    trainer_class = SegmentationTrainer if task == "segment" else DetectionTrainer
    workdir = Path(args.workdir) / "runs"
    overrides: dict[str, Any] = {
        "model": f"yolo11n{F.ORACLE_TRAINERS[task]}.yaml", "data": args.yaml, "epochs": args.epochs, "imgsz": args.image_size,
        "batch": BATCH, "workers": args.workers, "seed": args.seed,
        # where it writes and what it plots: no effect on training
        "project": str(workdir), "name": args.name, "exist_ok": True, "plots": False, "verbose": False,
        "device": "0" if _torch.cuda.is_available() else "cpu",
    }  # fmt: skip
    overrides.update(_recipe(args))
    trainer = trainer_class(overrides=overrides)
    if args.variant != "shipped":  # shipped: its CPU overrides stay (0 workers, cores - 1 threads)
        trainer.args.workers = args.workers  # it forces 0 workers on CPU: same loader workers as ours
        trainer.add_callback("on_pretrain_routine_end", lambda tr: _torch.set_num_threads(args.threads))
        trainer.add_callback("on_train_start", lambda tr: _torch.set_num_threads(args.threads))
    curve: list[float] = []
    mask_curve: list[float] = []

    def on_fit_epoch_end(tr: Any) -> None:
        curve.append(float(tr.metrics.get("metrics/mAP50-95(B)", float("nan"))))
        mask_curve.append(float(tr.metrics.get("metrics/mAP50-95(M)", float("nan"))))

    trainer.add_callback("on_fit_epoch_end", on_fit_epoch_end)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    optimizer = trainer.optimizer
    curve = curve[: args.epochs]  # its final validation of best.pt calls on_fit_epoch_end once more
    if task == "detect":
        same = _score(_oracle_ema_state(trainer), args.yaml, args.image_size, workdir / args.name)
        return _hard_result(seconds, curve, same, optimizer)
    scores = _score_file(trainer.last, args.yaml, args.image_size, workdir / args.name)
    return _hard_result(seconds, curve, scores["val/mAP50-95"], optimizer, mask_curve[: args.epochs],
                        scores["val/mask_mAP50-95"])  # fmt: skip


def _score_file(path: str | Path, yaml: str, image_size: int, workdir: Path) -> dict[str, float]:
    """Our evaluator's figures of the model in a file the oracle wrote (its ``last.pt``: the final EMA
    weights, optimiser stripped), read by our safe reader with the task taken from the file."""
    from yolo11_lightning import YOLO11Module
    from yolo11_lightning.model_files.weights import load_model

    model = load_model(path, task=None)
    module = YOLO11Module(scale=model.scale, num_classes=model.num_classes, task=model.task, log_images=0)
    module.model.load_state_dict(model.float().state_dict())
    return _validate_metrics(module, yaml, image_size, workdir)


# ------------------------------------------------------------------------------------ hard mode: driver
def hard_yaml(args: argparse.Namespace) -> Path:
    """The hard set (hard mode) or the synthetic segmentation set, 3 classes, square (seg mode)."""
    from yolo11_lightning.synthetic.hard import make_hard_synthetic_dataset

    if args.mode == "seg":
        return C.synthetic_yaml(C.default_workdir(), args.train, args.val, args.image_size, 3, task="segment")
    h, w = args.data_size
    root = C.default_workdir() / f"hard_{args.train}_{args.val}_{h}x{w}"
    return make_hard_synthetic_dataset(root, args.train, args.val, (h, w), seed=0)


def job_name(side: str, setting: str, epochs: int, seed: int, variant: str) -> str:
    return f"{side}_{setting}_e{epochs}_s{seed}" + (f"_{variant}" if variant != "base" else "")


def run_job(args: argparse.Namespace, yaml: Path, side: str, setting: str, epochs: int, seed: int,
            variant: str) -> dict | None:  # fmt: skip
    """One job in a fresh process (nice'd); its result with CPU time saved as JSON; None when it failed."""
    name = job_name(side, setting, epochs, seed, variant)
    results = Path(args.workdir) / "results"
    out = results / f"{name}.json"
    if out.exists():
        return json.loads(out.read_text())
    log = Path(args.workdir) / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = ["nice", "-n", str(args.nice), sys.executable, __file__, "--worker", "--mode", args.mode, "--side", side,
           "--setting", setting, "--epochs", str(epochs), "--seed", str(seed), "--variant", variant,
           "--name", name, "--yaml", str(yaml), "--image-size", str(args.image_size),
           "--threads", str(args.threads), "--workers", str(args.workers), "--workdir", args.workdir]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads),
           "PYTHONUNBUFFERED": "1", "PYTHONWARNINGS": "ignore"}  # fmt: skip
    if variant == "shipped":  # the threads each side picks by itself
        env = {k: v for k, v in env.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=C.REPO
    )
    print(f"[{time.strftime('%H:%M:%S')}] start {name}", flush=True)
    start = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=C.REPO)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    result = None
    for line in reversed(log.read_text(errors="replace").splitlines()):
        if line.startswith(C.RESULT_TAG):
            result = json.loads(line[len(C.RESULT_TAG) :])
            break
    if result is None:
        print(f"[{time.strftime('%H:%M:%S')}] FAILED {name} (exit {proc.returncode}), see {log}", flush=True)
        return None
    result.update(side=side, setting=setting, epochs=epochs, seed=seed, variant=variant, wall_s=wall,
                  cpu_s=usage.ru_utime + usage.ru_stime, image_size=args.image_size, data=str(yaml),
                  load_average=C.load_average(), commit=commit.stdout.strip(), finished=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))  # fmt: skip
    results.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    mask = (
        f", mask mAP50-95 {result['same_evaluator_mask_map']:.4f}"
        if "same_evaluator_mask_map" in result
        else ""
    )
    print(f"[{time.strftime('%H:%M:%S')}] done {name}: mAP50-95 {result['same_evaluator_map']:.4f}{mask}, "
          f"{wall:.0f} s wall, {result['cpu_s']:.0f} s CPU", flush=True)  # fmt: skip
    return result


def load_results(workdir: str | Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((Path(workdir) / "results").glob("*.json"))]


# (label, final figure by our evaluator, own final figure, per-epoch curve) of the runs' JSON
METRICS = (("mAP50-95", "same_evaluator_map", "own_map", "curve"),)
MASK_METRICS = (("mask mAP50-95", "same_evaluator_mask_map", "own_mask_map", "mask_curve"),)


def _metrics(runs: list[dict]) -> tuple[tuple[str, str, str, str], ...]:
    """Box mAP; and mask mAP too when the runs are segmentation runs."""
    return METRICS + (MASK_METRICS if runs and all("same_evaluator_mask_map" in r for r in runs) else ())


def report(workdir: str | Path, png: Path | None = None) -> str:
    """Markdown: per-run table, then mean / spread / ratio per (setting, horizon, variant) of every figure
    (box mAP, and mask mAP for segmentation runs); curves as PNG."""
    runs = load_results(workdir)
    metrics = _metrics(runs)
    lines = [
        f"Every run (final EMA model, {' and '.join(m[0] for m in metrics)} by our evaluator; own = the side's "
        "own last validation):",
        "",
    ]
    rows = [[r["side"], r["setting"], r["variant"], r["epochs"], r["seed"], r.get("optimizer", "-"),
             *(v for _, same, own, _ in metrics for v in (r[same], r[own])), r["wall_s"] / 60, r["cpu_s"] / 60,
             r.get("load_average", "-")]
            for r in sorted(runs, key=lambda r: (r["setting"], r["epochs"], r["variant"], r["side"], r["seed"]))]  # fmt: skip
    figure_headers = [h for label, *_ in metrics for h in (label, f"own {label}")]
    lines.append(C.format_table(["side", "setting", "variant", "epochs", "seed", "optimizer", *figure_headers,
                                 "wall min", "CPU min", "load"], rows))  # fmt: skip
    groups: dict[tuple, dict[str, list[dict]]] = {}
    for r in runs:
        label = r["side"] if r["variant"] == "base" else f"{r['side']}-{r['variant']}"
        groups.setdefault((r["setting"], r["epochs"]), {}).setdefault(label, []).append(r)

    def per_run(key: str, rows: list[dict]) -> float:
        return statistics.mean(r[key] / 60 for r in rows) if rows else float("nan")

    summary = []
    for name, same, _, _ in metrics:
        for (setting, epochs), by_side in sorted(groups.items()):
            for label, mine in sorted(by_side.items()):
                if label.startswith("oracle"):
                    continue
                # A variant of both sides (shipped) is compared with the oracle's same variant.
                variant = label.split("-", 1)[1] if "-" in label else ""
                theirs = by_side.get(f"oracle-{variant}", by_side.get("oracle", []))
                values, oracle = [r[same] for r in mine], [r[same] for r in theirs]
                m, om = statistics.mean(values), statistics.mean(oracle) if oracle else float("nan")
                sd = statistics.stdev(values) if len(values) > 1 else float("nan")
                osd = statistics.stdev(oracle) if len(oracle) > 1 else float("nan")
                cpu, ocpu = per_run("cpu_s", mine), per_run("cpu_s", theirs)
                wall, owall = per_run("wall_s", mine), per_run("wall_s", theirs)
                summary.append([name, setting, epochs, label, f"{len(values)} / {len(oracle)}", m, sd, om, osd,
                                C.ratio(m, om), cpu, ocpu, wall, owall, C.ratio(owall, wall)])  # fmt: skip
    lines += [
        "",
        "Mean and spread (sample standard deviation) over seeds, ours / oracle; lead = oracle / ours wall:",
        "",
    ]
    lines.append(C.format_table(["figure", "setting", "epochs", "ours", "seeds (ours / oracle)", "ours mean",
                                 "ours sd", "oracle mean", "oracle sd", "ratio", "ours CPU min/run",
                                 "oracle CPU min/run", "ours wall min/run", "oracle wall min/run",
                                 "wall lead"], summary))  # fmt: skip
    cpu = sum(r["cpu_s"] for r in runs) / 3600
    wall = sum(r["wall_s"] for r in runs) / 3600
    lines += [
        "",
        f"CPU time of these {len(runs)} runs: {cpu:.2f} core-hours ({wall:.2f} h wall, one at a time).",
    ]
    if png is not None and runs:
        plot_curves(runs, png)
        lines.append(f"Curves: {png}")
    return "\n".join(lines)


def plot_curves(runs: list[dict], png: Path) -> None:
    """One panel per (figure, setting, horizon): every run's per-epoch mAP50-95 (box; and mask for
    segmentation runs), ours blue, oracle red."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = _metrics(runs)
    keys = [
        (m, setting, epochs)
        for m in metrics
        for setting, epochs in sorted({(r["setting"], r["epochs"]) for r in runs})
    ]
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 4), squeeze=False)
    colours = {
        ("ours", "base"): "tab:blue",
        ("oracle", "base"): "tab:red",
        ("ours", "globalpool"): "tab:green",
    }
    for ax, ((name, _, _, curve_key), setting, epochs) in zip(axes[0], keys):
        seen = set()
        for r in runs:
            if (r["setting"], r["epochs"]) != (setting, epochs):
                continue
            key = (r["side"], r["variant"])
            label = r["side"] if r["variant"] == "base" else f"{r['side']} ({r['variant']})"
            ax.plot(range(1, len(r[curve_key]) + 1), r[curve_key], color=colours.get(key, "grey"), alpha=0.8,
                    label=None if key in seen else label)  # fmt: skip
            seen.add(key)
        ax.set_title(f"{name}: {setting}, {epochs} epochs")
        ax.set_xlabel("epoch")
        ax.set_ylabel(f"val {name} (own evaluator)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=90)


def main_hard(args: argparse.Namespace) -> None:
    png = Path(args.png) if args.png else Path(args.workdir) / "convergence_curves.png"
    if not args.report:
        yaml = hard_yaml(args)
        C.print_machine_info(args.threads)
        jobs = [(side, setting, epochs, seed, variant)
                for epochs in args.horizons for setting in args.settings for seed in args.seeds
                for side in args.sides for variant in args.variants
                if not (side == "oracle" and variant in OURS_ONLY_VARIANTS)]  # fmt: skip
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            list(pool.map(lambda job: run_job(args, yaml, *job), jobs))
    print(report(args.workdir, png))


def main() -> None:
    parser = C.parser(__doc__.splitlines()[0], worker=True, hidden=("--yaml",))
    parser.add_argument("--mode", choices=("easy", "hard", "seg"), default="hard")
    parser.add_argument("--epochs", type=int, default=20, help="easy mode (and a worker's horizon)")
    parser.add_argument(
        "--train", type=int, default=None, help="training images (easy 256, hard 400, seg 256)"
    )
    parser.add_argument("--val", type=int, default=None, help="validation images (easy 32, hard 100, seg 64)")
    parser.add_argument(
        "--image-size", type=int, default=None, help="training size (easy 128, hard 224, seg 160)"
    )
    parser.add_argument("--data-size", type=int, nargs=2, default=(168, 224), help="hard set image H W")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per run (easy 2, hard 1)")
    parser.add_argument("--workers", type=int, default=None, help="loader workers per run (easy 2, hard 1)")
    parser.add_argument("--settings", nargs="+", default=None, choices=("defaults", "sgd"),
                        help="hard mode (default: defaults); seg mode runs sgd (SEG_RECIPE) only")  # fmt: skip
    parser.add_argument("--horizons", type=int, nargs="+", default=None, help="hard 15; seg: --epochs")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--sides", nargs="+", default=["oracle", "ours"], choices=("ours", "oracle"))
    parser.add_argument(
        "--variants",
        nargs="+",
        default=["base"],
        choices=("base", "globalpool", "batchpool", "recentpool", "shipped"),
    )
    parser.add_argument("--jobs", type=int, default=2, help="runs at once")
    parser.add_argument("--nice", type=int, default=10)
    parser.add_argument("--report", action="store_true", help="only print the table / write the PNG")
    parser.add_argument("--png", default=None, help="curves PNG (default: WORKDIR/convergence_curves.png)")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--side", choices=("ours", "oracle"), help=argparse.SUPPRESS)
    parser.add_argument("--setting", default="defaults", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--variant", default="base", help=argparse.SUPPRESS)
    parser.add_argument("--name", default="run", help=argparse.SUPPRESS)
    args = parser.parse_args()
    easy = args.mode == "easy"
    mode = ("easy", "hard", "seg").index(args.mode)
    defaults = {
        "train": (256, 400, 256),
        "val": (32, 100, 64),
        "image_size": (128, 224, 160),
        "threads": (2, 1, 1),
        "workers": (2, 1, 1),
        "settings": (None, ["defaults"], ["sgd"]),
        "horizons": (None, [15], [args.epochs]),
    }
    for key, values in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, values[mode])
    if args.mode == "seg" and args.settings != ["sgd"]:
        parser.error("--mode seg runs the explicit SGD recipe only (--settings sgd)")
    if args.workdir is None:
        args.workdir = str(C.default_workdir() / ("convergence", "convergence_hard", "convergence_seg")[mode])
    ours, oracle = (worker_easy_ours, worker_easy_oracle) if easy else (worker_hard_ours, worker_hard_oracle)
    if C.run_as_worker(args, lambda a: (ours if a.side == "ours" else oracle)(a)):
        return
    main_easy(args) if easy else main_hard(args)


if __name__ == "__main__":
    main()
