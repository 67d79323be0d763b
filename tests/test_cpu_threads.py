"""CPU runs give the training process the cores its DataLoader workers leave (``training.cpu_threads``)."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel

from yolo11_lightning.training import machine
from yolo11_lightning.training.cpu_threads import cgroup_cpu_limit, training_threads
from yolo11_lightning.training.machine import MachineSettings


def test_training_threads_leave_the_workers_their_cores() -> None:
    assert training_threads(cpus=2, local_processes=1, loader_workers=2) == 1  # never 0
    assert training_threads(cpus=16, local_processes=1, loader_workers=2) == 14
    assert training_threads(cpus=16, local_processes=2, loader_workers=2) == 6  # 8 per rank, minus its 2
    assert training_threads(cpus=1, local_processes=4, loader_workers=0) == 1


def test_cgroup_quota_v2_v1_and_unlimited(tmp_path: Path) -> None:
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("250000 100000\n")
    assert cgroup_cpu_limit(v2) == 2.5
    (v2 / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_limit(v2) is None
    v1 = tmp_path / "v1" / "cpu"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("300000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_limit(tmp_path / "v1") == 3.0
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpu_limit(tmp_path / "v1") is None
    assert cgroup_cpu_limit(tmp_path / "missing") is None


class WorkerData(BoringDataModule):
    num_workers = 3  # what MachineSettings reads; the boring loaders themselves run in-process


class ThreadProbe(L.Callback):
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.threads = torch.get_num_threads()


def _fit(tmp_path: Path, settings: MachineSettings) -> int:
    probe = ThreadProbe()
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=1, limit_val_batches=0, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[settings, probe],
        default_root_dir=str(tmp_path),
    )  # fmt: skip
    trainer.fit(BoringModel(), datamodule=WorkerData())
    return probe.threads


@pytest.mark.parametrize(
    ("setting", "during"),
    [("auto", 5), (2, 2), (None, 7)],  # auto: 8 usable cores - 3 workers; an int is taken as it is
)
def test_cpu_threads_during_the_run_and_restored_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: object, during: int
) -> None:
    before = torch.get_num_threads()
    monkeypatch.setattr(machine, "usable_cpus", lambda: 8)
    try:
        torch.set_num_threads(7)
        assert _fit(tmp_path, MachineSettings(cpu_threads=setting)) == during
        assert torch.get_num_threads() == 7  # a notebook keeps its own setting after the run
    finally:
        torch.set_num_threads(before)


def test_auto_never_raises_the_thread_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """1 thread chosen by the user (or OMP_NUM_THREADS, or Lightning's launcher) stays 1 on a big machine."""
    before = torch.get_num_threads()
    monkeypatch.setattr(machine, "usable_cpus", lambda: 64)
    try:
        torch.set_num_threads(1)
        assert _fit(tmp_path, MachineSettings()) == 1
    finally:
        torch.set_num_threads(before)


def test_bad_cpu_threads_is_refused() -> None:
    with pytest.raises(ValueError, match=r"machine\.cpu_threads must be 'auto', None or an int >= 1, got 0"):
        MachineSettings(cpu_threads=0)
