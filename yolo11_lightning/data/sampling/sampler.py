"""Samplers whose data order is defined globally, so any world size sees the same global batches.

Train (``ElasticDistributedSampler``): the epoch's order is a permutation drawn from ``(seed, epoch)``
only, padded to whole global batches. Rank r of R takes positions r, r + R, r + 2R, ...; with per-rank
batch B / R, the ranks' i-th batches together are exactly positions [i*B, (i+1)*B) of the global order,
for every R. A resume therefore only needs "how many global samples of this epoch were consumed", and
may happen on another world size: no sample skipped, none repeated.

Eval (``ShardedEvalSampler``): rank r takes positions r, r + R, ... of the evaluation order (the indices
in turn, or the aspect-ratio order of rectangular batches) without padding duplicates, so the union over
ranks is every index exactly once and distributed mAP equals single-process mAP.

Both subclass ``torch.utils.data.DistributedSampler`` so Lightning leaves them in place instead of
injecting its own; ``num_replicas`` and ``rank`` are passed explicitly, no process group is needed.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Sized
from typing import Any

import numpy as np
from torch.utils.data import DistributedSampler

from yolo11_lightning.data.sampling.shard_windows import ShardWindows

# First entropy word of the generator that draws the epoch order. The Dataset's per-sample generators
# use another tag, so no (seed, epoch, index) can ever coincide with the order's generator.
ORDER_STREAM = 0
GLOBAL_ORDER = "global"  # a checkpoint's name of the order of all samples (``ShardWindows.name`` the other)


def epoch_order(
    num_samples: int, seed: int, epoch: int, global_batch_size: int, windows: ShardWindows | None = None
) -> np.ndarray:
    """The global order of dataset indices for one epoch, padded to whole global batches.

    A permutation drawn from ``(seed, epoch)`` only: of all samples, or shard-aware (``windows``: shards
    shuffled, samples shuffled within windows of shards; ``shard_windows``). Padding: when ``num_samples`` is not a multiple of
    the global batch size, the permutation is wrapped around (its first indices repeated) to fill the
    last global batch. We pad rather than drop so every image is seen every epoch, even when the dataset
    is smaller than one global batch (drop would leave zero batches); a few images are seen twice.

    Returns:
        (ceil(num_samples / global_batch_size) * global_batch_size,) int64.
    """
    if num_samples <= 0:
        raise ValueError("cannot order an empty dataset")
    rng = np.random.default_rng([ORDER_STREAM, seed, epoch])
    perm = rng.permutation(num_samples) if windows is None else windows.permutation(rng)
    if len(perm) != num_samples:
        raise ValueError(f"the shard order covers {len(perm)} samples, the dataset has {num_samples}")
    total = math.ceil(num_samples / global_batch_size) * global_batch_size
    return np.resize(perm, total).astype(np.int64)  # np.resize repeats the array cyclically


class ElasticDistributedSampler(DistributedSampler):
    """Training sampler: world-size-invariant global batches, resumable mid-epoch on any world size.

    Yields ``(epoch, index)`` tuples: the Dataset seeds each sample's augmentation from them.

    Args:
        dataset: anything with ``len()``.
        global_batch_size: B, samples per optimiser step over all ranks; must divide by num_replicas.
        num_replicas: world size R.
        rank: this process's global rank.
        seed: seed of the epoch orders (and, in the Dataset, of the augmentation).
        windows: the shard-aware order of a shard folder (``shard_windows``), else None: a permutation of all
            samples. The Dataset's partner pools must use the same (``BoxDataset.shard_windows``).

    ``len(sampler)`` is the FULL per-rank epoch length, even after a mid-epoch resume: Lightning computes
    its batches per epoch from ``len(dataloader)`` once per fit, and on a mid-epoch restart counts the
    restored batches as done, so it expects the full figure while the iterator yields only the rest
    (``remaining()``). A shorter ``len`` would cut every later epoch short.
    """

    def __init__(
        self,
        dataset: Sized,
        global_batch_size: int,
        num_replicas: int = 1,
        rank: int = 0,
        seed: int = 0,
        windows: ShardWindows | None = None,
    ) -> None:
        if global_batch_size <= 0 or global_batch_size % num_replicas:
            raise ValueError(
                f"global batch size {global_batch_size} must be a positive multiple of the world size "
                f"{num_replicas} (per-device batch = global / world size)"
            )
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed)
        self.global_batch_size = global_batch_size
        self.windows = windows
        self.consumed_samples = 0
        self.total_size = math.ceil(len(dataset) / global_batch_size) * global_batch_size
        self.num_samples = self.total_size // num_replicas

    # ------------------------------------------------------------------------------------ progress
    def set_epoch(self, epoch: int) -> None:
        """Select the epoch; a different epoch than the current one starts at its beginning."""
        if epoch != self.epoch:
            self.consumed_samples = 0
        self.epoch = epoch

    def set_consumed_samples(self, consumed: int) -> None:
        """Record that ``consumed`` GLOBAL samples of the current epoch are done (whole global batches)."""
        if consumed < 0 or consumed % self.global_batch_size or consumed > self.total_size:
            raise ValueError(
                f"consumed samples {consumed} must be a multiple of the global batch size "
                f"{self.global_batch_size} in [0, {self.total_size}]"
            )
        self.consumed_samples = consumed

    def remaining(self) -> int:
        """Samples this rank will yield in the next ``__iter__``."""
        return (self.total_size - self.consumed_samples) // self.num_replicas

    @property
    def order_name(self) -> str:
        """The order policy as a checkpoint names it: ``global`` or ``shards/<window>``."""
        return GLOBAL_ORDER if self.windows is None else self.windows.name

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "epoch": self.epoch, "consumed_samples": self.consumed_samples, "seed": self.seed,
            "num_samples": len(self.dataset),
        }  # fmt: skip
        if self.windows is not None:
            state["order"] = self.order_name
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()``, possibly saved with another world size (same global batch).

        The epoch order is a permutation of the dataset's indices: when the training set changed size since
        the save (files deleted or added, so the label cache was rebuilt), a mid-epoch position points into an
        order that no longer exists. Then the epoch restarts from its beginning, with a warning: samples of it
        trained before the save are seen again, none is skipped.
        """
        if int(state["seed"]) != self.seed:
            raise ValueError(
                f"sampler state was saved with seed {state['seed']} but this run uses seed {self.seed}; "
                "the data order would not continue"
            )
        if state.get("order", GLOBAL_ORDER) != self.order_name:
            raise ValueError(
                f"sampler state was saved with the order {state.get('order', GLOBAL_ORDER)!r} but this run uses "
                f"{self.order_name!r} (data.shard_window and the dataset must be the saved run's); the data order "
                "would not continue"
            )
        self.epoch = int(state["epoch"])
        consumed = int(state["consumed_samples"])
        saved_size = state.get("num_samples")  # None: the saved size is unknown, taken as this dataset's
        if saved_size is not None and int(saved_size) != len(self.dataset):
            saved_total = math.ceil(int(saved_size) / self.global_batch_size) * self.global_batch_size
            if consumed == saved_total:  # saved at an epoch end: the next epoch simply uses the new size
                consumed = self.total_size
            elif consumed:
                warnings.warn(
                    f"the training set has {len(self.dataset)} images but the checkpoint was saved with "
                    f"{saved_size}: its position {consumed} samples into epoch {self.epoch} belongs to an order "
                    "that no longer exists, so this epoch restarts from its first batch (some of its samples are "
                    "seen twice, none is skipped). Restore the missing files to resume exactly.",
                    stacklevel=2,
                )
                consumed = 0
        self.set_consumed_samples(consumed)
        if self.consumed_samples == self.total_size:
            # A finished epoch (end-of-epoch checkpoint): what comes next is the start of the following one.
            # Lightning creates the iterator before it calls set_epoch, so this must already be right.
            self.epoch, self.consumed_samples = self.epoch + 1, 0

    # ------------------------------------------------------------------------------------ iteration
    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch, start = self.epoch, self.consumed_samples
        # The position is consumed by this iteration; the following one (next epoch) starts at 0.
        # Mid-epoch checkpoints set the true progress with set_consumed_samples before saving.
        self.consumed_samples = 0
        order = epoch_order(len(self.dataset), self.seed, epoch, self.global_batch_size, self.windows)
        for index in order[start + self.rank :: self.num_replicas].tolist():
            yield epoch, index

    def __len__(self) -> int:
        return self.num_samples


class ShardedEvalSampler(DistributedSampler):
    """Evaluation sampler: rank r takes positions r, r + R, ... of ``order``; no padding, so ranks may differ by one.

    ``order`` (default: 0, 1, ..., n - 1) is a permutation of the dataset's indices. For rectangular
    batches it is the aspect-ratio order whose consecutive groups of the GLOBAL batch B share one shape
    (``BoxDataset.set_rect_batches``): with R dividing B, rank r's per-device batches of B / R are
    exactly its positions in one group each, so every batch has a single shape on any world size and
    each image gets the same shape, hence the same detections, as in one process. Unequal lengths are
    safe as long as the evaluation step runs no collective per batch (metrics sync once at the end).
    """

    def __init__(
        self, dataset: Sized, num_replicas: int = 1, rank: int = 0, order: np.ndarray | None = None
    ) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False)
        n = len(dataset)
        if order is not None and (len(order) != n or not np.array_equal(np.sort(order), np.arange(n))):
            raise ValueError(f"the evaluation order must be a permutation of the {n} dataset indices")
        self.order = None if order is None else np.asarray(order, np.int64)
        self.num_samples = len(range(rank, n, num_replicas))
        self.total_size = n

    def __iter__(self) -> Iterator[int]:
        positions = range(self.rank, len(self.dataset), self.num_replicas)
        if self.order is None:
            return iter(positions)
        return iter(self.order[self.rank :: self.num_replicas].tolist())

    def __len__(self) -> int:
        return self.num_samples
