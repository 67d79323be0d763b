"""Gradient compression (``configs/trainer/ethernet.yaml``) in a real 2-rank gloo fit through the CLI.

The presets as users stack them (``multinode.yaml``, then ``ethernet.yaml``), moved to the CPU by command-line
options. Lightning registers ``ddp_comm_hook`` on CUDA only; ``ddp_options.CommHookOnCpu`` registers the hook the
CLI resolved, as Lightning does on a GPU, and checks what it returned. What compression does to the trajectory
is measured by ``benchmarks/parity/comm_hook.py``.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from cli_runs import REPO, SCRIPTS, run_cli, tail

BF16_HOOK = "torch.distributed.algorithms.ddp_comm_hooks.default_hooks.bf16_compress_hook"


def test_bf16_compressed_all_reduce_trains_on_two_gloo_ranks(tiny_dataset: Path, tmp_path: Path) -> None:
    """4 optimiser steps: the dotted path in the preset reaches DDP as the hook itself, every gradient bucket goes
    through it and comes back as bf16 numbers, and the loss stays finite, no step skipped."""
    presets = REPO / "configs" / "trainer"
    args = [
        "fit", "--config", str(SCRIPTS / "buffers_fit.yaml"),
        "--config", str(presets / "multinode.yaml"), "--config", str(presets / "ethernet.yaml"),
        "--data.dataset", str(tiny_dataset), "--trainer.default_root_dir", str(tmp_path),
        "--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.num_nodes", "1",
        "--trainer.precision", "32-true", "--trainer.max_epochs", "1", "--trainer.benchmark", "false",
        "--trainer.strategy.process_group_backend", "gloo", "--trainer.strategy.timeout", "0:01:00",
        "--data.batch_size", "4",  # buffers_fit.yaml's, over the preset's 256 (16 per GPU on 2 x 8)
        "--model.nominal_batch", "4",  # an optimiser step, so a gradient all-reduce, every batch
        "--trainer.callbacks+=ddp_options.CommHookOnCpu", "--trainer.callbacks.out_dir", str(tmp_path / "rec"),
    ]  # fmt: skip
    proc = run_cli(args, cwd=tmp_path, timeout=180)
    assert proc.returncode == 0, tail(proc)
    for rank in (0, 1):
        record = json.loads((tmp_path / "rec" / f"hook-rank{rank}.json").read_text())
        assert record["hook"] == BF16_HOOK, record
        assert record["calls"] >= 4 and record["bf16_values"], record  # at least one bucket per step
    (metrics,) = tmp_path.glob("lightning_logs/version_0/metrics.csv")
    rows = [r for r in csv.DictReader(metrics.open()) if r.get("train/box_loss")]
    assert [int(r["step"]) for r in rows] == [0, 1, 2, 3]
    for row in rows:
        losses = [float(row[f"train/{name}_loss"]) for name in ("box", "cls", "dfl")]
        assert all(math.isfinite(v) for v in losses), row
        assert not row.get("train/skipped_steps"), row  # logged only once a NaN/inf step was skipped
