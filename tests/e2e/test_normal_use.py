"""Normal use says nothing alarming: a resume and a validate of a training run's checkpoint raise none of the
Lightning warnings whose premise does not hold here, validate writes into the run's own ``validate/`` folder, a
log that is not a terminal gets one line per epoch, and a resumed version shows as a number."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest
from cli_runs import final_checkpoint, fit_args, fit_here
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks.progress.progress_bar import get_standard_metrics

from yolo11_lightning.training.checkpointing import continue_logger_version
from yolo11_lightning.training.loggers import RunCSVLogger

ALARMS = (
    "Experiment logs directory",  # "... Previous log files in this directory will be deleted" (they are not)
    "Checkpoint directory",  # "... exists and is not empty" (it is the run being continued)
    "The dirpath has changed",  # "... best_model_score ... won't be reloaded" (BestCheckpoint restores it)
    "You're using the WeightAveraging callback, but loading",  # validate needs no EMA state: its weights are EMA
)


def _alarms(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if str(w.message).startswith(ALARMS)]


def test_resume_and_validate_raise_no_false_alarm_and_validate_writes_into_the_run(
    tiny_dataset: Path, uninterrupted: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The uninterrupted 2-epoch run, resumed for a 3rd epoch with the progress bar on (stdout is a pipe here), then
    validated from its best.ckpt: no alarm, one ``epoch 3/3`` line and no bar redraws, validate's files in
    ``version_0/validate`` and no ``version_1``."""
    shutil.copytree(uninterrupted / "lightning_logs", tmp_path / "lightning_logs")
    run = tmp_path / "lightning_logs" / "version_0"
    capfd.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit_here(fit_args(tiny_dataset, tmp_path, "rec", "--ckpt_path", "last", "--trainer.max_epochs", "3",
                          "--trainer.enable_progress_bar", "true"))  # fmt: skip
        out = capfd.readouterr().out
        assert _alarms(caught) == [], "resume"
        assert "\r" not in out and "\x1b[A" not in out, "progress-bar redraws in a log"
        lines = [line for line in out.splitlines() if line.startswith("epoch ")]
        assert len(lines) == 1 and lines[0].startswith("epoch 3/3: 4 batches in "), out[-3000:]
        assert "it/s); " in lines[0] and "train/box_loss " in lines[0] and "val/mAP50-95 " in lines[0]

        assert final_checkpoint(tmp_path) == run / "checkpoints" / "last.ckpt"
        fit_here(["validate", *fit_args(tiny_dataset, tmp_path, "rec-val")[1:], "--ckpt_path",
                  str(run / "checkpoints" / "best.ckpt")])  # fmt: skip
        assert _alarms(caught) == [], "validate"
    assert (run / "validate" / "summary_validate.csv").is_file() and (
        run / "validate" / "metrics.csv"
    ).is_file()
    assert sorted(p.name for p in (tmp_path / "lightning_logs").iterdir()) == ["version_0"]


def test_a_resumed_version_is_a_number(tmp_path: Path) -> None:
    """``continue_logger_version`` makes the logger's version 0, not "version_0" (the bar showed ``v_num=on_0``)."""
    checkpoint = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.touch()
    trainer = Trainer(logger=RunCSVLogger(save_dir=tmp_path), default_root_dir=tmp_path, accelerator="cpu",
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    continue_logger_version(trainer, str(checkpoint))
    assert trainer.logger.version == 0 and get_standard_metrics(trainer)["v_num"] == 0
    assert Path(trainer.log_dir) == checkpoint.parent.parent
