"""DDP's ``broadcast_buffers`` on 2 gloo ranks through the CLI: BatchNorm statistics per rank, the EMA, validation.

Three runs of ``tests/scripts/buffers_fit.yaml`` (BatchNorm in training mode, accumulation windows of 3 batches
over epochs of 4, so the epoch ends inside a window), recorded per rank by ``ddp_options.RecordBuffers``:

* ``on``: DDP's default, rank 0's buffers broadcast before every forward that follows a gradient all-reduce;
* ``off``: ``--trainer.strategy.broadcast_buffers false``;
* ``global_bn``: ``off`` with statistics of the global batch (``ddp_options.CpuSyncBatchNorm``, what
  ``--trainer.sync_batchnorm true`` does on GPUs; SyncBatchNorm itself runs on CUDA only).
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from cli_runs import SCRIPTS, ddp, final_checkpoint, load, run_cli, tail

sys.path.insert(0, str(SCRIPTS))
from ddp_options import GlobalBatchNorm

CONFIG = SCRIPTS / "buffers_fit.yaml"
RUNS = {
    "on": [],
    "off": ["--trainer.strategy.broadcast_buffers", "false"],
    "global_bn": ["--trainer.strategy.broadcast_buffers", "false", "--trainer.plugins", "ddp_options.CpuSyncBatchNorm"],
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


def test_statistics_of_the_global_batch_agree_on_every_rank(runs: dict[str, dict]) -> None:
    """With synchronised BatchNorm every rank computes the same statistics (those of the global batch) and so the
    same EMA, with no broadcast: ``broadcast_buffers`` is redundant there. They are not rank 0's own."""
    zero, one = runs["global_bn"]["ranks"]
    assert equal(zero["raw"], one["raw"]) and equal(zero["ema"], one["ema"])
    assert distance(zero["raw"], runs["off"]["ranks"][0]["raw"]) > 0


# ------------------------------------------------------------------------------------ the SyncBN stand-in
def _compare_with_batchnorm(rank: int, port: int) -> None:
    """Rank ``rank`` of 2 holds 2 or 4 of 6 images; outputs, input and parameter gradients and running statistics
    must equal BatchNorm2d's on all 6."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        x, upstream = torch.randn(6, 4, 5, 5) * 3 + 1, torch.randn(6, 4, 5, 5)
        reference = torch.nn.BatchNorm2d(4, eps=1e-3, momentum=0.03)
        torch.nn.init.uniform_(reference.weight, 0.5, 1.5)
        torch.nn.init.uniform_(reference.bias, -1, 1)
        layer = GlobalBatchNorm(4, 1e-3, 0.03)
        layer.load_state_dict(reference.state_dict())
        mine = slice(0, 2) if rank == 0 else slice(2, 6)
        whole, shard = x.clone().requires_grad_(), x[mine].clone().requires_grad_()
        expected = reference(whole)
        (expected * upstream).sum().backward()
        out = layer(shard)
        (out * upstream[mine]).sum().backward()  # this rank's part of the loss
        torch.testing.assert_close(out, expected[mine], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(shard.grad, whole.grad[mine], rtol=1e-4, atol=1e-5)
        for name in ("weight", "bias"):
            grad = getattr(layer, name).grad.clone()
            dist.all_reduce(
                grad
            )  # the ranks' parts of the loss summed, as DDP's all-reduce (before its mean)
            torch.testing.assert_close(grad, getattr(reference, name).grad, rtol=1e-4, atol=1e-4)
        for name in ("running_mean", "running_var"):
            torch.testing.assert_close(getattr(layer, name), getattr(reference, name), rtol=1e-5, atol=1e-6)
    finally:
        dist.destroy_process_group()


def test_global_batchnorm_equals_batchnorm_on_the_whole_batch() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_compare_with_batchnorm, args=(port,), nprocs=2, join=True)
