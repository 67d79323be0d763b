"""Cores per process and per local rank (``data.cpu_cores``), the loader workers ``num_workers: auto`` gives a
device (``data.loader_workers``), and the torch threads CPU runs give the training process beside its workers
(``training.cpu_threads``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel

from yolo11_lightning.data import cpu_cores
from yolo11_lightning.data.cpu_cores import cgroup_cpu_limit, cores_per_rank
from yolo11_lightning.data.loader_workers import auto_num_workers
from yolo11_lightning.training import datamodule
from yolo11_lightning.training.callbacks import machine
from yolo11_lightning.training.callbacks.machine import MachineSettings
from yolo11_lightning.training.cpu_threads import openmp_waits_briefly, training_threads
from yolo11_lightning.training.datamodule import YOLODataModule


def test_spinning_threads_leave_the_workers_their_cores() -> None:
    assert training_threads(cpus=2, local_processes=1, loader_workers=2, brief_waits=False) == 1  # never 0
    assert training_threads(cpus=16, local_processes=1, loader_workers=2, brief_waits=False) == 14
    assert training_threads(cpus=16, local_processes=2, loader_workers=2, brief_waits=False) == 6  # 8 - 2
    assert training_threads(cpus=1, local_processes=4, loader_workers=0, brief_waits=False) == 1


def test_briefly_waiting_threads_take_the_rank_share() -> None:
    assert training_threads(cpus=2, local_processes=1, loader_workers=2, brief_waits=True) == 2
    assert training_threads(cpus=16, local_processes=2, loader_workers=2, brief_waits=True) == 8
    assert training_threads(cpus=2, local_processes=4, loader_workers=1, brief_waits=True) == 1  # never 0


@pytest.mark.parametrize(
    ("environment", "spins"),
    [({}, "1000"), ({"OMP_WAIT_POLICY": "ACTIVE"}, None), ({"GOMP_SPINCOUNT": "20000"}, "20000")],
)
def test_the_command_sets_brief_waits_before_torch_loads(
    environment: dict[str, str], spins: str | None
) -> None:
    """``yolo11-lightning`` sets GOMP_SPINCOUNT before torch (and OpenMP with it) is imported, unless the user
    chose a wait policy; the commands' child processes (DDP ranks, loader workers) inherit it."""
    script = (
        "import os, sys; from yolo11_lightning.cli.main import main; main(['configs']); "
        "print('torch loaded' if 'torch' in sys.modules else 'torch not loaded', os.environ.get('GOMP_SPINCOUNT'))"
    )
    keep = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run(
        [sys.executable, "-c", script], env=keep | environment, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.strip().splitlines()[-1] == f"torch not loaded {spins}", out.stderr[-2000:]


@pytest.mark.parametrize(
    ("environment", "brief"),
    [
        ({"GOMP_SPINCOUNT": "1000"}, True), ({"GOMP_SPINCOUNT": "300000"}, False), ({}, False),
        ({"OMP_WAIT_POLICY": "passive"}, True), ({"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "0"}, False),
    ],
)  # fmt: skip
def test_brief_waits_read_from_the_environment(
    environment: dict[str, str], brief: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        monkeypatch.delenv(key, raising=False)
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    assert openmp_waits_briefly() is brief


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


def test_cores_per_rank_from_slurm_or_the_usable_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_cores, "usable_cpus", lambda: 96)
    assert cores_per_rank(8, {}) == (12, "96 usable core(s) / 8 local rank(s)")
    assert cores_per_rank(1, {}) == (96, "96 usable core(s) / 1 local rank(s)")
    # One SLURM task per rank: its cores are the rank's, whatever the node holds.
    assert cores_per_rank(8, {"SLURM_CPUS_PER_TASK": "10", "SLURM_CPUS_ON_NODE": "96"}) == (
        10, "SLURM_CPUS_PER_TASK=10"
    )  # fmt: skip
    assert cores_per_rank(8, {"SLURM_CPUS_ON_NODE": "64"}) == (8, "SLURM_CPUS_ON_NODE=64 / 8 local rank(s)")
    unreadable = {"SLURM_CPUS_PER_TASK": "", "SLURM_CPUS_ON_NODE": "x"}
    assert cores_per_rank(8, unreadable)[0] == 12
    # srun pinned this rank to 6 cores: no SLURM figure makes it more.
    monkeypatch.setattr(cpu_cores, "usable_cpus", lambda: 6)
    cores, how = cores_per_rank(1, {"SLURM_CPUS_PER_TASK": "12"})
    assert cores == 6 and how == "SLURM_CPUS_PER_TASK=12, capped at this process's 6 usable core(s)"
    assert cores_per_rank(8, {})[0] == 1  # never 0


@pytest.mark.parametrize(
    ("cores", "decode_once", "workers"),
    [
        (12, False, 11),  # one core left to the training process
        (12, True, 8),  # 11 does not divide 8: "recent" partners would be decoded again
        (7, True, 4), (4, True, 2), (2, True, 1),
        (64, False, 16), (64, True, 8),  # at most 16
        (1, False, 0), (1, True, 0),  # the training process loads its own batches
    ],
)  # fmt: skip
def test_auto_workers_leave_a_core_to_the_training_process(
    cores: int, decode_once: bool, workers: int
) -> None:
    assert auto_num_workers(cores, decode_once)[0] == workers


def test_auto_workers_text_says_how_they_were_derived() -> None:
    assert auto_num_workers(12, False)[1] == "12 core(s) per rank minus the training process"
    assert auto_num_workers(64, False)[1] == "64 core(s) per rank minus the training process, at most 16"
    assert auto_num_workers(12, True)[1].endswith(
        ", rounded down to a divisor of 8 ('recent' mosaic partners decoded once)"
    )


class WorkerData(BoringDataModule):
    num_workers = 3  # what MachineSettings reads; the boring loaders themselves run in-process


class ThreadProbe(L.Callback):
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.threads = torch.get_num_threads()


def _fit(
    tmp_path: Path,
    settings: MachineSettings,
    model: L.LightningModule | None = None,
    data: L.LightningDataModule | None = None,
) -> int:
    probe = ThreadProbe()
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=1, limit_val_batches=0, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[settings, probe],
        default_root_dir=str(tmp_path),
    )  # fmt: skip
    trainer.fit(model or BoringModel(), datamodule=data or WorkerData())
    return probe.threads


@pytest.mark.parametrize(
    ("setting", "during"),
    [("auto", 5), (2, 2), (None, 7)],  # auto: 8 usable cores - 3 workers; an int is taken as it is
)
def test_cpu_threads_during_the_run_and_restored_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: object, during: int
) -> None:
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # long spins: auto leaves the workers their cores
    before = torch.get_num_threads()
    monkeypatch.setattr(machine, "usable_cpus", lambda: 8)
    try:
        torch.set_num_threads(7)
        assert _fit(tmp_path, MachineSettings(cpu_threads=setting)) == during
        assert torch.get_num_threads() == 7  # a notebook keeps its own setting after the run
    finally:
        torch.set_num_threads(before)


def test_auto_with_brief_waits_takes_the_rank_share(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Brief OpenMP waits: the training process takes its whole share (4 cores), its 3 workers beside it."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setenv("GOMP_SPINCOUNT", "1000")
    monkeypatch.setattr(machine, "usable_cpus", lambda: 4)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(7)
        assert _fit(tmp_path, MachineSettings()) == 4
    finally:
        torch.set_num_threads(before)


def test_auto_never_raises_the_thread_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """1 thread chosen by the user (or OMP_NUM_THREADS, or Lightning's launcher) stays 1 on a big machine."""
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
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


class DictBatchModel(BoringModel):
    """BoringModel beside the DataModule's dict batches: trains its own layer on a constant input."""

    def training_step(self, batch: dict, batch_idx: int) -> dict:
        return super().training_step(torch.ones(2, 32), batch_idx)


def test_auto_workers_reach_the_loader_and_the_cpu_threads(
    tmp_path: Path, tiny_dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``num_workers: auto`` is resolved in the DataModule's setup, logged, given to the DataLoader, and counted by
    ``--machine.cpu_threads auto`` (which runs after it): 6 cores -> 5, rounded to 4 workers -> 2 threads."""
    for key in (
        "SLURM_CPUS_PER_TASK",
        "SLURM_CPUS_ON_NODE",
        "OMP_WAIT_POLICY",
        "GOMP_SPINCOUNT",
    ):  # long spins
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(cpu_cores, "usable_cpus", lambda: 6)
    monkeypatch.setattr(machine, "usable_cpus", lambda: 6)
    said: list[str] = []
    monkeypatch.setattr(datamodule, "rank_zero_info", said.append)
    data = YOLODataModule(
        dataset=str(tiny_dataset), batch_size=4, image_size=64, num_workers="auto", pin_memory=False
    )
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(7)
        assert _fit(tmp_path, MachineSettings(), DictBatchModel(), data) == 2
    finally:
        torch.set_num_threads(before)
    assert data.num_workers == 4 and data.hparams["num_workers"] == "auto"  # checkpoints keep "auto"
    assert data.trainer.train_dataloader.num_workers == 4
    assert said == [
        "num_workers auto: 4 per device (6 usable core(s) / 1 local rank(s); 6 core(s) per rank minus the "
        "training process, rounded down to a divisor of 8 ('recent' mosaic partners decoded once))"
    ]


def test_bad_num_workers_is_refused(tiny_dataset: Path) -> None:
    with pytest.raises(ValueError, match=r"num_workers must be 'auto' or an int >= 0, got 'many'"):
        YOLODataModule(dataset=str(tiny_dataset), num_workers="many")  # type: ignore[arg-type]
