"""The front door: LightningCLI fit on 1 process and on 2 gloo ranks, and config round trips."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

REPO = Path(__file__).resolve().parents[1]


def _cli(*args: str, cwd: Path, timeout: int = 400) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline"}
    proc = subprocess.run(
        [sys.executable, "-m", "yolo11_lightning", *args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    return proc


def _tiny_fit_args(dataset: Path, root: Path) -> list[str]:
    return [
        "fit", "--config", str(REPO / "configs" / "quickstart.yaml"),
        "--data.dataset", str(dataset), "--data.image_size", "64", "--data.batch_size", "4",
        "--data.num_workers", "0", "--trainer.accelerator", "cpu", "--trainer.max_epochs", "1",
        "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "2",
        "--trainer.default_root_dir", str(root), "--trainer.enable_progress_bar", "false",
    ]  # fmt: skip


def test_print_config_round_trip(tmp_path: Path) -> None:
    first = _cli("fit", "--config", str(REPO / "configs" / "quickstart.yaml"), "--model.scale", "s",
                 "--data.batch_size", "32", "--print_config", cwd=tmp_path)  # fmt: skip
    assert first.returncode == 0, first.stderr[-3000:]
    saved = tmp_path / "printed.yaml"
    saved.write_text(first.stdout)
    second = _cli("fit", "--config", str(saved), "--print_config", cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert yaml.safe_load(second.stdout) == yaml.safe_load(first.stdout)
    config = yaml.safe_load(first.stdout)
    assert config["model"]["scale"] == "s" and config["data"]["batch_size"] == 32
    assert config["data"]["dataset"] == "synthetic"


def test_fit_one_device_writes_checkpoints_and_one_logger_run(tiny_dataset: Path, tmp_path: Path) -> None:
    proc = _cli(*_tiny_fit_args(tiny_dataset, tmp_path / "run"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-5000:]
    versions = list((tmp_path / "run" / "lightning_logs").iterdir())
    assert [v.name for v in versions] == ["version_0"]
    run = versions[0]
    assert (run / "checkpoints" / "best.ckpt").is_file() and (run / "checkpoints" / "last.ckpt").is_file()
    assert (run / "config.yaml").is_file() and (run / "metrics.csv").is_file()
    assert "val/mAP50-95" in (run / "metrics.csv").read_text().splitlines()[0]
    assert list((run / "val_images").glob("epoch_*.png")), "validation images were not saved"
    # Batch 4, nominal 64: accumulation starts at 1 during warmup (reference ramp), so both batches step.
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert checkpoint["global_step"] == 2


def test_fit_two_ranks_ddp_rank_zero_writes_once(tiny_dataset: Path, tmp_path: Path) -> None:
    """2 gloo ranks: one W&B (offline) run, one config, best/last checkpoints, nothing twice."""
    pytest.importorskip("wandb")
    root = tmp_path / "run"
    args = [
        *_tiny_fit_args(tiny_dataset, root),
        "--trainer.devices", "2", "--trainer.strategy", "ddp",
        "--trainer.logger", "lightning.pytorch.loggers.WandbLogger",
        "--trainer.logger.save_dir", str(root), "--trainer.logger.offline", "true",
        "--trainer.logger.project", "yolo11-tests",
    ]  # fmt: skip
    proc = _cli(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-5000:]
    wandb_runs = list((root / "wandb").glob("offline-run-*"))
    assert len(wandb_runs) == 1, wandb_runs
    checkpoints = sorted(p.name for p in root.rglob("*.ckpt"))
    assert checkpoints == ["best.ckpt", "last.ckpt"], checkpoints
    assert len(list(root.rglob("config.yaml"))) == 1
