"""Elastic resume of the segment task through the real front door: 2 ranks cut mid-epoch, resumed on 1.

The same tiny run as ``tests/e2e/test_resume.py`` (``tests/helpers/scripts/tiny_fit.yaml``: 16 images, global batch 4, 2
batches per optimiser step, 2 epochs, mosaic closed in the last, EMA, ``last.ckpt`` after every step), on the
synthetic segmentation set with ``--model.task segment --data.task segment``: masks travel through mosaic,
the sampler and the mask loss. The resumed run must end in the uninterrupted run's state (weights, EMA,
momentum within 1e-5 of scale) having trained exactly the global sample order once.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_runs import check_resume_two_ranks_to_one, fit_args, load, run_cli, tail

SEGMENT = ["--model.task", "segment", "--data.task", "segment"]


@pytest.fixture(scope="module")
def seg_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """16 train / 7 val images of 64 px (the tiny detection set's sizes), exact polygons."""
    from yolo11_lightning.data.synthetic.shapes import make_synthetic_dataset

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
    final = check_resume_two_ranks_to_one(seg_dataset, seg_uninterrupted, tmp_path, *SEGMENT)
    assert final["hyper_parameters"]["task"] == "segment"


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
