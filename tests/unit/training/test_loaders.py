"""The DataModule's loaders: forked workers keep the training process's objects shared."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from yolo11_lightning.training.loading.loaders import make_loader


class _WorkerUSS(Dataset):
    """Each sample: this process's unique memory (MiB, ``smaps_rollup``) after a full garbage collection."""

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> float:
        gc.collect()
        fields = dict(
            line.split(":") for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]
        )
        return sum(int(fields[k].split()[0]) for k in ("Private_Clean", "Private_Dirty")) / 1024


def _worker_uss(loader: DataLoader) -> float:
    return float(next(iter(loader))[0])


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="Linux /proc only")
def test_a_workers_garbage_collection_leaves_the_parents_objects_shared() -> None:
    """A full collection in a forked worker writes to every object it examines, copying the pages of all the
    parent's objects (here 400k small lists, ~40 MiB; in training the modules and the model); objects frozen
    before the fork stay shared. A plain DataLoader's worker copies them."""
    # Garbage of earlier tests in this process goes here, not in a worker: a forked child that frees an
    # onnxruntime session joins its thread pool, whose threads the child does not have, and hangs.
    gc.collect()
    parents = [[i] for i in range(400_000)]
    sampler = torch.utils.data.SequentialSampler(range(1))
    ours = _worker_uss(make_loader(_WorkerUSS(), sampler, 1, 1, False, False, lambda batch: batch))
    plain = _worker_uss(DataLoader(_WorkerUSS(), batch_size=1, num_workers=1, collate_fn=lambda batch: batch))
    assert gc.get_freeze_count() == 0  # the parent collects as before
    assert plain - ours > 25, (plain, ours)
    del parents
