"""Helpers for tests that run the real CLI in subprocesses (1 or 2 gloo ranks, torchrun) and read what
``tests/helpers/scripts/fault_callbacks.py`` recorded."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

# Lightning gives its logger a stream handler bound to the sys.stderr of the moment it is first imported. Imported
# here, at collection, that is pytest's session stream, not the stream of a test's capsys that closes after it (whose
# handler would print "--- Logging error ---" tracebacks into every later in-process run's stderr).
import lightning.pytorch  # noqa: F401
import numpy as np
import torch

from yolo11_lightning.data.sampling.sampler import epoch_order

HELPERS = Path(__file__).resolve().parent
REPO = HELPERS.parents[1]
SCRIPTS = HELPERS / "scripts"
TINY_FIT = SCRIPTS / "tiny_fit.yaml"


# tests/helpers/scripts/tiny_fit.yaml on tests/conftest.py's tiny_dataset: 16 images, global batch 4 (4 batches per epoch,
# 2 per optimiser step), 2 epochs, data seed 0.
EPOCHS, BATCH, IMAGES, SEED = 2, 4, 16, 0


def expected_order(policy: object | None = None) -> list[int]:
    """The global sample order of the uninterrupted tiny run, epoch after epoch (``policy``: a shard folder's
    ``ShardWindows``; None: a folder's full shuffle)."""
    return np.concatenate([epoch_order(IMAGES, SEED, e, BATCH, policy) for e in range(EPOCHS)]).tolist()


def flatten(batches: dict[tuple[int, int], list[int]]) -> list[int]:
    return [i for key in sorted(batches) for i in batches[key]]


def start_of(rows: list[dict], attempt: int = 0) -> list[dict]:
    return [r for r in rows if r["event"] == "start" and r["attempt"] == attempt]


def cli_env(**extra: str) -> dict[str, str]:
    """One thread per rank, the test callbacks importable, torchrun with a rendezvous store per attempt."""
    path = os.pathsep.join(p for p in (str(SCRIPTS), os.environ.get("PYTHONPATH", "")) if p)
    return {
        **os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": path,
        "WANDB_MODE": "offline", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", **extra,
    }  # fmt: skip


def fit_args(dataset: Path, root: Path, record: str, *extra: str) -> list[str]:
    """``fit`` on the tiny config, writing under ``root`` and recording into ``root/<record>``."""
    return [
        "fit", "--config", str(TINY_FIT), "--data.dataset", str(dataset),
        "--trainer.default_root_dir", str(root),
        "--trainer.callbacks+=fault_callbacks.RecordSamples", "--trainer.callbacks.out_dir", str(root / record),
        *extra,
    ]  # fmt: skip


def ddp(timeout: str = "0:00:30") -> list[str]:
    """2 gloo ranks through Lightning's own launcher, with a short collective timeout."""
    return [
        "--trainer.devices", "2", "--trainer.strategy", "lightning.pytorch.strategies.DDPStrategy",
        "--trainer.strategy.timeout", timeout,
    ]  # fmt: skip


def run(command: Sequence[str], cwd: Path, timeout: float = 240, **env: str) -> subprocess.CompletedProcess:
    """Run ``command``; a hang fails the test through ``timeout`` instead of stalling the suite."""
    return subprocess.run(
        list(command), cwd=cwd, env=cli_env(**env), capture_output=True, text=True, timeout=timeout
    )


def run_cli(args: Sequence[str], cwd: Path, timeout: float = 240, **env: str) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "yolo11_lightning", *args], cwd, timeout, **env)


class _Said(logging.Handler):
    """Keeps the messages of Lightning's loggers (whose stream handler an earlier in-process run may own)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def fit_here(args: Sequence[str]) -> str:
    """``fit`` through the CLI's ``main`` in this process, on 1 torch thread (as ``cli_env`` gives a subprocess, so
    the run's numbers are a subprocess's), with ``SCRIPTS`` importable; asserts exit 0, returns what Lightning's
    loggers said. For runs that no signal, exit status or second rank is asked of: no interpreter start (~6 s)."""
    from yolo11_lightning.cli.main import main

    said, lightning = _Said(), logging.getLogger("lightning.pytorch")
    lightning.addHandler(said)
    sys.path.insert(0, str(SCRIPTS))
    try:
        assert main([*args, "--machine.cpu_threads", "1"]) == 0
    finally:
        sys.path.remove(str(SCRIPTS))
        lightning.removeHandler(said)
    return "\n".join(said.messages)


def shell_here(args: Sequence[str]) -> int:
    """The command as the shell gives it to ``main`` (no argument: ``main`` and LightningCLI read ``sys.argv``),
    in this process on 1 torch thread with ``SCRIPTS`` importable; returns the exit code. For runs whose checks are
    the shell path's messages and files, not anything of a process (a signal, an exit status, a fresh start)."""
    from yolo11_lightning.cli.main import main

    argv = sys.argv
    sys.argv = ["yolo11-lightning", *args, "--machine.cpu_threads", "1"]
    sys.path.insert(0, str(SCRIPTS))
    try:
        return main()
    finally:
        sys.path.remove(str(SCRIPTS))
        sys.argv = argv


def tail(proc: subprocess.CompletedProcess, chars: int = 6000) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-chars:]}\n--- stderr\n{proc.stderr[-chars:]}"


def records(folder: Path) -> list[dict]:
    """Every record of every rank (and torchrun attempt) in ``folder``."""
    rows = []
    for path in sorted(folder.glob("rank*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines()]
    return rows


def global_batches(rows: list[dict], attempt: int | None = None) -> dict[tuple[int, int], list[int]]:
    """``(epoch, batch_idx) -> the global batch's sample ids``, rebuilt from the ranks' shards.

    Rank r of R holds positions r, r + R, ... of each global batch (strided sharding): interleaving the
    ranks' ids gives the global batch in order. Every rank must have recorded the batch, once.
    """
    shards: dict[tuple[int, int], dict[int, list[int]]] = {}
    worlds: dict[tuple[int, int], int] = {}
    for r in rows:
        if r["event"] != "batch" or (attempt is not None and r["attempt"] != attempt):
            continue
        key = (r["epoch"], r["batch_idx"])
        assert r["rank"] not in shards.get(key, {}), f"batch {key} recorded twice by rank {r['rank']}"
        shards.setdefault(key, {})[r["rank"]] = r["indices"]
        worlds[key] = r["world"]
    batches = {}
    for key, by_rank in shards.items():
        assert sorted(by_rank) == list(range(worlds[key])), f"batch {key}: ranks {sorted(by_rank)}"
        merged = [0] * sum(len(ids) for ids in by_rank.values())
        for rank, ids in by_rank.items():
            merged[rank :: worlds[key]] = ids
        batches[key] = merged
    return batches


def final_checkpoint(root: Path) -> Path:
    """The newest ``last*.ckpt`` under ``root`` (what ``--ckpt_path last`` would pick)."""
    found = sorted(root.glob("lightning_logs/*/checkpoints/last*.ckpt"), key=lambda p: p.stat().st_mtime_ns)
    assert found, f"no last*.ckpt under {root}"
    return found[-1]


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


NEGLIGIBLE = 1e-4  # the smallest scale a tensor is compared at (``max_relative_difference``)


def max_relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> tuple[float, str]:
    """Largest ``max|a - b| / max|a|`` over the float tensors (each tensor against its own scale, at least
    ``NEGLIGIBLE``: a tensor still numerically zero, e.g. a BatchNorm bias at 1e-12 or the biases of an OBB head's
    angle branch in its first steps (1e-15 to 1e-8: the angle barely moves a near-square box's probiou), differs
    by float-reduction noise that is large against its own scale)."""
    assert a.keys() == b.keys(), set(a) ^ set(b)
    worst, name = 0.0, ""
    for key, x in a.items():
        if torch.is_tensor(x) and x.is_floating_point():
            rel = float((x - b[key]).abs().max() / x.abs().max().clamp(min=NEGLIGIBLE))
            if rel > worst:
                worst, name = rel, key
    return worst, name


def momentum(checkpoint: dict) -> dict[str, torch.Tensor]:
    state = checkpoint["optimizer_states"][0]["state"]
    return {str(i): s["momentum_buffer"] for i, s in state.items()}


def assert_same_training_state(expected: dict, actual: dict, rel: float = 1e-5) -> None:
    """Same step, epoch, data position, skip counter; weights, EMA and momentum within ``rel`` of scale."""
    for key in ("global_step", "epoch", "YOLODataModule", "nonfinite_steps"):
        assert actual[key] == expected[key], f"{key}: {actual[key]} != {expected[key]}"
    assert actual["callbacks"]["ModelEMA"] == expected["callbacks"]["ModelEMA"]
    assert int(actual["averaging_state"]["n_averaged"]) == int(expected["averaging_state"]["n_averaged"])
    groups = [(g["lr"], g["momentum"]) for g in expected["optimizer_states"][0]["param_groups"]]
    assert [(g["lr"], g["momentum"]) for g in actual["optimizer_states"][0]["param_groups"]] == groups
    for what, get in (
        ("EMA weights (state_dict)", lambda c: c["state_dict"]),
        ("raw weights", lambda c: c["current_model_state"]),
        ("SGD momentum", momentum),
    ):
        worst, name = max_relative_difference(get(expected), get(actual))
        assert worst <= rel, f"{what}: {name} differs by {worst:.3g} of its scale (limit {rel})"


CUT = (1, 2)  # runs are cut when epoch 1, batch 2 starts: after optimiser step 3, mid-epoch
STEP_AT_CUT = 3


def check_resume_two_ranks_to_one(
    dataset: Path,
    uninterrupted: Path,
    root: Path,
    *extra: str,
    rel: float = 1e-5,
    order: list[int] | None = None,
) -> dict:
    """2 ranks cut at ``CUT`` (``StopAt``, exit 75), then ``fit --ckpt_path last`` on 1 rank (a new logger
    version, in this process) finishes the run; asserts the resumed start, that the global sample order (``order``,
    default a folder's ``expected_order()``) was trained exactly once, and that the final state is the
    uninterrupted run's (within ``rel`` of each tensor's scale). ``extra``: more CLI arguments for both runs.
    Returns the resumed run's final checkpoint."""
    cut = [
        "--trainer.callbacks+=fault_callbacks.StopAt",
        "--trainer.callbacks.epoch", str(CUT[0]), "--trainer.callbacks.batch_idx", str(CUT[1]),
    ]  # fmt: skip
    first = run_cli(fit_args(dataset, root, "rec-2", "--ckpt_path", "last", *extra, *ddp(), *cut), cwd=root)
    assert first.returncode == 75, tail(first)  # StopAt.EXIT_CODE: ended abruptly right after step 3

    # 1 rank: no process of its own needed
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        said = fit_here(fit_args(dataset, root, "rec-1", "--ckpt_path", "last", *extra))
    # The sampler's position came back: Lightning's "resuming ... your dataloader is not resumable" is not true here.
    assert not [w for w in caught if "dataloader is not resumable" in str(w.message)]
    # Lightning alone would look in the new version_1 folder, find nothing and start over.
    assert re.search(r"--ckpt_path last: resuming from \S*version_0\S*last\S*\.ckpt", said), said[-3000:]
    (start,) = start_of(records(root / "rec-1"))
    assert (start["world"], start["global_step"], start["epoch"]) == (1, STEP_AT_CUT, CUT[0])

    before, after = global_batches(records(root / "rec-2")), global_batches(records(root / "rec-1"))
    assert set(before).isdisjoint(after), "a batch was trained twice"
    assert flatten({**before, **after}) == (expected_order() if order is None else order)
    final = load(final_checkpoint(root))
    assert_same_training_state(load(final_checkpoint(uninterrupted)), final, rel)
    return final
