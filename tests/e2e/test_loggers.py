"""The CLI's default loggers: metrics.csv always, TensorBoard beside it when installed, one version folder.

The fits run through the CLI's ``main`` in this process (``cli_runs.fit_here``): what is checked is in the files.
"""

from __future__ import annotations

import csv
import importlib.util
import os
from pathlib import Path

import pytest
from cli_runs import fit_here

# CI installs the dev extra, which has TensorBoard: there the test must run, not skip.
if not os.environ.get("CI") and importlib.util.find_spec("tensorboard") is None:
    pytest.skip("tensorboard is not installed (pip install -e '.[dev]')", allow_module_level=True)

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2


def _fit(dataset: Path, root: Path, *extra: str) -> None:
    fit_here([
        "fit", "--config", "quickstart", "--data.dataset", str(dataset), "--data.image_size", "64",
        "--data.batch_size", "4", "--data.num_workers", "0", "--trainer.accelerator", "cpu",
        "--trainer.limit_train_batches", "2", "--trainer.log_every_n_steps", "1", "--model.log_images", "2",
        "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(root), *extra,
    ])  # fmt: skip


def _events(run_dir: Path) -> EventAccumulator:
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    events.Reload()
    return events


def test_tensorboard_beside_metrics_csv(
    tiny_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # as a user runs it: from the run's folder
    _fit(tiny_dataset, tmp_path, "--trainer.max_epochs", "1")
    (run_dir,) = (tmp_path / "lightning_logs").iterdir()
    assert run_dir.name == "version_0"
    events = _events(run_dir)
    scalars = set(events.Tags()["scalars"])
    assert {"train/box_loss", "train/cls_loss", "train/dfl_loss", "val/mAP50-95", "val/mAP50"} <= scalars, (
        scalars
    )
    assert len(events.Scalars("train/box_loss")) == 2  # one per training step
    pictures = {"results", "labels_per_class", "labels_boxes", "train_batch0", "train_batch1",
                *(f"val/{n}" for n in ("confusion_matrix", "confusion_matrix_normalized", "box_PR_curve",
                                       "box_F1_curve", "box_P_curve", "box_R_curve"))}  # fmt: skip
    assert sorted(events.Tags()["images"]) == sorted(
        ["val/predictions", *(f"pictures/{p}" for p in pictures)]
    )
    height, width = events.Images("val/predictions")[0].height, events.Images("val/predictions")[0].width
    assert height >= 64 and width >= 64
    start = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    hparams = plugin_data_pb2.HParamsPluginData.FromString(start).session_start_info.hparams
    assert {"scale", "lr0", "yolo11_lightning/version", "yolo11_lightning/git_revision"} <= set(hparams)
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert {"train/box_loss", "val/mAP50-95"} <= set(rows[0])
    assert "yolo11_lightning:" in (run_dir / "hparams.yaml").read_text()
    assert (run_dir / "checkpoints" / "last.ckpt").is_file() and (run_dir / "config.yaml").is_file()

    # A resumed run continues the same folder for both loggers: a second event file, metrics.csv appended.
    _fit(tiny_dataset, tmp_path, "--trainer.max_epochs", "2", "--ckpt_path", "last")
    assert [p.name for p in (tmp_path / "lightning_logs").iterdir()] == ["version_0"]
    assert len(list(run_dir.glob("events.out.tfevents.*"))) == 2
    steps = {s.step for s in _events(run_dir).Scalars("train/box_loss")}
    assert len(steps) == 4, steps  # 2 steps per epoch, epochs 0 and 1, both event files read together
    with open(run_dir / "metrics.csv") as f:
        epochs = {row["epoch"] for row in csv.DictReader(f) if row.get("val/mAP50-95")}
    assert epochs == {"0", "1"}
