"""Shared fixtures: a tiny synthetic dataset made once per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# The oracle reaches for the network unless told not to; W&B must never leave the machine in tests.
os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
# As the ``yolo11-lightning`` command does (``training.cpu_threads.spin_briefly``), before anything imports torch:
# OpenMP threads that wait sleep after a brief spin. With torch's default spin, in-process runs beside the
# suite's other worker, DDP ranks or loader workers were 25x slower (a 48 s fixture took 1,227 s under load).
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "1000")


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """16 train / 7 val images of 64 px, 3 classes; returns the dataset yaml.

    7 validation images: a count that does not divide by 2 ranks.
    """
    from yolo11_lightning.synthetic.shapes import make_synthetic_dataset

    root = tmp_path_factory.mktemp("tiny_synthetic")
    return make_synthetic_dataset(root, num_train=16, num_val=7, image_size=64, num_classes=3, seed=0)


@pytest.fixture(scope="session")
def uninterrupted(tiny_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``tests/helpers/scripts/tiny_fit.yaml`` on 1 rank, start to end (4 optimiser steps over 2 epochs), through the CLI
    (in this process, on 1 thread: ``cli_runs.fit_here``) with ``--ckpt_path last`` and nothing to resume; keeps
    its step-3 checkpoint (``at-step=3.ckpt``) too.

    The reference every resume, preemption and fault test compares its final state with.
    """
    from cli_runs import fit_args, fit_here

    root = tmp_path_factory.mktemp("uninterrupted")
    keep_step = [
        "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
        "--trainer.callbacks.every_n_train_steps", "3", "--trainer.callbacks.save_top_k", "-1",
        "--trainer.callbacks.filename", "at-{step}",
    ]  # fmt: skip
    said = fit_here(fit_args(tiny_dataset, root, "rec", "--ckpt_path", "last", *keep_step))
    assert "--ckpt_path last: no checkpoint yet, starting fresh" in said
    return root
