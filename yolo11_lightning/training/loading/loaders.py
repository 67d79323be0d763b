"""Build the DataModule's DataLoaders: workers, page-locked batches, the task's collate."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from yolo11_lightning.data.loader_workers import ignore_stop_signals_in_worker, single_threaded_opencv


def on_accelerator(trainer: L.Trainer | None) -> bool:
    """Whether batches go to an accelerator (pinned host memory helps only there): the Trainer's device, or
    without a Trainer whether torch sees one."""
    if trainer is not None:
        return trainer.strategy.root_device.type != "cpu"
    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6
    return bool(accelerator.is_available()) if accelerator is not None else torch.cuda.is_available()


def _start_worker(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: stop signals left to the training process
    (``ignore_stop_signals_in_worker``), and the objects inherited from it frozen (``gc.freeze``).

    A forked worker shares the parent's memory pages until it writes to them, and the cyclic garbage collector
    writes to the header of every object it examines: a worker's first full collection would copy every page
    holding one of the parent's objects (the modules of torch, Lightning and the rest, the model: about 100 MiB
    of a CPU run's training process). Frozen objects are skipped by the collector, so they stay shared, and
    garbage the parent left is never freed in the worker (freeing an onnxruntime session there would join
    threads the fork did not copy).
    """
    ignore_stop_signals_in_worker(worker_id)
    gc.freeze()


def make_loader(
    dataset: Dataset,
    sampler: Sampler,
    batch_size: int,
    num_workers: int,
    pin_memory: bool,
    persistent_workers: bool,
    collate_fn: Callable[[list[Any]], Any],
) -> DataLoader:
    """A DataLoader over ``dataset`` in ``sampler``'s order; workers ignore stop signals, run OpenCV on one
    thread and keep the training process's objects frozen (``_start_worker``)."""
    if num_workers > 0:
        single_threaded_opencv()
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,  # a DistributedSampler: Lightning keeps it instead of injecting its own
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=persistent_workers and num_workers > 0,
        collate_fn=collate_fn,
        # Stop signals are the training process's to handle (it saves, then the workers end with it).
        worker_init_fn=_start_worker if num_workers > 0 else None,
    )
