"""The defaults table (docs/defaults.md): reference column = the oracle's defaults, ours = the live defaults."""

from __future__ import annotations

import inspect
import os
from pathlib import Path

import pytest

from yolo11_lightning.cli.defaults import (
    CODE_CONSTANTS,
    REFERENCE_DEFAULTS,
    ROWS,
    our_default,
    render_table,
)

os.environ.setdefault("YOLO_OFFLINE", "1")
DOC = Path(__file__).resolve().parents[1] / "docs" / "defaults.md"


def test_reference_column_is_the_oracles_default_configuration() -> None:
    cfg = pytest.importorskip("ultralytics.cfg")
    for key, value in REFERENCE_DEFAULTS.items():
        if key not in CODE_CONSTANTS:
            assert cfg.DEFAULT_CFG_DICT[key] == value, (
                f"reference default {key} is now {cfg.DEFAULT_CFG_DICT[key]!r}"
            )
    torch_utils = pytest.importorskip("ultralytics.utils.torch_utils")
    ema = inspect.signature(torch_utils.ModelEMA.__init__).parameters
    assert (ema["decay"].default, ema["tau"].default) == (
        REFERENCE_DEFAULTS["ema_decay"],
        REFERENCE_DEFAULTS["ema_tau"],
    )
    trainer_src = inspect.getsource(
        pytest.importorskip("ultralytics.engine.trainer").BaseTrainer.optimizer_step
    )
    assert f"max_norm={REFERENCE_DEFAULTS['clip_grad_norm']}" in trainer_src
    validator_src = inspect.getsource(
        pytest.importorskip("ultralytics.engine.validator").BaseValidator.__init__
    )
    assert f"else {REFERENCE_DEFAULTS['val_conf']}" in validator_src
    # The reference checks images with PIL, whose Image.open refuses more than twice MAX_IMAGE_PIXELS.
    pil_image = pytest.importorskip("PIL.Image")
    assert REFERENCE_DEFAULTS["max_image_pixels"] == 2 * pil_image.MAX_IMAGE_PIXELS


def test_every_row_is_equal_or_explains_why_not() -> None:
    assert {row.reference for row in ROWS} == set(REFERENCE_DEFAULTS)
    for row in ROWS:
        if row.ours is None:
            assert row.reason, f"{row.reference}: no setting here and no reason"
            continue
        ours = our_default(row.ours)
        same = ours == REFERENCE_DEFAULTS[row.reference]
        assert same != bool(row.reason), (
            f"{row.reference} -> {row.ours}: ours {ours!r}, reference {REFERENCE_DEFAULTS[row.reference]!r}, "
            f"reason {row.reason!r} (a reason is required exactly when they differ)"
        )


def test_published_table_is_current() -> None:
    assert render_table() in DOC.read_text(), (
        "docs/defaults.md is stale: paste `python -m yolo11_lightning.cli.defaults` into it"
    )
