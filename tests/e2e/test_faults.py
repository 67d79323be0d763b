"""Faults: non-finite losses, a failing or hung rank, a checkpoint write killed half-way, bad launch shapes.

The DDP cases run the real CLI on 2 gloo ranks (Lightning's own launcher) with a fault injected on rank 1
only, by the callbacks in tests/helpers/scripts/fault_callbacks.py; each subprocess has a timeout, so a hang fails
the test instead of the suite.
"""

from __future__ import annotations

import csv
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from cli_runs import SCRIPTS, TINY_FIT, cli_env, ddp, fit_args, records, run_cli, tail
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from yolo11_lightning.cli.lightning_cli import default_callbacks, run_lightning_cli
from yolo11_lightning.training.callbacks.hang_watchdog import HangWatchdog
from yolo11_lightning.training.checkpointing import AtomicCheckpointIO, find_last_checkpoint
from yolo11_lightning.training.nonfinite_steps import (
    NonFiniteLossError,
    NonFiniteStepGuard,
    step_unless_nonfinite,
)

FINITE, NAN = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, float("nan"), 3.0])


# ------------------------------------------------------------------------------------------ step guard
def test_guard_skips_a_step_when_any_of_its_batches_is_not_finite() -> None:
    guard = NonFiniteStepGuard(max_consecutive=3)
    assert not guard.should_skip()  # nothing observed: nothing to decide
    guard.observe(FINITE)
    assert not guard.should_skip()
    guard.observe(FINITE)  # accumulation window: one bad micro-batch spoils the step's gradients
    guard.observe(torch.tensor([float("inf"), 0.0, 0.0]))
    assert guard.should_skip() and (guard.skipped, guard.consecutive) == (1, 1)
    guard.observe(FINITE)
    assert not guard.should_skip() and (guard.skipped, guard.consecutive) == (1, 0)


def test_guard_stops_after_k_consecutive_skips_and_resumes_its_counts() -> None:
    guard = NonFiniteStepGuard(max_consecutive=2)
    guard.observe(NAN)
    assert guard.should_skip()
    guard.observe(NAN)
    with pytest.raises(NonFiniteLossError, match=r"2 consecutive optimiser steps .*max_skipped_steps=2"):
        guard.should_skip()
    restored = NonFiniteStepGuard(max_consecutive=2)
    restored.load_state_dict({"skipped": 7, "consecutive": 1})
    restored.observe(NAN)
    with pytest.raises(NonFiniteLossError):
        restored.should_skip()
    never = NonFiniteStepGuard(max_consecutive=0)  # 0: skip forever, never stop
    for _ in range(50):
        never.observe(NAN)
        assert never.should_skip()
    assert never.state_dict() == {"skipped": 50, "consecutive": 50}
    with pytest.raises(ValueError, match="max_skipped_steps"):
        NonFiniteStepGuard(max_consecutive=-1)


# ------------------------------------------------------------------------------------------ checkpoints
class _ScalerSteps:
    """What Lightning's optimiser wrapper does under 16-mixed: the closure, then the GradScaler's step."""

    def __init__(self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler) -> None:
        self.optimizer, self.scaler = optimizer, scaler

    def step(self, closure) -> None:
        closure()
        self.scaler.step(self.optimizer)
        self.scaler.update()


@pytest.mark.parametrize("way", ["host read", "fused found_inf", "grad scaler"])
def test_a_non_finite_window_skips_the_update_every_way_and_the_next_step_updates(way: str) -> None:
    """The three ways the guard's flag reaches the update: decided on the host for an optimiser that takes no
    ``found_inf`` (the only way that says so: it returns True), the device flag for a fused one, non-finite
    gradients under a GradScaler. The parameters stay put on the skipped step and move on the next."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1, momentum=0.9, fused=way != "host read")
    scaler = torch.amp.GradScaler("cpu", init_scale=1.0) if way == "grad scaler" else None
    stepper = _ScalerSteps(optimizer, scaler) if scaler is not None else optimizer
    guard = NonFiniteStepGuard(max_consecutive=3)
    start = [p.detach().clone() for p in layer.parameters()]
    for loss_terms in (NAN, FINITE):
        optimizer.zero_grad()
        loss = layer(torch.ones(4, 3)).sum()
        (scaler.scale(loss) if scaler is not None else loss).backward()
        guard.observe(loss_terms)
        on_host = step_unless_nonfinite(guard, stepper, scaler, lambda: None)
        moved = not all(torch.equal(a, b) for a, b in zip(start, layer.parameters()))
        assert on_host is (way == "host read" and loss_terms is NAN)
        assert moved is (loss_terms is FINITE), f"{way}: moved={moved} after a {loss_terms} window"
        assert "found_inf" not in optimizer.__dict__  # the flag is handed over for one step only
    assert not guard.read(guard.counters().tolist()) and (guard.skipped, guard.consecutive) == (1, 0)


def test_checkpoint_write_killed_half_way_leaves_the_previous_one_loadable(tmp_path: Path) -> None:
    ckpt, marker = tmp_path / "checkpoints" / "last.ckpt", tmp_path / "half-written"
    proc = subprocess.Popen([sys.executable, str(SCRIPTS / "killed_write.py"), str(ckpt), str(marker)],
                            env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the second write never started"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    loaded = torch.load(ckpt, weights_only=True)
    assert loaded["version"] == 1 and loaded["weights"].equal(torch.arange(200_000.0))
    leftovers = [p.name for p in ckpt.parent.iterdir() if p != ckpt]
    assert leftovers and all(name.startswith(".last.ckpt.tmp-") for name in leftovers), leftovers
    # The next write replaces the file and clears what the killed one left.
    AtomicCheckpointIO().save_checkpoint({"version": 3}, ckpt)
    assert torch.load(ckpt, weights_only=True) == {"version": 3}
    assert [p.name for p in ckpt.parent.iterdir()] == ["last.ckpt"]


def test_ckpt_path_last_finds_the_newest_last_checkpoint_of_any_logger_version(tmp_path: Path) -> None:
    trainer = L.Trainer(
        default_root_dir=tmp_path, logger=CSVLogger(tmp_path), callbacks=[ModelCheckpoint(save_last=True)],
        enable_progress_bar=False,
    )  # fmt: skip
    assert find_last_checkpoint(trainer) is None  # nothing yet: the CLI starts fresh
    old = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    new = tmp_path / "lightning_logs" / "version_1" / "checkpoints" / "last-v1.ckpt"
    temp = new.with_name(".last.ckpt.tmp-123")  # a killed write
    for i, path in enumerate((old, new, temp)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
        os.utime(path, ns=(i * 10**9, i * 10**9))
    (new.parent / "best.ckpt").write_bytes(b"x")
    assert find_last_checkpoint(trainer) == str(new)
    hpc = tmp_path / "hpc_ckpt_3.ckpt"  # Lightning's SLURM requeue checkpoint, newer still
    hpc.write_bytes(b"x")
    assert find_last_checkpoint(trainer) == str(hpc)


def test_global_batch_that_does_not_divide_by_the_world_size_fails_before_launch(
    tiny_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(SCRIPTS))  # the config names fault_callbacks.FreezeBatchNorm
    args = ["fit", "--config", str(TINY_FIT), "--data.dataset", str(tiny_dataset), "--trainer.devices", "3",
            "--trainer.default_root_dir", str(tmp_path)]  # fmt: skip
    with pytest.raises(
        ValueError, match=r"batch_size=4 is the GLOBAL batch .* world size 3 .*batch_size=3 or 6"
    ):
        run_lightning_cli(args)
    assert not list(tmp_path.rglob("*.ckpt")) and not list(tmp_path.rglob("metrics.csv"))


# ------------------------------------------------------------------------------------------ DDP faults
@pytest.fixture(scope="module")
def nan_then_failure(
    tiny_dataset: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, subprocess.CompletedProcess]:
    """One 2-rank run: NaN loss on rank 1 only at optimiser steps 0 and 2, then rank 1 raises at step 3."""
    root = tmp_path_factory.mktemp("nan_then_failure")
    faults = [
        "--trainer.callbacks+=fault_callbacks.NaNLossOnRank",
        "--trainer.callbacks.rank", "1", "--trainer.callbacks.steps", "[0, 2]",
        "--trainer.callbacks+=fault_callbacks.RaiseOnRank", "--trainer.callbacks.rank", "1",
        "--trainer.callbacks.step", "3",
    ]  # fmt: skip
    return root, run_cli(fit_args(tiny_dataset, root, "rec", *ddp(), *faults), cwd=root, timeout=180)


def test_nan_loss_on_one_rank_skips_the_step_on_every_rank(
    nan_then_failure: tuple[Path, subprocess.CompletedProcess],
) -> None:
    """Steps 0 and 2 are skipped on both ranks (weights unchanged, in step), step 1 trains, count logged."""
    root, proc = nan_then_failure
    rows = records(root / "rec")
    for rank in (0, 1):
        mine = [r for r in rows if r["rank"] == rank]
        start = next(r["checksum"] for r in mine if r["event"] == "start")
        # checksum and skip count after the last batch of each optimiser step (2 batches per step)
        after = {r["global_step"] - 1: (r["checksum"], r["skipped"]) for r in mine
                 if r["event"] == "batch" and r["batch_idx"] % 2 == 1}  # fmt: skip
        assert after[0] == (start, 1), f"rank {rank}: step 0 changed the weights\n" + tail(proc)
        assert after[1][0] != start and after[1][1] == 1, f"rank {rank}: step 1 did not train"
        assert after[2] == (after[1][0], 2), f"rank {rank}: step 2 changed the weights"
    by_step = {}
    for r in rows:
        if r["event"] == "batch":
            by_step.setdefault((r["epoch"], r["batch_idx"]), set()).add(r["checksum"])
    assert len(by_step) == 6 and all(len(sums) == 1 for sums in by_step.values()), "the ranks diverged"
    (metrics,) = root.glob("lightning_logs/version_0/metrics.csv")
    logged = [
        float(row["train/skipped_steps"])
        for row in csv.DictReader(metrics.open())
        if row["train/skipped_steps"]
    ]
    assert logged and logged[0] == 1.0 and logged[-1] == 2.0
    assert "optimiser step skipped on all ranks (2 skipped, 1 in a row, limit 10)" in proc.stderr


def test_exception_on_one_rank_ends_the_whole_job(
    nan_then_failure: tuple[Path, subprocess.CompletedProcess],
) -> None:
    """Rank 1 raises at step 3: the job exits non-zero (within the run's timeout), no rank finishes."""
    root, proc = nan_then_failure
    assert proc.returncode != 0, tail(proc)
    assert "injected failure on rank 1 at step 3" in proc.stderr
    assert not [r for r in records(root / "rec") if r["event"] == "end"], "a rank finished training"


def test_hung_rank_is_named_with_every_ranks_stacks_and_no_rank_is_left_behind(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    """Rank 1 sleeps inside step 1: both ranks' HangWatchdog (deadline 5 s) dump their stacks to
    ``<log_dir>/hang/rank<R>.txt`` and name rank 1 as the one that fell behind; rank 0 gives up after the
    configured 15 s collective timeout with an error that names rank 1 and its stack file, and the CLI ends
    rank 1 (a process it launched) instead of leaving it asleep; `run` returning at all proves that, since
    rank 1 would otherwise hold the output pipes open for the rest of its 150 s sleep.

    (The timeout must also cover start-up: it bounds the ranks' first connection to the store too.)
    """
    watchdog = ["--trainer.callbacks+=yolo11_lightning.training.callbacks.hang_watchdog.HangWatchdog",
                "--trainer.callbacks.deadline", "5"]  # fmt: skip
    hang = ["--trainer.max_epochs", "1", "--trainer.callbacks+=fault_callbacks.HangOnRank",
            "--trainer.callbacks.rank", "1", "--trainer.callbacks.step", "1", "--trainer.callbacks.seconds", "150"]  # fmt: skip
    args = fit_args(tiny_dataset, tmp_path, "rec", *ddp("0:00:15"), *watchdog, *hang)
    proc = run_cli(args, cwd=tmp_path, timeout=120)
    assert proc.returncode != 0, tail(proc)
    assert "Timed out" in proc.stderr or "timed out" in proc.stderr, tail(proc)
    (hang_dir,) = tmp_path.glob("lightning_logs/version_0/hang")
    stacks = {p.name: p.read_text() for p in hang_dir.iterdir()}
    assert sorted(stacks) == ["rank0.txt", "rank1.txt"], tail(proc)
    # Rank 1's main thread is in the sleep (step 1 = epoch 0, batch 2), rank 0's waits in DDP's forward.
    assert "in on_train_batch_start" in stacks["rank1.txt"] and "fault_callbacks.py" in stacks["rank1.txt"]
    assert "at train batch 2 (forward)" in stacks["rank0.txt"].splitlines()[0]
    assert "Thread 0x" in stacks["rank0.txt"] and "distributed.py" in stacks["rank0.txt"]
    # Rank 0's error (its last lines: the exception and the note added to it) names rank 1, and only it.
    # (Rank 1 is at batch 2's start or batch 1's end, depending on the order of the callbacks.)
    error = proc.stderr[proc.stderr.index("Timed out") :]
    named = f"Fell behind: rank 1 \\(.*\\) is at train batch [12] .*read {re.escape(str(hang_dir))}/rank1.txt"
    assert re.search(f"rank 0 .* made no progress .*at train batch 2 \\(forward\\).*{named}", error), tail(
        proc
    )
    assert "Fell behind: rank 0" not in proc.stderr
    assert not [r for r in records(tmp_path / "rec") if r["event"] == "end"]


def test_hang_watchdog_is_a_default_callback_that_one_you_add_replaces(tmp_path: Path) -> None:
    """LightningCLI appends its default callbacks after the configured ones: the first watchdog is active."""
    (default,) = [c for c in default_callbacks() if isinstance(c, HangWatchdog)]
    mine = HangWatchdog(deadline=3.0)
    trainer = L.Trainer(default_root_dir=tmp_path, logger=False, callbacks=[mine, default], accelerator="cpu")
    for watchdog in (mine, default):
        watchdog.setup(trainer, L.LightningModule(), "fit")
    assert (mine.active, default.active) == (True, False)
    assert (mine.deadline, mine.interval, mine.exit_after) == (3.0, 1.0, None)  # 1 rank: nothing to exit for
    assert mine.hang_dir == tmp_path / "hang"


def test_hang_watchdog_refuses_bad_seconds() -> None:
    for bad in ({"deadline": -1.0}, {"interval": float("nan")}, {"exit_after": float("inf")}):
        with pytest.raises(ValueError, match=f"HangWatchdog {next(iter(bad))}="):
            HangWatchdog(**bad)


def test_rank_stuck_beyond_exit_after_ends_itself_with_its_stacks_written(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    """A rank stuck where no timeout reaches it (here: 1 rank asleep in a step) ends itself `exit_after`
    seconds into the stall, exit code 86, after writing its stacks; nothing is left to wait for it."""
    watchdog = ["--trainer.callbacks+=yolo11_lightning.training.callbacks.hang_watchdog.HangWatchdog",
                "--trainer.callbacks.deadline", "2", "--trainer.callbacks.exit_after", "4"]  # fmt: skip
    hang = ["--trainer.callbacks+=fault_callbacks.HangOnRank", "--trainer.callbacks.rank", "0",
            "--trainer.callbacks.step", "1", "--trainer.callbacks.seconds", "300"]  # fmt: skip
    proc = run_cli(fit_args(tiny_dataset, tmp_path, "rec", *watchdog, *hang), cwd=tmp_path, timeout=120)
    assert proc.returncode == 86, tail(proc)
    assert re.search(
        r"rank 0 made no progress for \d+ s \(exit_after=4 s\), still at train batch", proc.stderr
    )
    (stacks,) = tmp_path.glob("lightning_logs/version_0/hang/rank0.txt")
    assert "fault_callbacks.py" in stacks.read_text()
