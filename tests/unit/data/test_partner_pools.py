"""Mosaic partner pools (``data.sampling.partner_pools``): where partners come from, and what each mode decodes.

The ``"recent"`` pools must (1) lie in per-device batches the sample's own DataLoader worker has already
decoded, for any worker count dividing ``RECENT_SPACING`` and any world size dividing the partner stride,
(2) give the same samples for any worker count (dividing or not), and (3) through a real DataLoader with
worker processes, decode each image about once per epoch (more in the epoch's first batches, whose pools
wrap to its end), where whole-set partners decode about 4 times.
"""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from yolo11_lightning.data.dataset import BoxDataset
from yolo11_lightning.data.sampling.partner_pools import (
    RECENT_BATCHES,
    RECENT_SPACING,
    dataset_options,
    pool_positions,
    recent_decode_cache_size,
)
from yolo11_lightning.data.sampling.sampler import ElasticDistributedSampler
from yolo11_lightning.data.sampling.seeds import partner_stride
from yolo11_lightning.structures.batch import collate_detection
from yolo11_lightning.structures.records import ImageRecord

SIZE = 64


def test_pool_positions_span_the_batch_and_three_earlier_ones_eight_apart_cyclically():
    batch, stride, epoch = 32, 2, 40  # 40 global batches in the epoch
    late = 30 * batch + 5  # global batch 30, offset 5 -> positions = 1 (mod 2) of batches 30, 22, 14, 6
    positions = pool_positions(late, batch, stride, RECENT_BATCHES, epoch)
    assert late in positions and len(positions) == RECENT_BATCHES * batch // stride
    assert sorted({int(p) // batch for p in positions}) == [6, 14, 22, 30]
    assert all(p % stride == late % stride for p in positions)
    early = pool_positions(9 * batch + 4, batch, stride, RECENT_BATCHES, epoch)  # 9, 1, then the epoch's end
    assert sorted({int(p) // batch for p in early}) == [1, 9, 25, 33]
    assert len(early) == len(positions), "every sample's pool is as large, at the start of an epoch too"
    small = pool_positions(1 * batch, batch, stride, RECENT_BATCHES, 10)  # 1, 3 (= 1 - 8 + 10), 5, 7
    assert sorted({int(p) // batch for p in small}) == [1, 3, 5, 7]
    # 16 batches: 8 apart they would be only 2 (b - 16 is b), so 4 apart: a pool still spans 4 batches
    short = pool_positions(9 * batch + 4, batch, stride, RECENT_BATCHES, 16)
    assert sorted({int(p) // batch for p in short}) == [1, 5, 9, 13] and len(short) == len(positions)
    tiny = pool_positions(1 * batch, batch, stride, RECENT_BATCHES, 4)  # 4 batches: the epoch is one pool
    assert sorted({int(p) // batch for p in tiny}) == [0, 1, 2, 3] and len(tiny) == len(positions)
    pair = pool_positions(1 * batch, batch, stride, RECENT_BATCHES, 2)  # fewer batches than a pool spans
    assert sorted({int(p) // batch for p in pair}) == [0, 1] and len(pair) == 2 * batch // stride
    np.testing.assert_array_equal(
        pool_positions(late, batch, stride, 1, epoch), np.arange(30 * batch + 1, 31 * batch, 2)
    )


@pytest.mark.parametrize(("global_batch", "world"), [(16, 1), (64, 2), (64, 4), (128, 8)])
@pytest.mark.parametrize("workers", [1, 2, 4, 8])
def test_recent_pools_lie_in_batches_the_same_worker_decoded_before(global_batch, world, workers):
    n = 4000  # 32+ global batches; not a multiple of the batch: the padded end is covered too
    records = [ImageRecord(f"/nowhere/{i}.jpg", 10, 10) for i in range(n)]  # pools need no pixels
    dataset = BoxDataset(
        records, SIZE, augment=True, seed=4, global_batch_size=global_batch, partner_batches=RECENT_BATCHES
    )
    assert partner_stride(global_batch) % world == 0
    per_rank = global_batch // world
    for rank in range(world):
        sampler = ElasticDistributedSampler(range(n), global_batch, num_replicas=world, rank=rank, seed=4)
        sampler.set_epoch(3)
        items = [i for _, i in sampler]
        batches = [items[b : b + per_rank] for b in range(0, len(items), per_rank)]
        on_rank = set(items)
        seen: list[set[int]] = [set() for _ in range(workers)]  # what each worker has decoded so far
        first_position = {}
        for j, batch in enumerate(batches):
            for i in batch:
                first_position.setdefault(i, j)
            worker = j % workers  # the DataLoader's round robin
            seen[worker] |= set(batch)
            for i in batch:
                if first_position[i] != j:  # a padding repeat: its pool is that of its first position
                    continue
                pool = set(dataset.partner_pool(3, i).tolist())
                assert i in pool and pool <= on_rank, "a partner lives on another rank"
                assert len(pool) == RECENT_BATCHES * min(16, global_batch)
                if j >= (RECENT_BATCHES - 1) * RECENT_SPACING:  # earlier ones wrap to the epoch's end
                    assert pool <= seen[worker], f"batch {j}: a partner this worker has not decoded"


def test_decode_cache_fits_the_pools_of_every_worker_count():
    assert recent_decode_cache_size(16, 0) == recent_decode_cache_size(16, 1) == (24 + 2) * 16
    assert recent_decode_cache_size(16, 8) == (3 + 2) * 16
    assert recent_decode_cache_size(512, 1) == 1024  # capped


class CountingDataset(BoxDataset):
    """Decodes nothing: a flat image per index, each "decode" counted in a counter shared by workers."""

    def __init__(self, *args, counter, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.counter = counter

    def _read(self, path: str, height: int, width: int) -> tuple[np.ndarray, int]:
        with self.counter.get_lock():
            self.counter.value += 1
        index = int(path.rsplit("/", 1)[1].split(".")[0])
        return np.full((height, width, 3), index % 251, np.uint8), 1


def run_epoch(mode: str, workers: int, n: int = 800, batch: int = 8) -> tuple[float, list[torch.Tensor]]:
    """Decodes per sample over one epoch through a real DataLoader, and the batches' images."""
    context = multiprocessing.get_context("fork")
    counter = context.Value("i", 0)
    records = [
        ImageRecord(f"/nowhere/{i}.jpg", 48 + i % 17, 64, [i % 3], [[0.5, 0.5, 0.4, 0.4]]) for i in range(n)
    ]
    options = dataset_options(mode, batch, batch, workers)
    dataset = CountingDataset(records, SIZE, augment=True, seed=1, counter=counter, **options)
    sampler = ElasticDistributedSampler(dataset, batch, num_replicas=1, rank=0, seed=1)
    sampler.set_epoch(2)
    loader = DataLoader(
        dataset, batch_size=batch, sampler=sampler, num_workers=workers, collate_fn=collate_detection,
        multiprocessing_context=context if workers else None,
    )  # fmt: skip
    images = [b["images"] for b in loader]
    return counter.value / n, images


def test_recent_partners_decode_each_image_once_and_give_the_same_samples_for_any_worker_count():
    decodes = {}
    reference: list[torch.Tensor] | None = None
    for workers in (0, 2, 3):
        decodes[workers], images = run_epoch("recent", workers)
        if reference is None:
            reference = images
        assert len(images) == len(reference)
        assert all(torch.equal(a, b) for a, b in zip(images, reference)), (
            f"{workers} workers changed a sample"
        )
    # 100 batches: only the first 24 (whose earlier batches wrap to the epoch's end) decode partners again.
    wrapped = 3 * (RECENT_BATCHES - 1) * RECENT_SPACING / 100
    assert decodes[0] == decodes[2] and 1.0 < decodes[0] < 1.0 + wrapped, decodes
    assert decodes[3] > decodes[2], decodes  # 3 does not divide 8: same samples, more partners decoded again
    whole_set, _ = run_epoch("dataset", 2)
    in_batch, _ = run_epoch("batch", 2)
    assert in_batch == 1.0 and whole_set > 3.0, (in_batch, whole_set)
