"""World-size invariance of training and evaluation: 2 gloo ranks against 1 process, for real."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from yolo11_lightning.synthetic.shapes import make_synthetic_dataset

SCRIPT = Path(__file__).resolve().parents[1] / "helpers" / "scripts" / "equivalence_run.py"


def _run(dataset: Path, devices: int, out: Path, non_square: Path, segment: Path, pose: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(dataset), str(devices), str(out), str(non_square), str(segment),
         str(pose)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return torch.load(out, weights_only=True)


@pytest.fixture(scope="module")
def runs(tiny_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict]:
    from validation_oracle import write_dataset

    tmp = tmp_path_factory.mktemp("equivalence")
    # 9 images of 5 aspect ratios: rectangular groups of the global batch 4 hold 4, 4 and 1 images.
    non_square = write_dataset(tmp / "non_square")
    # 7 segmentation images: shards of 4 and 3 on 2 ranks, no padding duplicates.
    segment = make_synthetic_dataset(tmp / "segment", num_train=4, num_val=7, image_size=64, task="segment")
    pose = make_synthetic_dataset(tmp / "pose", num_train=4, num_val=7, image_size=64, task="pose")
    return (
        _run(tiny_dataset, 1, tmp / "one.pt", non_square, segment, pose),
        _run(tiny_dataset, 2, tmp / "two.pt", non_square, segment, pose),
    )


def _assert_close_relative(a: torch.Tensor, b: torch.Tensor, rel: float, what: str) -> None:
    scale = a.abs().max()
    assert (a - b).abs().max() <= rel * scale + 1e-12, (
        f"{what}: max diff {(a - b).abs().max():.3g} vs scale {scale:.3g}"
    )


def test_one_step_on_two_ranks_equals_one_process(runs: tuple[dict, dict]) -> None:
    one, two = runs
    # The gradient the optimiser applies: DDP's average over 2 ranks of 4 images must equal 1 process of 8.
    assert one["gradients"].keys() == two["gradients"].keys() and len(one["gradients"]) > 100
    nonzero = 0
    for name, grad in one["gradients"].items():
        _assert_close_relative(grad, two["gradients"][name], 1e-5, f"gradient of {name}")
        nonzero += bool(grad.abs().max() > 0)
    assert nonzero > 100, "almost every gradient is zero: the comparison would be vacuous"
    # And so the parameters after the step (1e-5 relative to each tensor's scale).
    for key, start in one["initial"].items():
        torch.testing.assert_close(two["initial"][key], start)  # same initialisation in both runs
        if start.is_floating_point():
            _assert_close_relative(one["trained"][key], two["trained"][key], 1e-5, f"parameter {key}")


def test_a_window_carried_over_an_epoch_end_is_the_same_on_every_world_size(runs: tuple[dict, dict]) -> None:
    """Windows of 3 batches over 2-batch epochs: the gradient carried into epoch 1 (averaged over ranks at
    the epoch end, what checkpoints store) and the gradient of the first step equal one process's."""
    one, two = runs
    for key in ("carried", "carried_step"):
        assert one[key].keys() == two[key].keys() and len(one[key]) > 100, key
        for name, grad in one[key].items():
            _assert_close_relative(grad, two[key][name], 1e-5, f"{key} gradient of {name}")
    # The first optimiser step came in epoch 1, not at epoch 0's end as Lightning alone would take it.
    assert one["carry_step_epoch"] == two["carry_step_epoch"] == 1


def test_distributed_map_equals_single_process(runs: tuple[dict, dict]) -> None:
    one, two = runs
    assert 0.05 < one["metrics"]["val/mAP50-95"] < 0.95  # non-trivial, so dropped or doubled images show
    for name, value in one["metrics"].items():
        assert two["metrics"][name] == pytest.approx(value, abs=1e-6), name


def test_distributed_mask_map_equals_single_process(runs: tuple[dict, dict]) -> None:
    """The segment task on 2 gloo ranks (unpadded shards of 4 and 3): box and mask mAP equal one process's."""
    one, two = runs
    assert 0.05 < one["seg_metrics"]["val/mask_mAP50-95"] < 0.95  # non-trivial: a lost image would show
    assert 0.05 < one["seg_metrics"]["val/mAP50-95"] < 0.95
    for name, value in one["seg_metrics"].items():
        assert two["seg_metrics"][name] == pytest.approx(value, abs=1e-6), name


def test_distributed_pose_map_equals_single_process(runs: tuple[dict, dict]) -> None:
    """The pose task on 2 gloo ranks (unpadded shards of 4 and 3): box and keypoint mAP equal one process's."""
    one, two = runs
    assert 0.05 < one["pose_metrics"]["val/pose_mAP50-95"] < 0.95  # non-trivial: a lost image would show
    for name, value in one["pose_metrics"].items():
        assert two["pose_metrics"][name] == pytest.approx(value, abs=1e-6), name


def test_rectangular_distributed_map_equals_single_process(runs: tuple[dict, dict]) -> None:
    """Rectangular batches on 2 ranks: each image gets the shape it gets in one process, same mAP."""
    one, two = runs
    assert len(one["rect_shapes"]) == 9 and two["rect_shapes"] == one["rect_shapes"]
    assert len(set(one["rect_shapes"].values())) >= 2  # several rectangles, not one square for all
    assert 0.05 < one["rect_metrics"]["val/mAP50-95"] < 0.95
    for name, value in one["rect_metrics"].items():
        assert two["rect_metrics"][name] == pytest.approx(value, abs=1e-6), name
