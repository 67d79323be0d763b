"""Elastic resume of the segment task through the real front door: 2 ranks cut mid-epoch, resumed on 1.

The same tiny run as ``tests/test_resume.py`` (``tests/scripts/tiny_fit.yaml``: 16 images, global batch 4, 2
batches per optimiser step, 2 epochs, mosaic closed in the last, EMA, ``last.ckpt`` after every step), on the
synthetic segmentation set with ``--model.task segment --data.task segment``: masks travel through mosaic,
the sampler and the mask loss. The resumed run must end in the uninterrupted run's state (weights, EMA,
momentum within 1e-5 of scale) having trained exactly the global sample order once.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cli_runs import (
    assert_same_training_state,
    ddp,
    expected_order,
    final_checkpoint,
    fit_args,
    flatten,
    global_batches,
    load,
    records,
    run_cli,
    start_of,
    tail,
)

SEGMENT = ["--model.task", "segment", "--data.task", "segment"]
CUT = (1, 2)  # cut when epoch 1, batch 2 starts: after optimiser step 3, mid-epoch
STEP_AT_CUT = 3


@pytest.fixture(scope="module")
def seg_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """16 train / 7 val images of 64 px (the tiny detection set's sizes), exact polygons."""
    from yolo11_lightning.data.synthetic import make_synthetic_dataset

    root = tmp_path_factory.mktemp("tiny_segment")
    return make_synthetic_dataset(
        root, num_train=16, num_val=7, image_size=64, num_classes=3, seed=0, task="segment"
    )


@pytest.fixture(scope="module")
def seg_uninterrupted(seg_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("seg_uninterrupted")
    proc = run_cli(fit_args(seg_dataset, root, "rec", "--ckpt_path", "last", *SEGMENT), cwd=root)
    assert proc.returncode == 0, tail(proc)
    return root


def test_segment_resume_two_ranks_to_one_is_exact(
    seg_dataset: Path, seg_uninterrupted: Path, tmp_path: Path
) -> None:
    cut = [
        "--trainer.callbacks+=fault_callbacks.StopAt",
        "--trainer.callbacks.epoch", str(CUT[0]), "--trainer.callbacks.batch_idx", str(CUT[1]),
    ]  # fmt: skip
    first = run_cli(
        fit_args(seg_dataset, tmp_path, "rec-2", "--ckpt_path", "last", *SEGMENT, *ddp(), *cut), cwd=tmp_path
    )
    assert first.returncode == 75, tail(first)  # StopAt.EXIT_CODE: ended abruptly right after step 3

    second = run_cli(fit_args(seg_dataset, tmp_path, "rec-1", "--ckpt_path", "last", *SEGMENT), cwd=tmp_path)
    assert second.returncode == 0, tail(second)
    assert re.search(r"--ckpt_path last: resuming from \S*version_0\S*last\S*\.ckpt", second.stderr), tail(
        second
    )
    (start,) = start_of(records(tmp_path / "rec-1"))
    assert (start["world"], start["global_step"], start["epoch"]) == (1, STEP_AT_CUT, CUT[0])

    before, after = global_batches(records(tmp_path / "rec-2")), global_batches(records(tmp_path / "rec-1"))
    assert set(before).isdisjoint(after), "a batch was trained twice"
    assert flatten({**before, **after}) == expected_order()
    expected, actual = load(final_checkpoint(seg_uninterrupted)), load(final_checkpoint(tmp_path))
    assert expected["hyper_parameters"]["task"] == actual["hyper_parameters"]["task"] == "segment"
    assert_same_training_state(expected, actual)


def test_segment_best_checkpoint_follows_box_plus_mask_fitness(seg_uninterrupted: Path) -> None:
    """``best.ckpt`` of the segment task follows ``val/fitness`` (box + mask, the reference's best.pt rule),
    logged beside the mAPs and equal to its formula."""
    import csv

    (best,) = seg_uninterrupted.rglob("best.ckpt")
    states = load(best)["callbacks"]
    (key,) = [k for k in states if k.startswith("BestCheckpoint")]
    assert "'monitor': 'val/fitness'" in key, key
    (metrics_csv,) = seg_uninterrupted.rglob("metrics.csv")
    rows = [r for r in csv.DictReader(metrics_csv.open()) if r.get("val/fitness")]
    assert rows, "val/fitness not logged"
    for r in rows:
        m = {k: float(r[f"val/{k}"]) for k in ("mAP50", "mAP50-95", "mask_mAP50", "mask_mAP50-95", "fitness")}
        expected = 0.1 * (m["mAP50"] + m["mask_mAP50"]) + 0.9 * (m["mAP50-95"] + m["mask_mAP50-95"])
        assert m["fitness"] == pytest.approx(expected, abs=1e-6)
    assert float(states[key]["best_model_score"]) == pytest.approx(max(float(r["val/fitness"]) for r in rows))
