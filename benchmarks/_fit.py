"""The measured training runs of both sides: our Trainer parts and the oracle's trainer on the same data
and settings, the per-batch time stamps, and ending the oracle's loop after the measured batches.

Imported as ``_fit`` by the scripts that time training (next to ``_common``, whose ``sync`` it uses).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Container, Sequence
from pathlib import Path
from typing import Any

from _common import sync

ORACLE_TRAINERS = {"detect": "", "segment": "-seg"}  # task -> the oracle's model yaml suffix


class StopTraining(Exception):
    """Raised from an oracle callback to end its training loop after the measured steps."""


def train_oracle_until(trainer: Any, done: Callable[[Any], bool]) -> None:
    """Run the oracle trainer's loop until ``done(trainer)``, called after every training batch, is True."""

    def on_batch_end(tr: Any) -> None:
        if done(tr):
            raise StopTraining

    trainer.add_callback("on_train_batch_end", on_batch_end)
    with contextlib.suppress(StopTraining):
        trainer.train()


def batch_end_stamps(synced: Container[int]) -> tuple[Any, list[float]]:
    """A Lightning callback and the list it fills: ``time.perf_counter()`` at the end of every training batch.

    Before the stamps whose index is in ``synced`` (the ends of the measured window, the indices
    ``steady_rate`` reads) the device's queued work is waited for, so the time between two synced stamps covers
    the device work of the batches between them. The other stamps are host times, which a GPU may trail. No
    sync after every batch: that drains the GPU's queue each step and understates its throughput. On a CPU
    ``sync`` does nothing and every stamp is exact.
    """
    import lightning as L

    stamps: list[float] = []

    class Stamps(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # type: ignore[no-untyped-def]
            if len(stamps) in synced:
                sync(pl_module.device)
            stamps.append(time.perf_counter())

    return Stamps(), stamps


# ------------------------------------------------------------------------------------ training runs
def our_fit_parts(
    yaml: str | Path,
    scale: str,
    image_size: int,
    batch: int,
    workers: int,
    max_steps: int,
    workdir: str | Path,
    callbacks: Sequence[Any] = (),
    module_options: dict[str, Any] | None = None,
    trainer_options: dict[str, Any] | None = None,
    without: tuple[type, ...] = (),
    task: str = "detect",
) -> tuple[Any, Any, Any]:
    """(Trainer, YOLO11Module, YOLODataModule) for a measured ``fit`` with the project's defaults.

    ``task``: ``detect`` or ``segment`` (the data module and the module both get it; ``yaml`` must be a set
    of that task).

    The CLI's default callbacks (checkpointing, LR monitor), a CSV logger and the progress bar stay on:
    the loop measured is the one users run. Benchmarks turn off what the oracle run turns off too:
    validation, close-mosaic (so mosaic stays on) and warmup (the oracle ramps its accumulation during
    warmup, which would give it a different number of optimiser steps). ``without``: default callback
    classes to leave out (to measure what one of them costs).
    """
    import lightning as L
    from lightning.pytorch.loggers import CSVLogger

    from yolo11_lightning import YOLO11Module, YOLODataModule
    from yolo11_lightning.cli.lightning_cli import default_callbacks
    from yolo11_lightning.training.callbacks.machine import MachineSettings

    data = YOLODataModule(
        dataset=str(yaml),
        batch_size=batch,
        image_size=image_size,
        num_workers=workers,
        seed=0,
        close_mosaic=0,
        task=task,
    )
    options = {"warmup_epochs": 0.0, "log_images": 0, "task": task, **(module_options or {})}
    machine = MachineSettings(compile=bool(options.pop("compile", False)))  # a Trainer-side setting
    module = YOLO11Module(scale=scale, num_classes=data.num_classes, class_names=data.class_names, **options)
    defaults = [c for c in default_callbacks() if not isinstance(c, (*without, MachineSettings))]
    trainer = L.Trainer(
        **{
            "accelerator": "auto",
            "devices": 1,
            "max_steps": max_steps,
            "limit_val_batches": 0,
            "num_sanity_val_steps": 0,
            "logger": CSVLogger(str(workdir), name="ours"),
            "callbacks": [*defaults, machine, *callbacks],
            "default_root_dir": str(workdir),
            "enable_model_summary": False,
            **(trainer_options or {}),
        }
    )
    return trainer, module, data


def oracle_trainer(
    yaml: str | Path,
    scale: str,
    image_size: int,
    batch: int,
    workers: int,
    threads: int,
    workdir: str | Path,
    task: str = "detect",
    **overrides: Any,
) -> Any:
    """The oracle's trainer on the same data and settings as ``our_fit_parts``: its ``DetectionTrainer``, or
    for ``task="segment"`` its ``SegmentationTrainer`` with the ``-seg`` model yaml.

    Plots, the AMP check (a download), validation, saving and warmup are off; determinism off (ours is not
    forced either).
    On CPU the oracle forces 0 workers and ``cores - 1`` threads; both are set back to the values asked for,
    so the two sides compare at equal resources.
    """
    import torch as _torch
    import ultralytics.engine.trainer as oracle_engine
    from ultralytics.models.yolo.detect import DetectionTrainer
    from ultralytics.models.yolo.segment import SegmentationTrainer

    if task not in ORACLE_TRAINERS:
        raise ValueError(f"task must be one of {tuple(ORACLE_TRAINERS)}, got {task!r}")
    trainer_class, suffix = (
        {"detect": DetectionTrainer, "segment": SegmentationTrainer}[task],
        ORACLE_TRAINERS[task],
    )
    # Its AMP check loads yolo11n.pt (a download): skip it, AMP is what we ask for.
    oracle_engine.check_amp = lambda *args, **kwargs: True

    args = {
        "model": f"yolo11{scale}{suffix}.yaml", "data": str(yaml), "imgsz": image_size, "batch": batch,
        "epochs": 1, "workers": workers, "device": "0" if _torch.cuda.is_available() else "cpu",
        "amp": False, "plots": False, "val": False, "save": False, "deterministic": False,
        "close_mosaic": 0, "warmup_epochs": 0, "project": str(workdir), "name": "oracle",
        "exist_ok": True, "verbose": False, "seed": 0, **overrides,
    }  # fmt: skip
    trainer = trainer_class(overrides=args)
    trainer.args.workers = workers  # undo the CPU override: same loader workers as ours
    trainer.add_callback("on_pretrain_routine_end", lambda tr: _torch.set_num_threads(threads))
    trainer.add_callback("on_train_start", lambda tr: _torch.set_num_threads(threads))
    return trainer


def oracle_trainer_for(args: Any) -> Any:
    """``oracle_trainer`` from a worker's parsed options (``yaml``, ``scale``, ``image_size``, ``batch``,
    ``workers``, ``threads``, ``workdir``, ``task``), as the speed benchmarks' workers get them."""
    return oracle_trainer(
        args.yaml,
        args.scale,
        args.image_size,
        args.batch,
        args.workers,
        args.threads,
        args.workdir,
        args.task,
    )


def children_cpu_seconds() -> float:
    """CPU seconds (user + system) used so far by this process's live children (DataLoader workers)."""
    try:
        import psutil
    except ImportError:
        return float("nan")
    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
            total += times.user + times.system
        except psutil.Error:  # exited meanwhile
            pass
    return total
