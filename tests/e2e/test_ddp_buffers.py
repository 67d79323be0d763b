"""DDP's ``broadcast_buffers`` on 2 gloo ranks through the CLI: BatchNorm statistics per rank, the EMA, validation.

Two runs of ``tests/helpers/scripts/buffers_fit.yaml`` (BatchNorm in training mode, accumulation windows of 3 batches
over epochs of 4, so the epoch ends inside a window), recorded per rank by ``ddp_options.RecordBuffers``:

* ``on``: DDP's default, rank 0's buffers broadcast before every forward that follows a gradient all-reduce;
* ``off``: ``--trainer.strategy.broadcast_buffers false``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from cli_runs import SCRIPTS, ddp, final_checkpoint, load, run_cli, tail

sys.path.insert(0, str(SCRIPTS))

CONFIG = SCRIPTS / "buffers_fit.yaml"
RUNS = {
    "on": [],
    "off": ["--trainer.strategy.broadcast_buffers", "false"],
}  # fmt: skip


@pytest.fixture(scope="module")
def runs(tiny_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Per run: each rank's record (``buffers-rank<R>.pt``) and the final checkpoint rank 0 wrote."""
    results = {}
    for name, extra in RUNS.items():
        root = tmp_path_factory.mktemp(name)
        args = [
            "fit", "--config", str(CONFIG), "--data.dataset", str(tiny_dataset), "--model.nominal_batch", "12",
            "--trainer.default_root_dir", str(root), *ddp("0:01:00"), *extra,
            "--trainer.callbacks+=ddp_options.RecordBuffers", "--trainer.callbacks.out_dir", str(root / "rec"),
        ]  # fmt: skip
        proc = run_cli(args, cwd=root, timeout=240)
        assert proc.returncode == 0, tail(proc)
        ranks = [torch.load(root / "rec" / f"buffers-rank{r}.pt", weights_only=True) for r in (0, 1)]
        results[name] = {"ranks": ranks, "checkpoint": load(final_checkpoint(root))}
    return results


def equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    assert a.keys() == b.keys() and a
    return all(torch.equal(a[k], b[k]) for k in a)


def distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """|a - b| over every statistic, as one vector."""
    return float(torch.cat([(a[k] - b[k]).flatten() for k in a]).norm())


def saved_model(checkpoint: dict) -> dict[str, torch.Tensor]:
    """The state dict the checkpoint holds for the detector (the EMA weights), without the ``model.`` prefix."""
    return {
        k.removeprefix("model."): v for k, v in checkpoint["state_dict"].items() if k.startswith("model.")
    }


def test_rank_zero_trains_and_saves_the_same_with_broadcast_buffers_off(runs: dict[str, dict]) -> None:
    """BatchNorm normalises training batches with their own statistics; the running statistics only update, from
    the rank's own batches. Rank 0's never receive anything, so its statistics, EMA, weights and checkpoint are
    bitwise those of the default run."""
    on, off = runs["on"], runs["off"]
    for what in ("raw", "ema", "validated"):
        assert equal(on["ranks"][0][what], off["ranks"][0][what]), what
    for what in ("state_dict", "current_model_state"):
        assert equal(on["checkpoint"][what], off["checkpoint"][what]), what


def test_without_broadcast_other_ranks_keep_their_own_statistics(runs: dict[str, dict]) -> None:
    """Rank 1's statistics and its EMA of them differ from rank 0's in both runs (with the broadcast on, by the
    updates since the last broadcast), and further without it (every update its own)."""
    gaps = {}
    for name in ("on", "off"):
        zero, one = runs[name]["ranks"]
        assert not equal(zero["raw"], one["raw"]) and not equal(zero["ema"], one["ema"]), name
        gaps[name] = distance(zero["raw"], one["raw"])
    assert gaps["off"] > gaps["on"], gaps


@pytest.mark.parametrize("name", list(RUNS))
def test_every_rank_validates_the_model_the_checkpoint_holds(runs: dict[str, dict], name: str) -> None:
    """Each rank scores its shard with rank 0's statistics (``YOLO11Module`` broadcasts them when validation starts),
    so the distributed mAP is the single-process mAP of the saved model, whatever ``broadcast_buffers`` says and
    though the epoch ended inside an accumulation window (where DDP itself would not broadcast)."""
    zero, one = runs[name]["ranks"]
    saved = saved_model(runs[name]["checkpoint"])
    assert equal(zero["validated"], saved) and equal(one["validated"], saved)
    torch.testing.assert_close(zero["output"], one["output"], rtol=0, atol=0)
