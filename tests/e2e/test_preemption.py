"""No training work is lost: an always-current last.ckpt, real stop signals, kills and resumes that know their run.

Every run is the real CLI on ``tests/helpers/scripts/tiny_fit.yaml`` (4 batches per epoch, 2 per optimiser step, 2
epochs); each run that is signalled is a subprocess (those nothing is sent to run in this process,
``cli_runs.fit_here``): signals are sent from this process to the training processes while they train, at
batches drawn at random (the seed is printed), and every run ends within a timeout. Resumed runs must end in
the uninterrupted run's state (``tests/conftest.py``) having trained exactly its global sample order.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from cli_runs import (
    BATCH,
    IMAGES,
    SCRIPTS,
    assert_same_training_state,
    cli_env,
    ddp,
    expected_order,
    final_checkpoint,
    fit_args,
    fit_here,
    flatten,
    global_batches,
    load,
    records,
)

from yolo11_lightning.cli.main import main

BATCHES_PER_EPOCH = IMAGES // BATCH
GRACE_SECONDS = 30  # the grace period the issue sets (Kubernetes' default)
SLOW = ["--trainer.callbacks+=fault_callbacks.SlowBatches", "--trainer.callbacks.seconds", "0.4"]
NO_STEP_SAVES = ["--last_checkpoint.every_n_train_steps", "0"]  # only epoch ends, the clock and signals save


def rank_pids(folder: Path) -> dict[int, int]:
    """``rank -> pid`` of the processes that recorded into ``folder`` (their file names carry both)."""
    found = {}
    for path in folder.glob("rank*-attempt*-pid*.jsonl"):
        match = re.match(r"rank(\d+)-attempt\d+-pid(\d+)\.jsonl", path.name)
        found[int(match[1])] = int(match[2])
    return found


def batches_done(folder: Path, rank: int = 0) -> int:
    return sum(1 for r in records(folder) if r["event"] == "batch" and r["rank"] == rank)


def start_training(args: list[str], cwd: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "yolo11_lightning", *args]
    return subprocess.Popen(
        command, cwd=cwd, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def signal_after(
    proc: subprocess.Popen, folder: Path, batches: int, signum: int, ranks: list[int], stagger: float = 0.0
) -> tuple[int, float]:
    """Once rank 0 finished ``batches`` batches, send ``signum`` to the processes of ``ranks``, ``stagger``
    seconds apart (ranks that hear of it at different moments).

    Returns (batches rank 0 had finished when the first signal went out, time it went out).
    """
    deadline = time.monotonic() + 180
    while batches_done(folder) < batches or not set(ranks) <= set(rank_pids(folder)):
        assert proc.poll() is None, (
            f"the run ended before the signal: exit {proc.returncode}\n{proc.stdout.read()[-6000:]}"
        )
        assert time.monotonic() < deadline, "the run never reached the batch to signal at"
        time.sleep(0.02)
    pids = rank_pids(folder)
    done, sent = batches_done(folder), time.monotonic()
    for i, rank in enumerate(ranks):
        if i:
            time.sleep(stagger)
        os.kill(pids[rank], signum)
    return done, sent


def finish(proc: subprocess.Popen, timeout: float = 120) -> tuple[int, str]:
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        pytest.fail(f"the run did not end within {timeout} s:\n{output[-6000:]}")
    return proc.returncode, output


def position(checkpoint: dict) -> int:
    """Global batches a checkpoint has trained (epochs and the sampler's place in the current one)."""
    sampler = checkpoint["YOLODataModule"]["train_sampler"]
    return sampler["epoch"] * BATCHES_PER_EPOCH + sampler["consumed_samples"] // BATCH


def assert_resumes_to_the_uninterrupted_run(
    root: Path, uninterrupted: Path, dataset: Path, *extra: str
) -> None:
    """``--ckpt_path last`` in ``root`` finishes the run: same state as the uninterrupted one, each sample once."""
    before = global_batches(records(root / "rec"))
    # not signalled: in this process
    fit_here(fit_args(dataset, root, "rec-resumed", "--ckpt_path", "last", *extra))
    after = global_batches(records(root / "rec-resumed"))
    assert set(before).isdisjoint(after), f"trained twice: {sorted(set(before) & set(after))}"
    assert flatten({**before, **after}) == expected_order()
    assert_same_training_state(load(final_checkpoint(uninterrupted)), load(final_checkpoint(root)))


def test_last_checkpoint_is_current_while_the_metric_stays_flat(tiny_dataset: Path, tmp_path: Path) -> None:
    """val mAP stuck at 0 for 3 epochs: best.ckpt stays at epoch 0, last.ckpt holds epoch 2 (Lightning 2.6's
    save_last alone would leave it at epoch 0). No signal here: in this process."""
    fit_here(fit_args(tiny_dataset, tmp_path, "rec", *NO_STEP_SAVES, "--trainer.max_epochs", "3",
                      "--trainer.callbacks+=fault_callbacks.FlatMetric"))  # fmt: skip
    folder = tmp_path / "lightning_logs" / "version_0" / "checkpoints"
    best, last = load(folder / "best.ckpt"), load(folder / "last.ckpt")
    assert (best["epoch"], best["global_step"]) == (0, 2)
    assert (last["epoch"], last["global_step"]) == (2, 6)
    assert position(last) == 3 * BATCHES_PER_EPOCH


def test_sigterm_at_random_batches_on_one_device(
    tiny_dataset: Path, uninterrupted: Path, tmp_path: Path
) -> None:
    """SIGTERM at a random batch of epoch 0 (another each run; the chaos test below signals at more): exit 143
    within the grace period, the checkpoint holds every batch done before the signal, and `--ckpt_path last`
    ends exactly where the uninterrupted run ends."""
    seed = random.randrange(1 << 30)
    moments = random.Random(seed).sample(range(1, BATCHES_PER_EPOCH), 1)
    print(f"signal moment (batches done) {moments}, seed {seed}")
    for moment in moments:
        root = tmp_path / f"at-{moment}"
        proc = start_training(fit_args(tiny_dataset, root, "rec", *NO_STEP_SAVES, *SLOW), cwd=tmp_path)
        done, _ = signal_after(proc, root / "rec", moment, signal.SIGTERM, ranks=[0])
        # As a scheduler would: the run must have ended within the grace period (a hang guard, not a timing
        # figure; seconds from signal to exit are measured by benchmarks/speed/preemption.py).
        code, output = finish(proc, timeout=GRACE_SECONDS)
        assert code == 143, output[-6000:]
        assert "received SIGTERM" in output and "stopped at global step" in output
        saved = load(final_checkpoint(root))
        assert position(saved) >= done - 1, (position(saved), done)
        assert position(saved) % 2 == 0  # an optimiser-step boundary: nothing half accumulated
        assert_resumes_to_the_uninterrupted_run(root, uninterrupted, tiny_dataset)


def _slurm_env(tmp_path: Path) -> dict[str, str]:
    """A one-task SLURM allocation as srun describes it, and a fake `scontrol` that records its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "scontrol.log"}\n')
    scontrol.chmod(scontrol.stat().st_mode | stat.S_IEXEC)
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_ID": "4242", "SLURM_NTASKS": "1",
        "SLURM_NTASKS_PER_NODE": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
        "SLURM_JOB_NAME": "yolo11", "SLURM_NODELIST": "127.0.0.1", "SLURM_CPUS_PER_TASK": "1",
    }  # fmt: skip


def test_slurm_requeue_signal_skips_and_repeats_no_sample(
    tiny_dataset: Path, uninterrupted: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGUSR1 under SLURM (Lightning's auto-requeue signal): saved at a step boundary, `scontrol requeue <job>`,
    exit 138; the requeued job (`--ckpt_path last`, in the same allocation; not signalled: in this process) trains
    every remaining sample once."""
    env = _slurm_env(tmp_path)
    root = tmp_path / "run"
    args = fit_args(tiny_dataset, root, "rec", *NO_STEP_SAVES, *SLOW)
    proc = subprocess.Popen([sys.executable, "-m", "yolo11_lightning", *args], cwd=tmp_path,
                            env=cli_env(**env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    moment = random.Random().randrange(1, BATCHES_PER_EPOCH + 2)
    done, _ = signal_after(proc, root / "rec", moment, signal.SIGUSR1, ranks=[0])
    code, output = finish(proc)
    assert code == 138, output[-6000:]
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"]
    saved = load(final_checkpoint(root))
    assert position(saved) >= done - 1
    assert not list(root.glob("hpc_ckpt_*.ckpt")), "Lightning's mid-batch SLURM checkpoint was written"
    before = global_batches(records(root / "rec"))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    fit_here(fit_args(tiny_dataset, root, "rec-resumed", "--ckpt_path", "last"))
    after = global_batches(records(root / "rec-resumed"))
    assert set(before).isdisjoint(after) and flatten({**before, **after}) == expected_order()
    assert_same_training_state(load(final_checkpoint(uninterrupted)), load(final_checkpoint(root)))


def test_chaos_sigterm_sigkill_sigterm_alternating_world_sizes(
    tiny_dataset: Path, uninterrupted: Path, tmp_path: Path
) -> None:
    """One run stopped 3 times and resumed on 2, 1, 2 and 1 ranks: SIGTERM to both ranks (at different moments),
    SIGKILL after a time-based save, SIGTERM to rank 1 only. It ends in the uninterrupted run's state, every
    sample of every epoch trained exactly once."""
    rng = random.Random()
    clock = ["--last_checkpoint.every_n_minutes", "0.0001"]  # a time-based save at every step boundary
    two = ddp("0:01:00")
    plan = [  # (world args, signal, ranks signalled, batches rank 0 has done in this attempt when it comes)
        (two, signal.SIGTERM, [0, 1], rng.randrange(1, 3)),
        ([], signal.SIGKILL, [0], 3),  # after the step boundary at its 2nd batch, where the clock saved
        (two, signal.SIGTERM, [1], 1),
    ]
    seen: dict[tuple[int, int], list[int]] = {}
    start = 0  # global batches trained by the checkpoint each attempt starts from
    for attempt, (world, signum, ranks, moment) in enumerate(plan):
        folder = tmp_path / f"rec-{attempt}"
        extra = clock if signum == signal.SIGKILL else NO_STEP_SAVES
        proc = start_training(fit_args(tiny_dataset, tmp_path, folder.name, "--ckpt_path", "last", *world, *extra, *SLOW),
                              cwd=tmp_path)  # fmt: skip
        done, _ = signal_after(proc, folder, moment, signum, ranks, stagger=rng.uniform(0.0, 0.5))
        code, output = finish(proc)
        assert code == (-9 if signum == signal.SIGKILL else 143), output[-6000:]
        batches = global_batches(records(folder))
        saved = position(load(final_checkpoint(tmp_path)))
        shutil.copy(
            final_checkpoint(tmp_path), tmp_path / f"after-attempt-{attempt}.ckpt"
        )  # for a post-mortem
        # SIGKILL: what ran after the last (time-based) save is lost and will be redone; nothing else is.
        kept = {k: v for k, v in batches.items() if k[0] * BATCHES_PER_EPOCH + k[1] < saved}
        assert saved >= start + done - 1, (attempt, start, done, saved)
        assert set(kept).isdisjoint(seen)
        seen.update(kept)
        start = saved
    # not signalled: in this process
    fit_here(fit_args(tiny_dataset, tmp_path, "rec-final", "--ckpt_path", "last"))
    final = global_batches(records(tmp_path / "rec-final"))
    assert set(final).isdisjoint(seen) and flatten({**seen, **final}) == expected_order()
    for epoch in range(2):  # the set of samples per epoch, as the uninterrupted run saw them
        ours = sorted(i for (e, _), ids in {**seen, **final}.items() if e == epoch for i in ids)
        theirs = sorted(
            i
            for (e, _), ids in global_batches(records(uninterrupted / "rec")).items()
            if e == epoch
            for i in ids
        )
        assert ours == theirs
    assert_same_training_state(load(final_checkpoint(uninterrupted)), load(final_checkpoint(tmp_path)))


def _copy_run(source: Path, destination: Path) -> Path:
    """The uninterrupted run's last.ckpt at the same place under ``destination`` (a root of its own)."""
    target = destination / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    target.parent.mkdir(parents=True)
    shutil.copy(final_checkpoint(source), target)
    return target


def test_ckpt_path_last_knows_its_run(
    tiny_dataset: Path, uninterrupted: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Another experiment in the same root is refused with the differing keys; a finished run says so and exits
    0; a changed global batch is refused before anything starts; allowed changes resume and keep the best.

    Every run is in this process (the CLI's ``main``): none is signalled."""
    monkeypatch.syspath_prepend(str(SCRIPTS))  # tiny_fit.yaml names the test callbacks
    last = _copy_run(uninterrupted, tmp_path)
    # the note goes to Lightning's logger, whose handler an earlier test may own
    caplog.set_level(logging.INFO)
    assert main(fit_args(tiny_dataset, tmp_path, "rec", "--ckpt_path", "last")) == 0
    said = caplog.text + "".join(capfd.readouterr())
    assert "this run already finished (2 epochs, global step 4" in said, said[-3000:]
    assert not (tmp_path / "rec").exists(), "a finished run trained again"

    other = main(fit_args(tiny_dataset, tmp_path, "rec", "--ckpt_path", "last", "--model.lr0", "0.02",
                          "--data.seed", "1"))  # fmt: skip
    err = capfd.readouterr().err
    assert other != 0 and "a checkpoint of another run" in err, err[-3000:]
    assert "data.seed: 0 in the checkpoint, 1 now" in err and "model.lr0: 0.01 in the checkpoint" in err

    batch = main(fit_args(tiny_dataset, tmp_path, "rec", "--ckpt_path", str(last), "--data.batch_size", "8"))
    err = capfd.readouterr().err
    assert batch != 0 and "was trained with data.batch_size=4" in err, err[-3000:]

    best_before = load(last)["callbacks"]
    longer = main(fit_args(tiny_dataset, tmp_path, "rec", "--ckpt_path", "last", "--trainer.max_epochs", "3",
                           "--data.num_workers", "1", "--last_checkpoint.every_n_minutes", "5"))  # fmt: skip
    assert longer == 0, capfd.readouterr()
    assert [p.name for p in (tmp_path / "lightning_logs").iterdir()] == ["version_0"], (
        "a restart opened a new folder"
    )
    resumed = load(last)
    assert resumed["global_step"] == 6
    key = next(k for k in resumed["callbacks"] if k.startswith("BestCheckpoint"))
    old = best_before[key]["best_model_score"]
    new = resumed["callbacks"][key]["best_model_score"]
    metrics = (tmp_path / "lightning_logs" / "version_0" / "metrics.csv").read_text().splitlines()
    header = metrics[0].split(",")
    scores = [
        float(row.split(",")[header.index("val/mAP50-95")])
        for row in metrics[1:]
        if row.split(",")[header.index("val/mAP50-95")]
    ]
    assert float(new) == pytest.approx(max(float(old), scores[-1])), (old, new, scores)
    assert torch.is_tensor(new) or isinstance(new, float)


def test_sigterm_to_torchrun_stops_every_worker_with_a_checkpoint(tiny_dataset: Path, tmp_path: Path) -> None:
    """SIGTERM to the torchrun agent (as a scheduler sends it): it passes SIGTERM on to its 2 workers, which
    save at the same optimiser step and end; torchrun exits non-zero and does not restart them."""
    args = fit_args(tiny_dataset, tmp_path, "rec", "--trainer.devices", "2", "--trainer.strategy", "ddp",
                    "--ckpt_path", "last", *NO_STEP_SAVES, *SLOW)  # fmt: skip
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                "--max-restarts", "1", "-m", "yolo11_lightning"]  # fmt: skip
    proc = subprocess.Popen([*torchrun, *args], cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    moment = random.Random().randrange(1, BATCHES_PER_EPOCH)
    while batches_done(tmp_path / "rec") < moment:
        assert proc.poll() is None, proc.stdout.read()[-6000:]
        time.sleep(0.02)
    done = batches_done(tmp_path / "rec")
    proc.send_signal(signal.SIGTERM)
    code, output = finish(proc)
    assert code != 0, output[-6000:]
    assert output.count("received SIGTERM") == 2 and "stopped at global step" in output, output[-6000:]
    assert len({p.name.split("-")[1] for p in (tmp_path / "rec").glob("rank*.jsonl")}) == 1, (
        "torchrun restarted"
    )
    assert position(load(final_checkpoint(tmp_path))) >= done - 1


WORKERS = ["--data.num_workers", "2", "--data.persistent_workers", "true"]


def test_ctrl_c_during_validation_keeps_the_step_says_how_to_resume_and_resumes(
    tiny_dataset: Path, uninterrupted: Path, tmp_path: Path
) -> None:
    """Ctrl-C (SIGINT to the main process) while a mid-epoch validation runs on persistent loader workers: the run
    finishes validating, keeps its last optimiser step in last.ckpt, prints that and the command that resumes, and
    exits 130 with every worker gone (they hold the output pipe: a worker left alive would block reading it, as the
    2-minute hang at exit did). Resumed, it ends in the uninterrupted run's state."""
    marker = tmp_path / "validating"
    slow_validation = ["--trainer.callbacks+=fault_callbacks.SlowValidation", "--trainer.callbacks.marker",
                       str(marker), "--trainer.val_check_interval", "2"]  # fmt: skip
    args = fit_args(tiny_dataset, tmp_path, "rec", *NO_STEP_SAVES, *WORKERS, *slow_validation)
    proc = start_training(args, cwd=tmp_path)
    deadline = time.monotonic() + 180
    while not marker.exists():
        assert proc.poll() is None, proc.stdout.read()[-6000:]
        assert time.monotonic() < deadline, "the run never validated"
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    code, output = finish(proc, timeout=GRACE_SECONDS)
    assert code == 130, output[-6000:]
    assert "Detected KeyboardInterrupt" not in output
    kept = final_checkpoint(tmp_path)
    assert f"Ctrl-C (SIGINT): stopped at global step 1 (epoch 0, 2 of 4 batches done); kept that exact position in {kept}" in output, output[-3000:]  # fmt: skip
    command = next(line for line in output.splitlines() if line.startswith("resume with: "))
    assert shlex.split(command.removeprefix("resume with: ")) == [
        "yolo11-lightning",
        *args,
        "--ckpt_path",
        str(kept),
    ]
    assert position(load(kept)) == 2
    assert_resumes_to_the_uninterrupted_run(tmp_path, uninterrupted, tiny_dataset)


def test_a_second_ctrl_c_stops_at_once(tiny_dataset: Path, tmp_path: Path) -> None:
    """The first Ctrl-C asks for a save at the next optimiser step; a second one before it ends the run there and
    then, exit 130, nothing saved, loader workers gone (the output pipe closes)."""
    slow = ["--trainer.callbacks+=fault_callbacks.SlowBatches", "--trainer.callbacks.seconds", "3"]
    proc = start_training(
        fit_args(tiny_dataset, tmp_path, "rec", *NO_STEP_SAVES, *WORKERS, *slow), cwd=tmp_path
    )
    signal_after(
        proc, tmp_path / "rec", 1, signal.SIGINT, ranks=[0]
    )  # batch 1 of the step's 2, then 3 s asleep
    time.sleep(0.5)  # two signals at once would reach Python's handler as one
    proc.send_signal(signal.SIGINT)
    code, output = finish(proc, timeout=GRACE_SECONDS)
    assert code == 130, output[-6000:]
    assert (
        "second Ctrl-C: stopped at once, nothing saved" in output and "stopped at global step" not in output
    )
    assert not list(tmp_path.glob("lightning_logs/*/checkpoints/last*.ckpt"))


def _launched_rank(parent: int) -> int | None:
    """The pid of the rank ``parent`` launched: its child running the same command (not, say, ``git``)."""
    try:
        children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
        for child in children:
            if b"yolo11_lightning" in Path(f"/proc/{child}/cmdline").read_bytes():
                return int(child)
    except OSError:
        pass
    return None


def _ended(pid: int) -> bool:
    """Whether ``pid`` is gone or a zombie (ended; its new parent may not reap it at once)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_sigterm_while_the_ranks_start_ends_every_rank(tiny_dataset: Path, tmp_path: Path) -> None:
    """SIGTERM to the launching process at a random moment of the first seconds after it launched rank 1 (while
    the ranks meet, read their data, build the model): it exits 143 and takes rank 1 with it. Killed where it
    stood, it left rank 1 connecting to a store that was gone, for the process group's whole timeout."""
    seed = random.randrange(1 << 30)
    delay = random.Random(seed).uniform(0.0, 3.0)
    print(f"SIGTERM {delay:.2f} s after rank 1 started, seed {seed}")
    # Output to a file: a rank left behind would hold a pipe open. The collective timeout is one a forgotten rank
    # would wait out longer than this test may take.
    log = tmp_path / "output.txt"
    args = fit_args(tiny_dataset, tmp_path, "rec", *ddp("0:05:00"))
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "yolo11_lightning", *args], cwd=tmp_path, env=cli_env(), stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    deadline = time.monotonic() + 120
    while (rank1 := _launched_rank(proc.pid)) is None:
        assert proc.poll() is None, log.read_text()[-6000:]
        assert time.monotonic() < deadline, "rank 1 was never launched"
        time.sleep(0.01)
    time.sleep(delay)
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    deadline = time.monotonic() + 20
    while not _ended(rank1) and time.monotonic() < deadline:
        time.sleep(0.05)
    left_behind = not _ended(rank1)
    if left_behind:
        os.kill(rank1, signal.SIGKILL)
    output = log.read_text()
    assert code == 143, output[-6000:]
    assert not left_behind, f"rank 1 (pid {rank1}) outlived the process that launched it:\n{output[-4000:]}"
    # Before training: said so; once training started the usual stop saved its step instead.
    assert (
        "stopped by SIGTERM before training started: nothing to save" in output
        or "received SIGTERM" in output
    )
