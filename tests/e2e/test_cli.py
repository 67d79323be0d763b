"""The front door: LightningCLI fit on 1 process and on 2 gloo ranks (real processes), config round trips and the
auto optimiser through the CLI's ``main`` in this process (nothing there asks for a process of its own)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from cli_runs import fit_here

from yolo11_lightning.cli.main import main

REPO = Path(__file__).resolve().parents[2]


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


def _printed_config(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """What ``fit ... --print_config`` prints (it exits 0 before building anything)."""
    with pytest.raises(SystemExit) as stop:
        main(["fit", *args, "--print_config"])
    assert stop.value.code in (0, None), capsys.readouterr().err[-3000:]
    return capsys.readouterr().out


def test_print_config_round_trip(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    first = _printed_config(capsys, "--config", str(REPO / "configs" / "quickstart.yaml"), "--model.scale", "s",
                            "--data.batch_size", "32")  # fmt: skip
    saved = tmp_path / "printed.yaml"
    saved.write_text(first)
    second = _printed_config(capsys, "--config", str(saved))
    assert yaml.safe_load(second) == yaml.safe_load(first)
    config = yaml.safe_load(first)
    assert config["model"]["scale"] == "s" and config["data"]["batch_size"] == 32
    assert config["data"]["dataset"] == "synthetic"


def test_fit_one_device_writes_checkpoints_and_one_logger_run(tiny_dataset: Path, tmp_path: Path) -> None:
    proc = _cli(
        *_tiny_fit_args(tiny_dataset, tmp_path / "run"), "--pictures.train_batches", "1", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    versions = list((tmp_path / "run" / "lightning_logs").iterdir())
    assert [v.name for v in versions] == ["version_0"]
    run = versions[0]
    assert (run / "checkpoints" / "best.ckpt").is_file() and (run / "checkpoints" / "last.ckpt").is_file()
    assert (run / "config.yaml").is_file() and (run / "metrics.csv").is_file()
    assert "val/mAP50-95" in (run / "metrics.csv").read_text().splitlines()[0]
    assert list((run / "val_images").glob("epoch_*.png")), "validation images were not saved"
    # The result pictures (--pictures.*) and the closing summary, naming every class and the files.
    pictures = {p.relative_to(run / "pictures").as_posix() for p in (run / "pictures").rglob("*.*")}
    assert {"results.png", "train_batch0.jpg", "val/confusion_matrix.png", "val/box_PR_curve.png"} <= pictures
    assert "train_batch1.jpg" not in pictures
    printed = proc.stdout + proc.stderr
    names = yaml.safe_load(tiny_dataset.read_text())["names"]
    names = list(names.values()) if isinstance(names, dict) else names
    assert "fit finished in" in printed and all(f"\n{name} " in printed for name in names), printed[-3000:]
    assert (run / "summary_fit.csv").is_file() and "pictures/results.png" in printed
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
    # Rank 0 alone draws and prints: one summary, one set of pictures, and they reached W&B.
    printed = proc.stdout + proc.stderr
    assert printed.count("fit finished in") == 1 and "could not" not in printed, printed[-3000:]
    assert (
        len(list(root.rglob("confusion_matrix.png"))) == 1 and len(list(root.rglob("summary_fit.csv"))) == 1
    )
    assert list(wandb_runs[0].rglob("*confusion_matrix*.png")), "the pictures did not reach W&B"


def _auto_recipe_line(said: str) -> str:
    lines = [ln for ln in said.splitlines() if "optimizer " in ln and "lr0=" in ln]
    assert lines, said[-3000:]
    return lines[-1]


def test_auto_optimizer_through_the_cli_and_kept_by_a_resume(
    tiny_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--model.optimizer auto` picks AdamW for a short run, and a resume with 10k more epochs keeps it."""
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "run"
    args = [*_tiny_fit_args(tiny_dataset, root), "--model.optimizer", "auto"]
    first = fit_here(args)
    # 16 images, batch 4: ceil(16 / max(4, 64)) * 1 epoch = 1 iteration <= 10000 -> AdamW(0.002 * 5 / (4 + 3)).
    assert "optimizer 'auto' chose AdamW(lr0=0.001429, momentum=0.9, warmup_bias_lr=0)" in _auto_recipe_line(
        first
    )
    last = root / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    saved = torch.load(last, map_location="cpu", weights_only=True)
    assert saved["optimizer_recipe"]["name"] == "AdamW" and saved["optimizer_recipe"]["lr0"] == 0.001429
    assert all(g["betas"] == (0.9, 0.999) for g in saved["optimizer_states"][0]["param_groups"])

    # 10001 epochs would make 'auto' pick SGD for a fresh run; the resumed run keeps AdamW and its state.
    resumed = fit_here(
        [*args, "--trainer.max_epochs", "10001", "--trainer.max_steps", "3", "--ckpt_path", str(last)]
    )
    assert "optimizer kept from the checkpoint: AdamW(lr0=0.001429" in _auto_recipe_line(resumed)


@pytest.mark.parametrize(("epochs", "expected"), [(1, "AdamW"), (10_001, "SGD")])
def test_auto_optimizer_through_trainer_fit(
    tiny_dataset: Path, tmp_path: Path, epochs: int, expected: str
) -> None:
    """Trainer.fit with YOLODataModule: the oracle's rule from the dataset size, global batch and max_epochs."""
    import lightning as L

    from yolo11_lightning import YOLO11Module, YOLODataModule

    data = YOLODataModule(dataset=str(tiny_dataset), batch_size=4, image_size=64, num_workers=0)
    module = YOLO11Module(num_classes=data.num_classes, class_names=data.class_names, log_images=0)
    assert module.hparams.optimizer == "auto"  # the reference's default
    trainer = L.Trainer(accelerator="cpu", max_epochs=epochs, max_steps=1, limit_val_batches=0, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=str(tmp_path))  # fmt: skip
    trainer.fit(module, data)
    optimizer = trainer.optimizers[0]
    assert type(optimizer).__name__ == expected == module.resolved_recipe.name
    assert module.resolved_recipe.lr0 == (0.01 if expected == "SGD" else round(0.01 / 7, 6))
    assert module.resolved_recipe.warmup_bias_lr == 0.0 and module.resolved_recipe.momentum == 0.9
    # Batch 0 of the warmup: bias LR starts at 0 (not 0.1), SGD momentum at the warmup's 0.8, AdamW betas untouched.
    assert [g["lr"] for g in optimizer.param_groups] == [0.0, 0.0, 0.0]
    if expected == "SGD":
        assert all(g["momentum"] == pytest.approx(0.8) for g in optimizer.param_groups)
    else:
        assert all(g["betas"] == (0.9, 0.999) for g in optimizer.param_groups)
