"""What ``fit`` says about itself: the model summary's FLOPs, the closest options to a mistyped one, counts in
the singular, and the one-sentence descriptions ``yolo11-lightning configs`` lists."""

from __future__ import annotations

import importlib.util
import types

import lightning as L
import pytest
from lightning.pytorch.callbacks import ModelSummary

from yolo11_lightning.cli.info import summarize
from yolo11_lightning.cli.parser_errors import _closest_options
from yolo11_lightning.data.sources.checks import DataReport
from yolo11_lightning.training.callbacks.model_summary import (
    FlopsSummary,
    RichFlopsSummary,
    count_flops_in_summary,
)
from yolo11_lightning.training.module import YOLO11Module


def _table(summary: object) -> dict[str, list[str]]:
    return dict(summary._get_summary_data())  # type: ignore[attr-defined]


@pytest.mark.parametrize("task", ["detect", "classify"])
def test_the_summary_counts_the_detectors_flops_at_the_training_size(task: str) -> None:
    """Lightning's summary printed ``FLOPs 0`` (no ``example_input_array``); ours counts one image at the data's
    size, as ``yolo11-lightning info`` does, per layer and in total, without running the model."""
    module = YOLO11Module("n", 3, task=task)
    trainer = types.SimpleNamespace(datamodule=types.SimpleNamespace(image_size=320))
    summary = FlopsSummary(max_depth=2)._summary(trainer, module)  # type: ignore[arg-type]
    expected = summarize("n", 3, (320, 320), task=task)["gflops_total"]
    assert summary.total_flops / 1e9 == pytest.approx(expected, rel=1e-6) and expected > 0.1
    flops = dict(zip(_table(summary)["Name"], _table(summary)["FLOPs"]))
    assert flops["model"] not in ("0", "0  ") and flops["model.layers"] not in ("0", "0  ")
    assert flops["criterion"].strip() == "0"  # the loss runs no model layer
    # No image size to go by (a Trainer without our datamodule): Lightning's own summary.
    bare = types.SimpleNamespace(datamodule=None, strategy=None)
    assert FlopsSummary()._summary(bare, module).total_flops == 0  # type: ignore[arg-type]


def test_the_default_summary_is_replaced_and_a_disabled_one_stays_off() -> None:
    quiet = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False}
    trainer = L.Trainer(
        **quiet
    )  # Lightning's default: RichModelSummary where rich is installed (the int8 extra)
    count_flops_in_summary(trainer)
    default = RichFlopsSummary if importlib.util.find_spec("rich") else FlopsSummary
    assert [type(c) for c in trainer.callbacks if isinstance(c, ModelSummary)] == [default]
    trainer = L.Trainer(**quiet, callbacks=[ModelSummary(max_depth=3)])
    count_flops_in_summary(trainer)
    (summary,) = [c for c in trainer.callbacks if isinstance(c, ModelSummary)]
    assert type(summary) is FlopsSummary and summary._max_depth == 3  # the user's depth kept
    trainer = L.Trainer(**quiet, enable_model_summary=False)
    count_flops_in_summary(trainer)
    assert not [c for c in trainer.callbacks if isinstance(c, ModelSummary)]


def test_the_rich_summary_counts_the_flops_too() -> None:
    """A RichModelSummary (the user's, or Lightning's default with rich installed) keeps its table and depth and
    counts the detector's FLOPs like FlopsSummary."""
    pytest.importorskip("rich")
    from lightning.pytorch.callbacks import RichModelSummary

    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        callbacks=[RichModelSummary(max_depth=2)])  # fmt: skip
    count_flops_in_summary(trainer)
    (summary,) = [c for c in trainer.callbacks if isinstance(c, ModelSummary)]
    assert (
        type(summary) is RichFlopsSummary
        and isinstance(summary, RichModelSummary)
        and summary._max_depth == 2
    )
    module = YOLO11Module("n", 3)
    counted = summary._summary(
        types.SimpleNamespace(datamodule=types.SimpleNamespace(image_size=320)), module
    )
    assert counted.total_flops / 1e9 == pytest.approx(summarize("n", 3, (320, 320))["gflops_total"], rel=1e-6)


def test_a_mistyped_option_names_the_closest_ones() -> None:
    parser = types.SimpleNamespace(
        _actions=[
            types.SimpleNamespace(option_strings=[f"--trainer.{o}"]) for o in ("max_epochs", "max_steps")
        ]
        + [types.SimpleNamespace(option_strings=["--data.image_size", "--data.image-size"])]
    )
    said = "unrecognized arguments: --trainer.max_epoks 3 --data.imagesize 64"
    closest = ["--trainer.max_epochs", "--trainer.max_steps", "--data.image_size"]  # each option once
    assert _closest_options(said, parser) == closest
    from_config = "Subcommand 'fit' does not accept option 'trainer.max_epoks'"
    assert _closest_options(from_config, parser)[0] == "--trainer.max_epochs"
    assert _closest_options("unrecognized arguments: --zzz 3", parser) == []
    assert _closest_options('Parser key "trainer.max_epochs": Expected a <class int>', parser) == []


def test_one_warning_is_one_warning() -> None:
    report = DataReport(split="train")
    report.note("train/a.txt: something")
    assert report.summary().endswith("(1 warning)")
    report.note("train/b.txt: something else")
    assert report.summary().endswith("(2 warnings)")
