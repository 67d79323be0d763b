"""Shared fixtures: a tiny synthetic dataset made once per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# The oracle reaches for the network unless told not to; W&B must never leave the machine in tests.
os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """16 train / 7 val images of 64 px, 3 classes; returns the dataset yaml.

    7 validation images: a count that does not divide by 2 ranks.
    """
    from yolo11_lightning.data.synthetic import make_synthetic_dataset

    root = tmp_path_factory.mktemp("tiny_synthetic")
    return make_synthetic_dataset(root, num_train=16, num_val=7, image_size=64, num_classes=3, seed=0)
