"""Elastic resume through the real front door, against one uninterrupted run.

Every run is ``python -m yolo11_lightning fit`` (or torchrun / scripts/torchrun_node.sh around it) on
``tests/helpers/scripts/tiny_fit.yaml``: 16 images, global batch 4, 2 batches accumulated per optimiser step,
2 epochs (4 optimiser steps), EMA on, mosaic closed in the last epoch, BatchNorm frozen, ``last.ckpt``
after every optimiser step. Runs are cut mid-epoch (after step 3 = epoch 1, batch 2 of 4) and resumed
on another world size: 2 ranks -> 1 (``--ckpt_path last``), 1 -> 2 "nodes" (two torchrun launches with
``--nnodes 2`` on loopback), and 2 -> 2 after torchrun restarts a SIGKILLed rank. Each must end in the
state of the uninterrupted run (step, epoch, data position, weights, EMA, momentum within 1e-5 of scale)
having seen exactly the global sample order, nothing repeated or skipped.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from cli_runs import (
    BATCH,
    CUT,
    EPOCHS,
    IMAGES,
    REPO,
    STEP_AT_CUT,
    assert_same_training_state,
    check_resume_two_ranks_to_one,
    cli_env,
    expected_order,
    final_checkpoint,
    fit_args,
    flatten,
    global_batches,
    load,
    max_relative_difference,
    records,
    run,
    start_of,
    tail,
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_uninterrupted_run_sees_the_global_order_with_atomic_checkpoints(uninterrupted: Path) -> None:
    rows = records(uninterrupted / "rec")
    (start,) = start_of(rows)
    assert start["global_step"] == 0 and start["checkpoint_io"] == "AtomicCheckpointIO"
    assert flatten(global_batches(rows)) == expected_order()
    final = load(final_checkpoint(uninterrupted))
    assert final["global_step"] == EPOCHS * IMAGES // BATCH // 2  # 2 batches per optimiser step
    # One optimiser step moves weights by far more than the 1e-5 tolerance the resume tests use, so a
    # missing, extra or different step cannot hide in it.
    (at_cut,) = uninterrupted.glob("lightning_logs/version_0/checkpoints/at-step=3.ckpt")
    moved, _ = max_relative_difference(load(at_cut)["current_model_state"], final["current_model_state"])
    assert moved > 1e-3


def test_resume_two_ranks_to_one_with_ckpt_path_last(
    tiny_dataset: Path, uninterrupted: Path, tmp_path: Path
) -> None:
    """2 ranks cut mid-epoch, then `fit --ckpt_path last` on 1 rank (a new logger version) finishes the run."""
    check_resume_two_ranks_to_one(tiny_dataset, uninterrupted, tmp_path)


def test_resume_one_rank_to_two_nodes_with_torchrun_script(
    tiny_dataset: Path, uninterrupted: Path, tmp_path: Path
) -> None:
    """The uninterrupted run's step-3 checkpoint (1 rank) finished by two torchrun "nodes" on loopback.

    Two launches of scripts/torchrun_node.sh with NNODES=2 (c10d rendezvous, 1 worker per node): the
    nodes end with identical weights, equal to the uninterrupted run's.
    """
    (at_cut,) = uninterrupted.glob("lightning_logs/version_0/checkpoints/at-step=3.ckpt")
    args = fit_args(tiny_dataset, tmp_path, "rec", "--trainer.strategy", "ddp", "--ckpt_path", str(at_cut))
    env = cli_env(
        NNODES="2", GPUS_PER_NODE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
        RUN_ID="resume-test", MAX_RESTARTS="0", PYTHON=sys.executable,
    )  # fmt: skip
    script = str(REPO / "scripts" / "torchrun_node.sh")
    nodes = [
        subprocess.Popen(["bash", script, *args[1:]], cwd=tmp_path, env={**env, "NODE_RANK": str(rank)},
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for rank in (0, 1)
    ]  # fmt: skip
    try:
        outputs = [node.communicate(timeout=240)[0] for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    for node, output in zip(nodes, outputs):
        assert node.returncode == 0, output[-8000:]

    rows = records(tmp_path / "rec")
    starts = start_of(rows)
    assert sorted(s["rank"] for s in starts) == [0, 1]
    assert all((s["world"], s["num_nodes"], s["global_step"]) == (2, 2, STEP_AT_CUT) for s in starts)
    before = {k: v for k, v in global_batches(records(uninterrupted / "rec")).items() if k < CUT}
    after = global_batches(rows)
    assert set(before).isdisjoint(after)
    assert flatten({**before, **after}) == expected_order()

    node0, node1 = load(tmp_path / "rec" / "final-rank0.pt"), load(tmp_path / "rec" / "final-rank1.pt")
    assert all(node0[k].equal(node1[k]) for k in node0), "the two nodes ended with different weights"
    assert_same_training_state(load(final_checkpoint(uninterrupted)), load(final_checkpoint(tmp_path)))


def test_torchrun_restarts_a_sigkilled_rank_and_resumes(
    tiny_dataset: Path, uninterrupted: Path, tmp_path: Path
) -> None:
    """`torchrun --max-restarts 1`: rank 1 is SIGKILLed mid-epoch, torchrun restarts both ranks, they resume
    from the last checkpoint by themselves (`--ckpt_path last`) and finish; the job exits 0."""
    kill = [
        "--trainer.callbacks+=fault_callbacks.KillRankAt", "--trainer.callbacks.rank", "1",
        "--trainer.callbacks.epoch", "1", "--trainer.callbacks.batch_idx", "3",
    ]  # fmt: skip
    args = fit_args(tiny_dataset, tmp_path, "rec", "--trainer.devices", "2", "--trainer.strategy", "ddp",
                    "--ckpt_path", "last", *kill)  # fmt: skip
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                "--max-restarts", "1", "-m", "yolo11_lightning"]  # fmt: skip
    proc = run([*torchrun, *args], cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, tail(proc)
    assert "exitcode: -9" in proc.stderr, "rank 1 was not killed: " + tail(proc)

    rows = records(tmp_path / "rec")
    first, second = global_batches(rows, attempt=0), global_batches(rows, attempt=1)
    # The first attempt trained batch (1, 2) after the step-3 checkpoint; it is lost and redone.
    assert (1, 2) in first and (1, 3) not in first
    assert all(s["global_step"] == STEP_AT_CUT for s in start_of(rows, attempt=1))
    order = expected_order()
    assert flatten(second) == order[(CUT[0] * IMAGES // BATCH + CUT[1]) * BATCH :]
    assert flatten({k: v for k, v in first.items() if k < CUT}) + flatten(second) == order
    assert_same_training_state(load(final_checkpoint(uninterrupted)), load(final_checkpoint(tmp_path)))
