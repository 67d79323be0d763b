"""The Trainer features a Lightning user reaches for on the first day, through the CLI, with our default callbacks.

Each row of ``MATRIX`` is a ``fit`` through ``yolo11_lightning.cli.main`` (the parser, LightningCLI, our default
callbacks, the Trainer) on a tiny dataset, and checks what the feature promises, not only that nothing raised:
the files that must or must not exist, where training stopped, what a user's own callback wrote. The features we
refuse are refused in one line naming what to set instead. Training that ends inside an epoch (``max_time``,
``max_steps``, a callback's ``should_stop``) resumes exactly, each sample trained once (in this process, on 1 torch
thread as the subprocess runs of ``cli_runs`` are, so that the comparison with the uninterrupted run holds at 1e-5).
"""

from __future__ import annotations

import csv
import random
import sys
from pathlib import Path

import pytest
from cli_runs import (
    SCRIPTS,
    assert_same_training_state,
    expected_order,
    final_checkpoint,
    fit_args,
    flatten,
    global_batches,
    load,
    records,
    shell_here,
)

from yolo11_lightning.cli.main import main

BATCHES_PER_EPOCH = 4  # tiny_dataset: 16 images, batch 4


@pytest.fixture(autouse=True)
def _test_callbacks_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(SCRIPTS))  # fault_callbacks.*, as the CLI runs name them


def fit(dataset: Path, root: Path, *extra: str) -> int:
    """One CLI ``fit`` in this process: yolo11n at 64 px, global batch 4 (2 batches per optimiser step, no warmup
    ramp), 2 epochs
    of 4 batches, 1 validation batch."""
    return main([
        "fit", "--data.dataset", str(dataset), "--data.image_size", "64", "--data.batch_size", "4",
        "--data.num_workers", "0", "--data.pin_memory", "false", "--model.scale", "n", "--model.log_images", "0",
        "--model.optimizer", "SGD", "--model.nominal_batch", "8", "--model.warmup_epochs", "0", "--trainer.accelerator", "cpu", "--trainer.max_epochs", "2",
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
        "--trainer.limit_val_batches", "1", "--trainer.default_root_dir", str(root), *extra,
    ])  # fmt: skip


def files(root: Path, pattern: str) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob(pattern))


def checkpoint_at(root: Path, name: str = "last.ckpt") -> dict:
    (path,) = root.rglob(name)
    return load(path)


def position(checkpoint: dict) -> int:
    """Global batches trained: finished epochs and the sampler's place in the current one."""
    sampler = checkpoint["YOLODataModule"]["train_sampler"]
    return sampler["epoch"] * BATCHES_PER_EPOCH + sampler["consumed_samples"] // 4


def check_logger_false(root: Path) -> None:
    assert files(root, "metrics.csv") == [] and files(root, "events.out.*") == []
    assert files(root, "*.ckpt") == ["checkpoints/best.ckpt", "checkpoints/last.ckpt"]


def check_no_checkpointing(root: Path) -> None:
    assert files(root, "*.ckpt") == []
    assert files(root, "metrics.csv")


def check_barebones(root: Path) -> None:
    assert files(root, "*.ckpt") == [] and files(root, "metrics.csv") == []


def check_fast_dev_run(root: Path) -> None:
    assert files(root, "*.ckpt") == []  # Lightning's rule: a dry run writes nothing


def check_own_checkpoint(root: Path) -> None:
    names = [Path(f).name for f in files(root, "*.ckpt")]
    assert "best.ckpt" in names and "last.ckpt" in names
    assert any(n.startswith("mine-") for n in names), names  # the user's ModelCheckpoint kept its own files


def check_early_stopping(root: Path) -> None:
    # The metric never improves: patience 1 ends the 5-epoch run after epoch 1 (epochs 0 and 1 validated).
    last = checkpoint_at(root)
    assert last["epoch"] == 1 and position(last) == 2 * BATCHES_PER_EPOCH


def check_limits(root: Path) -> None:
    assert checkpoint_at(root)["global_step"] == 2  # 2 batches x 2 epochs, one optimiser step per 2 batches


def check_accumulate(root: Path) -> None:
    assert checkpoint_at(root)["global_step"] == 2  # 8 batches, 4 per optimiser step


def check_max_steps(root: Path) -> None:
    # Ends after step 3 (batch 6 of 8), inside epoch 1: last.ckpt holds that moment, not "epoch 1 done".
    last = checkpoint_at(root)
    assert last["global_step"] == 3 and position(last) == 6


def check_overfit(root: Path) -> None:
    trained = global_batches(records(root / "record"))
    assert (
        sorted(trained) == [(0, 0), (1, 0)] and trained[(0, 0)] == trained[(1, 0)]
    )  # one batch, every epoch


def check_mid_epoch_val(root: Path) -> None:
    # Validation after batches 2 and 4 of the one epoch: two logged scores.
    (metrics,) = root.rglob("metrics.csv")
    with open(metrics) as f:
        scores = [row["val/mAP50-95"] for row in csv.DictReader(f) if row.get("val/mAP50-95")]
    assert len(scores) == 2, scores


def check_profile(root: Path) -> None:
    (report,) = root.rglob("fit-prof.txt")
    assert "run_training_batch" in report.read_text()


def check_runs(root: Path) -> None:
    assert files(root, "last.ckpt")


# name -> (options, check of the run folder)
MATRIX = {
    # ``--trainer.logger false``: test_logging_off_from_the_shell, as a user types it.
    "enable_checkpointing false": (
        ["--trainer.enable_checkpointing", "false", "--trainer.max_epochs", "1"],
        check_no_checkpointing,
    ),
    "barebones": (["--trainer.barebones", "true", "--trainer.max_epochs", "1"], check_barebones),
    "fast_dev_run": (["--trainer.fast_dev_run", "2"], check_fast_dev_run),
    "overfit_batches": (
        [
            "--trainer.overfit_batches",
            "1",
            "--trainer.callbacks+=fault_callbacks.RecordSamples",
            "--trainer.callbacks.out_dir",
            "RECORD",
        ],
        check_overfit,
    ),
    "mid-epoch validation": (
        ["--trainer.val_check_interval", "2", "--trainer.max_epochs", "1"],
        check_mid_epoch_val,
    ),
    "own ModelCheckpoint": (
        [
            "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
            "--trainer.callbacks.monitor",
            "val/mAP50",
            "--trainer.callbacks.mode",
            "max",
            "--trainer.callbacks.filename",
            "mine-{epoch}",
            "--trainer.max_epochs",
            "1",
        ],
        check_own_checkpoint,
    ),
    "EarlyStopping, metric never improves": (
        [
            "--trainer.callbacks+=fault_callbacks.FlatMetric",
            "--trainer.callbacks+=lightning.pytorch.callbacks.EarlyStopping",
            "--trainer.callbacks.monitor",
            "val/mAP50-95",
            "--trainer.callbacks.mode",
            "max",
            "--trainer.callbacks.patience",
            "1",
            "--trainer.max_epochs",
            "5",
        ],
        check_early_stopping,
    ),
    "limit_train_batches": (["--trainer.limit_train_batches", "2"], check_limits),
    "accumulate_grad_batches": (["--trainer.accumulate_grad_batches", "4"], check_accumulate),
    "gradient_clip_val": (["--trainer.gradient_clip_val", "0.5", "--trainer.max_epochs", "1"], check_runs),
    "profiler": (
        [
            "--trainer.profiler",
            "lightning.pytorch.profilers.SimpleProfiler",
            "--trainer.profiler.filename",
            "prof",
            "--trainer.max_epochs",
            "1",
        ],
        check_profile,
    ),
    "max_steps inside an epoch": (["--trainer.max_steps", "3"], check_max_steps),
}


@pytest.mark.parametrize("feature", list(MATRIX))
def test_trainer_feature_through_the_cli(feature: str, tiny_dataset: Path, tmp_path: Path) -> None:
    options, check = MATRIX[feature]
    assert (
        fit(tiny_dataset, tmp_path, *[str(tmp_path / "record") if o == "RECORD" else o for o in options]) == 0
    )
    check(tmp_path)


@pytest.mark.parametrize(
    ("callback", "names"),
    [
        ("LearningRateFinder", ["LearningRateFinder is not supported", "--model.lr0"]),
        ("BatchSizeFinder", ["BatchSizeFinder is not supported", "--data.batch_size"]),
    ],
)
def test_tuners_are_refused_in_one_line(
    callback: str, names: list[str], tiny_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert fit(tiny_dataset, tmp_path, f"--trainer.callbacks+=lightning.pytorch.callbacks.{callback}") == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert message.startswith("error: ") and all(name in message for name in names)
    assert files(tmp_path, "*.ckpt") == []


def test_logging_off_from_the_shell(
    tiny_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The documented ``--trainer.logger false`` (docs/getting-started.md), as a user types it: the shell's path
    through the entry point (``main`` reading ``sys.argv``, in this process), validate included."""
    monkeypatch.chdir(tmp_path)
    fit = fit_args(tiny_dataset, tmp_path, "rec", "--trainer.logger", "false", "--trainer.max_epochs", "1")
    assert shell_here(fit) == 0
    check_logger_false(tmp_path)
    (best,) = tmp_path.rglob("best.ckpt")
    capsys.readouterr()
    assert shell_here(["validate", "--config", str(SCRIPTS / "tiny_fit.yaml"), "--data.dataset", str(tiny_dataset),
                       "--trainer.logger", "false", "--ckpt_path", str(best)]) == 0  # fmt: skip
    assert "val/mAP50-95" in capsys.readouterr().out


ONE_THREAD = ["--machine.cpu_threads", "1"]  # as OMP_NUM_THREADS=1 in the uninterrupted run's subprocess


def resume_to_the_end(root: Path, uninterrupted: Path, dataset: Path) -> None:
    """``--ckpt_path last`` finishes the run: every sample trained once, the uninterrupted run's final state."""
    before = global_batches(records(root / "rec"))
    assert main(fit_args(dataset, root, "rec-resumed", "--ckpt_path", "last", *ONE_THREAD)) == 0
    after = global_batches(records(root / "rec-resumed"))
    assert flatten({**before, **after}) == expected_order()
    assert_same_training_state(load(final_checkpoint(uninterrupted)), load(final_checkpoint(root)))


def test_stop_inside_an_accumulation_window_waits_for_its_step(
    tiny_dataset: Path, uninterrupted: Path, tmp_path: Path
) -> None:
    """A callback asks to stop after the first batch of a 2-batch window (as max_time's Timer or EarlyStopping
    do at any batch): training ends after the window's optimiser step, last.ckpt holds that moment, and the
    resume trains the rest of the epoch, not the next one."""
    batch = random.choice([0, 2])  # first batch of a window, in epoch 1
    print(f"stop asked after batch (1, {batch})")
    stop = ["--trainer.callbacks+=fault_callbacks.ShouldStopAt", "--trainer.callbacks.epoch", "1",
            "--trainer.callbacks.batch_idx", str(batch), "--last_checkpoint.every_n_train_steps", "0"]  # fmt: skip
    assert main(fit_args(tiny_dataset, tmp_path, "rec", *stop, *ONE_THREAD)) == 0
    trained = global_batches(records(tmp_path / "rec"))
    assert max(trained) == (1, batch + 1)  # the window was finished, then training stopped
    assert position(load(final_checkpoint(tmp_path))) == BATCHES_PER_EPOCH + batch + 2
    resume_to_the_end(tmp_path, uninterrupted, tiny_dataset)


def test_max_time_then_resume(tiny_dataset: Path, uninterrupted: Path, tmp_path: Path) -> None:
    """``--trainer.max_time`` ends the run wherever the clock says (slowed batches, a 2-4 s budget); a later
    ``--ckpt_path last`` without it finishes the run exactly."""
    seconds = random.choice([2, 3, 4])
    print(f"max_time {seconds} s")
    slow = ["--trainer.callbacks+=fault_callbacks.SlowBatches", "--trainer.callbacks.seconds", "0.4"]
    options = [
        *slow,
        "--trainer.max_time",
        f"00:00:00:{seconds:02d}",
        "--last_checkpoint.every_n_train_steps",
        "0",
    ]
    assert main(fit_args(tiny_dataset, tmp_path, "rec", *options, *ONE_THREAD)) == 0
    saved = load(final_checkpoint(tmp_path))
    assert position(saved) % 2 == 0 and position(saved) == len(global_batches(records(tmp_path / "rec")))
    resume_to_the_end(tmp_path, uninterrupted, tiny_dataset)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
