"""A few training steps of each task named on the command line, on the emu device (``tests/helpers/emulated_gpu.py``).

``python emulated_task_steps.py OUT TASK...``: for each task, its synthetic set (16 train images of 64 px, batch 2,
mosaic on), ``YOLO11Module(task=TASK)`` with the defaults of a Python run (``default_callbacks()``: EMA, guard,
fused SGD, clipping) on one emu device for 7 optimiser steps without validation, and ``emulated_audit.StepAudit``
writing ``OUT/TASK/audit/rank0.json``. The loggers write every 1000 steps, so only the last step and the epoch's last
batch are log steps. Run by ``tests/e2e/test_gpu_path.py``, in one process for all tasks (the imports once).
"""

from __future__ import annotations

import sys
from pathlib import Path

import emulated_gpu as emu
import lightning as L
from emulated_audit import StepAudit
from lightning.pytorch.strategies import SingleDeviceStrategy

from yolo11_lightning import YOLO11Module, YOLODataModule
from yolo11_lightning.cli.lightning_cli import default_callbacks
from yolo11_lightning.synthetic.shapes import make_synthetic_dataset
from yolo11_lightning.training.datamodule import dataset_kpt_shape

STEPS = 7


def run(task: str, out: Path) -> None:
    dataset = make_synthetic_dataset(out / f"{task}_data", num_train=16, num_val=1, image_size=64, task=task)
    data = YOLODataModule(dataset=str(dataset), batch_size=2, image_size=64, num_workers=0, pin_memory=False,
                          close_mosaic=0)  # fmt: skip
    data.prepare_data()
    kpt_shape = dataset_kpt_shape(str(dataset), task)
    module = YOLO11Module(scale="n", task=task, num_classes=3, optimizer="SGD", warmup_epochs=0.0, nominal_batch=2,
                          log_images=0, kpt_shape=list(kpt_shape) if kpt_shape else None)  # fmt: skip
    trainer = L.Trainer(
        accelerator=emu.EmuAccelerator(), strategy=SingleDeviceStrategy(device="emu:0"), devices=1,
        max_steps=STEPS, limit_val_batches=0, num_sanity_val_steps=0, log_every_n_steps=1000, logger=False,
        default_root_dir=str(out / task), enable_progress_bar=False, enable_model_summary=False,
        callbacks=[*default_callbacks(checkpoints=False), StepAudit(str(out / task / "audit"))], enable_checkpointing=False,
    )  # fmt: skip
    trainer.fit(module, data)


if __name__ == "__main__":
    L.seed_everything(0)
    for name in sys.argv[2:]:
        run(name, Path(sys.argv[1]))
