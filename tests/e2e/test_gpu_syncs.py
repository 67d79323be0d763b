"""CUDA only: no host sync in a steady training step, on one GPU and under DDP (NCCL, one rank).

``torch.cuda.set_sync_debug_mode("error")`` turns every synchronising call (``.item()``, a blocking copy, a
data-dependent shape) into an error for the steps audited here, with the real defaults of a CLI run (its
callbacks, the EMA, the loss, the fused optimiser, clipping); detection in every precision, pose, oriented boxes
and classification in bf16. The loggers write every 1000 steps, so no step audited here is a log step (those
read the loss items once, by design). Skipped without CUDA; the lent-GPU run (``benchmarks/device/gpu.py``) runs this
file. ``tests/e2e/test_gpu_path.py`` checks the same on the CPU's emu device.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

WARMUP, AUDITED = 3, 6


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sync_errors_after_warmup():  # type: ignore[no-untyped-def]
    import lightning as L

    class SyncErrors(L.Callback):
        """Sync debug mode "error" from the start of step WARMUP to the end of step WARMUP + AUDITED."""

        def __init__(self) -> None:
            self.audited = 0

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # type: ignore[no-untyped-def]
            if WARMUP <= trainer.global_step < WARMUP + AUDITED:
                torch.cuda.set_sync_debug_mode("error")

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # type: ignore[no-untyped-def]
            if trainer.global_step > WARMUP:
                self.audited += 1
            if trainer.global_step >= WARMUP + AUDITED:
                torch.cuda.set_sync_debug_mode("default")

        def teardown(self, trainer, pl_module, stage) -> None:  # type: ignore[no-untyped-def]
            torch.cuda.set_sync_debug_mode("default")

    return SyncErrors()


def _fit(tmp_path: Path, precision: str, strategy: str, task: str = "detect") -> int:
    import lightning as L

    from yolo11_lightning import YOLO11Module, YOLODataModule
    from yolo11_lightning.cli.lightning_cli import default_callbacks
    from yolo11_lightning.synthetic.shapes import make_synthetic_dataset
    from yolo11_lightning.training.datamodule import dataset_kpt_shape

    dataset = make_synthetic_dataset(tmp_path / "data", num_train=96, num_val=8, image_size=96, task=task)
    data = YOLODataModule(dataset=str(dataset), batch_size=8, image_size=96, num_workers=2, close_mosaic=0)
    kpt_shape = dataset_kpt_shape(str(dataset), task)
    module = YOLO11Module(scale="n", num_classes=data.num_classes, class_names=data.class_names, task=task,
                          optimizer="SGD", warmup_epochs=0.0, nominal_batch=8,
                          kpt_shape=list(kpt_shape) if kpt_shape else None)  # fmt: skip
    audit = _sync_errors_after_warmup()
    trainer = L.Trainer(
        accelerator="gpu", devices=1, strategy=strategy, precision=precision,
        max_steps=WARMUP + AUDITED + 2, limit_val_batches=0, num_sanity_val_steps=0, log_every_n_steps=1000,
        default_root_dir=str(tmp_path), enable_progress_bar=True, callbacks=[*default_callbacks(), audit],
    )  # fmt: skip
    trainer.fit(module, data)
    return audit.audited


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed", "32-true"])
def test_single_gpu_step_makes_no_host_sync(tmp_path: Path, precision: str) -> None:
    assert _fit(tmp_path, precision, "auto") >= AUDITED


@pytest.mark.parametrize("task", ["pose", "obb", "classify"])
def test_single_gpu_task_step_makes_no_host_sync(tmp_path: Path, task: str) -> None:
    """The other tasks' batches, heads and losses (the OBB loss leaves tiny boxes out without a boolean mask)."""
    assert _fit(tmp_path, "bf16-mixed", "auto", task) >= AUDITED


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_ddp_step_makes_no_host_sync(tmp_path: Path, precision: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    try:
        assert _fit(tmp_path, precision, "ddp") >= AUDITED
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        os.environ.pop("LOCAL_RANK", None)
