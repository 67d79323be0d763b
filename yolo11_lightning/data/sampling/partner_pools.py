"""Where a training sample's mosaic (and mixup) partners come from: the three ``mosaic_partners`` modes.

A partner pool is a set of positions in the epoch's global order (``sampler.epoch_order``), so it is a
function of (seed, epoch, index) alone: any number of workers, ranks or restarts gives the same samples.
Where the pool lies decides how many images a DataLoader worker decodes per sample (without
``cache_images``):

* ``"dataset"``: any training image. The most diverse mosaics, up to 4 decodes per sample (the partners
  are rarely in the worker's decode cache). The default from 2026-12-01 until ``"recent"`` was measured.
* ``"batch"``: positions of the sample's own global batch, congruent to its position modulo
  ``partner_stride(B)`` (``sampling.seeds``), so the pool lies on the sample's rank (world sizes dividing
  the stride) in its per-device batch, which the same worker decodes anyway: 1 decode per sample. But
  each image meets only the 15 others of its pool in an epoch; on the hard synthetic set at 50 epochs
  that cost a tenth of the mAP (``benchmarks/README.md``).
* ``"recent"`` (``YOLODataModule``'s default): the ``batch`` pool of the sample's global batch b and of the ``RECENT_BATCHES - 1``
  earlier global batches b - V, b - 2V, ... with V = ``RECENT_SPACING``, counted cyclically in the epoch
  (the first batches of an epoch take their earlier ones from its end), so every sample's partners come
  from 4 x 16 = 64 images or more, like the reference's buffer of recent images. Where batches V apart
  would meet themselves in a short epoch (16 batches: b - 16 is b), V shrinks to the largest power of two
  that keeps them distinct (``recent_spacing``); an epoch of ``RECENT_BATCHES`` batches or fewer is one
  pool. A DataLoader hands
  per-device batch j to worker j mod W, so for any worker count W dividing V those batches went through
  the same worker before: its decode cache holds them (``recent_decode_cache_size``) and it decodes 1
  image per sample, like ``"batch"``, except in the first (``RECENT_BATCHES`` - 1) x V batches of an
  epoch, whose wrapped partners are decoded once more (a few per mille of a COCO-sized epoch, most of an
  epoch of 25 batches). Other worker counts (3, 5, 6, ...) give the same samples and decode more.
"""

from __future__ import annotations

import numpy as np

MODES = ("recent", "dataset", "batch")  # the first is YOLODataModule's default
# Global batches a "recent" pool spans, and how far apart they lie in the epoch's order.
RECENT_BATCHES = 4
RECENT_SPACING = 8  # a multiple of the usual worker counts (1, 2, 4, 8): their pools stay in one worker
# Most decoded images a worker keeps for "recent" pools (about 1 MB each at 640 px).
MAX_RECENT_DECODE_CACHE = 1024


def recent_spacing(batches: int, num_batches: int) -> int:
    """Global batches between the batches of a pool: ``RECENT_SPACING``, or where ``batches`` batches that far
    apart would meet themselves in an epoch of ``num_batches`` (16 batches: b - 16 is b), the largest power of
    two below it that keeps them distinct (1 at least: an epoch of ``batches`` batches or fewer is one pool).
    A power of two, so worker counts dividing it still find the pool in their own decode cache."""
    wanted = min(batches, num_batches)
    spacing = RECENT_SPACING
    while spacing > 1 and len({k * spacing % num_batches for k in range(batches)}) < wanted:
        spacing //= 2
    return spacing


def pool_positions(
    position: int, global_batch: int, stride: int, batches: int, num_batches: int
) -> np.ndarray:
    """Positions in the epoch order of the partner pool of the sample at ``position``.

    Args:
        position: the sample's position in the epoch order.
        global_batch: B, samples per global batch.
        stride: ``partner_stride(B)``: the pool takes the positions congruent to ``position`` modulo it.
        batches: 1 (``"batch"``: the sample's global batch only) or ``RECENT_BATCHES`` (``"recent"``).
        num_batches: global batches in the epoch (earlier batches are counted cyclically among them).

    Returns:
        (k,) int64 positions, the sample's own batch first, ``position`` among them.
    """
    batch = position // global_batch
    offset = (position - batch * global_batch) % stride
    earlier = (batch - np.arange(batches) * recent_spacing(batches, num_batches)) % num_batches
    distinct = dict.fromkeys(earlier.tolist())  # an epoch of fewer than `batches` batches meets itself
    return np.concatenate(
        [np.arange(b * global_batch + offset, (b + 1) * global_batch, stride) for b in distinct]
    )


def recent_decode_cache_size(per_device_batch: int, num_workers: int) -> int:
    """Decoded images a worker must keep so that ``"recent"`` pools find their images decoded.

    A worker decodes one per-device batch in every ``W`` (W = ``num_workers``, 0 meaning the main
    process alone); the oldest batch of a pool lies ``(RECENT_BATCHES - 1) * RECENT_SPACING`` batches
    back, so it keeps that span's share of its batches plus the current one and one spare.
    """
    span = (RECENT_BATCHES - 1) * RECENT_SPACING
    own_batches = span // max(num_workers, 1) + 2
    return min(own_batches * per_device_batch, MAX_RECENT_DECODE_CACHE)


def workers_decoding_once(workers: int) -> int:
    """The most DataLoader workers, at most ``workers``, whose ``"recent"`` pools lie in their own decode
    cache (1 decode per sample): the largest divisor of ``RECENT_SPACING`` not above ``workers`` (0 stays 0)."""
    return max(
        (w for w in range(1, RECENT_SPACING + 1) if RECENT_SPACING % w == 0 and w <= workers), default=0
    )


def dataset_options(
    mode: str, global_batch: int, per_device_batch: int, num_workers: int
) -> dict[str, int | None]:
    """The ``BoxDataset`` arguments of a ``mosaic_partners`` mode (one of ``MODES``).

    Args:
        mode: ``"recent"``, ``"dataset"`` or ``"batch"``.
        global_batch: the sampler's global batch B.
        per_device_batch: B / world size, the images of one DataLoader batch.
        num_workers: DataLoader workers per device (sizes the ``"recent"`` decode cache).
    """
    if mode not in MODES:
        raise ValueError(f"mosaic_partners must be one of {MODES}, got {mode!r}")
    if mode == "dataset":
        return {"global_batch_size": None}
    if mode == "batch":
        return {"global_batch_size": global_batch}
    return {
        "global_batch_size": global_batch,
        "partner_batches": RECENT_BATCHES,
        "decode_cache_size": recent_decode_cache_size(per_device_batch, num_workers),
    }
