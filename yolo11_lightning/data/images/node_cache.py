"""One image cache per node: a file in ``/dev/shm`` memory-mapped by every local rank and DataLoader worker.

``attach_image_caches`` (called by every rank, after the ranks agreed on the data) builds one segment for
the datasets of a ``setup`` call:

1. Every rank lays the images out from the records and checks the memory for one copy per node (host and
   container limits, ``images.cache.memory_budget``); global rank 0 draws a job token. One collective
   agrees on the verdicts, on ``/dev/shm`` being usable and on the token.
2. Local rank 0 removes stale segments of dead jobs (``sweep_stale_segments``) and creates
   ``yolo11-cache-<token>-node<N>``: header first (job token, boot id, fingerprint of the datasets and
   settings, owners), space reserved with ``fallocate`` (a full ``/dev/shm`` is an error now, not a
   SIGBUS later), then renamed into place. A collective says whether that worked on every node.
3. Every local rank maps it, writes its pid into the owner table and decodes images ``j = local_rank (mod
   R)`` straight into it. One collective (the barrier) ends the build, failing on every rank together.
4. Local rank 0 sets the "complete" flag and unlinks the name. The memory stays while any process maps
   it (forked workers inherit the mapping; spawned ones reopen ``/proc/<rank pid>/fd/<fd>``) and the
   kernel frees it when the last one exits, after a crash (SIGKILL) too. A crash during the build leaves
   a named segment whose owners are dead: the next build on the node removes it. A job never opens a
   segment of another token, so a stale one is never read.

Without a usable ``/dev/shm`` (absent, read-only, too small) every rank builds its own copy in its memory;
each node always builds its own segment (``/dev/shm`` is per host). The log says which.
``YOLO11_SHM_DIR`` moves the segments elsewhere (tests use it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import secrets
import struct
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from yolo11_lightning.data.agreement import split_hash
from yolo11_lightning.data.images.cache import (
    GIB,
    ImageCache,
    cache_layout,
    check_cache_memory,
    memory_budget,
)
from yolo11_lightning.data.images.shm_segment import (
    HEADER_BYTES,
    PREFIX,
    VERSION,
    SegmentHeader,
    SegmentPart,
    SharedSegment,
    boot_id,
    process_start,
    shm_directory,
    shm_problem,
    sweep_stale_segments,
)

log = logging.getLogger(__name__)

__all__ = ["PREFIX", "RankGroup", "attach_image_caches", "build_image_caches"]

_PART_ALIGN = 4096


# ------------------------------------------------------------------------------------ ranks
@dataclass(frozen=True)
class RankGroup:
    """Where this process is in the job, and the one collective the build needs (an element-wise max)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1
    node_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @classmethod
    def from_trainer(cls, trainer: Any) -> RankGroup:
        """The group of a Lightning Trainer's job; a single process when torch.distributed is not running.

        When the Trainer's figures do not describe ``world = nodes x local ranks`` (a custom cluster), every
        rank counts as its own node: no sharing, but nothing wrong either (every rank decides alike).
        """
        dist = torch.distributed
        if trainer is None or not (dist.is_available() and dist.is_initialized()):
            return cls()
        rank, world = dist.get_rank(), dist.get_world_size()
        device = getattr(getattr(trainer, "strategy", None), "root_device", torch.device("cpu"))
        local_rank = int(getattr(trainer, "local_rank", 0))
        local_world = int(getattr(trainer, "num_devices", 1))
        node_rank = int(getattr(trainer, "node_rank", 0))
        nodes = int(getattr(trainer, "num_nodes", 1))
        if local_world < 1 or not 0 <= local_rank < local_world or nodes * local_world != world:
            return cls(rank, world, 0, 1, rank, device)
        return cls(rank, world, local_rank, local_world, node_rank, device)

    @property
    def num_nodes(self) -> int:
        return self.world // self.local_world

    def max(self, values: Sequence[int]) -> list[int]:
        """Element-wise max of ``values`` over all ranks (every rank must call it, in the same order)."""
        if self.world == 1:
            return [int(v) for v in values]
        tensor = torch.tensor([int(v) for v in values], dtype=torch.int64, device=self.device)
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
        return [int(v) for v in tensor.tolist()]


# ------------------------------------------------------------------------------------ build
class CacheSource(Protocol):
    """What is cached: a ``BoxDataset`` (its records, output size and loader)."""

    records: Any
    image_size: int
    scaleup: bool

    def __len__(self) -> int: ...

    def load_resized(self, index: int) -> tuple[np.ndarray, float]: ...

    def resized_shapes(self) -> np.ndarray: ...


@dataclass(frozen=True)
class CacheLayout:
    shapes: list[np.ndarray]
    offsets: list[np.ndarray]
    starts: list[int]
    lengths: list[int]

    @property
    def storage_bytes(self) -> int:
        return self.starts[-1] + self.lengths[-1] if self.starts else 0

    @property
    def num_images(self) -> int:
        return sum(len(s) for s in self.shapes)


def plan_layout(sources: Sequence[CacheSource]) -> CacheLayout:
    shapes, offsets, starts, lengths, at = [], [], [], [], 0
    for source in sources:
        # The dataset's own (h', w') of every image: evaluation rounds differently from training.
        s = np.asarray(source.resized_shapes(), np.int64).reshape(-1, 2)
        o, length = cache_layout(s)
        shapes.append(s), offsets.append(o), starts.append(at), lengths.append(length)
        at = -(-(at + length) // _PART_ALIGN) * _PART_ALIGN
    return CacheLayout(shapes, offsets, starts, lengths)


def fingerprint(sources: Sequence[CacheSource], layout: CacheLayout) -> bytes:
    """32 bytes naming the cached content: each dataset's files and labels, output size, scale-up, layout."""
    h = hashlib.sha256(f"yolo11-cache v{VERSION}".encode())
    for source, shapes in zip(sources, layout.shapes):
        h.update(struct.pack("<qq?", split_hash(source), source.image_size, bool(source.scaleup)))
        h.update(np.ascontiguousarray(shapes, np.int64).tobytes())
    return h.digest()


def decode_threads(local_world: int) -> int:
    return max(1, min(8, (os.cpu_count() or 1) // max(local_world, 1)))


def fill_caches(caches: Sequence[ImageCache], sources: Sequence[CacheSource], share: Sequence[tuple[int, int]],
          threads: int) -> int:  # fmt: skip
    """Decode the (cache, image) pairs of ``share``; returns how many could not be read."""

    def one(item: tuple[int, int]) -> bool:
        k, i = item
        return caches[k].fill(i, lambda j: sources[k].load_resized(j)[0])

    with ThreadPoolExecutor(threads) as pool:
        return sum(not ok for ok in pool.map(one, share))


def agree_or_raise(group: RankGroup, error: BaseException | None, what: str) -> None:
    """A barrier that fails on every rank when ``error`` happened on any."""
    (failed,) = group.max([int(error is not None)])
    if error is not None:
        raise error
    if failed:
        raise RuntimeError(
            f"image cache: {what} failed on another rank (its log has the error); stopping too"
        )


def build_image_caches(
    sources: Sequence[CacheSource],
    group: RankGroup | None = None,
    max_fraction: float = 0.7,
    num_threads: int | None = None,
) -> list[ImageCache]:
    """One ``ImageCache`` per source, in one segment per node (every rank calls this with the same sources).

    ``num_threads``: decoding threads per rank; default cores / local ranks, at most 8.

    Raises:
        MemoryError: on every rank, when the cache would not fit (one copy per node, or one per rank
            without ``/dev/shm``) in ``max_fraction`` of the memory available (host or container limit).
    """
    group = group or RankGroup()
    threads = num_threads or decode_threads(group.local_world)
    layout = plan_layout(sources)
    total, count = layout.storage_bytes, layout.num_images
    size = max((s.image_size for s in sources), default=0)
    directory = shm_directory()
    problem = shm_problem(directory, HEADER_BYTES + total)
    available = memory_budget()[0]
    token = secrets.randbits(62) | 1 if group.rank == 0 else 0
    no_shm, over_node, over_ranks, token = group.max([
        problem is not None, total > max_fraction * available,
        total * group.local_world > max_fraction * available, token,
    ])  # fmt: skip
    t0 = time.perf_counter()
    if not no_shm:
        _check_memory(count, size, total, 1, max_fraction, over_node, "node")
        segment, created = None, None
        if group.local_rank == 0:
            try:
                segment = _create(directory, sources, layout, token, group)
            except OSError as e:
                created = e
                log.warning("image cache: could not create a segment in %s: %s", directory, e)
        (failed,) = group.max([created is not None])
        if not failed:
            caches = _build_shared(sources, layout, segment, directory, token, group, threads)
            _report_shared(group, directory, total, count, time.perf_counter() - t0)
            return caches
        problem = "a rank could not create its node's segment (see the warning above or in its log)"
    _check_memory(count, size, total, group.local_world, max_fraction, over_ranks, "process")
    caches = [ImageCache(ImageCache.allocate(n), o, s, src.records)
              for src, s, o, n in zip(sources, layout.shapes, layout.offsets, layout.lengths)]  # fmt: skip
    share = [(k, i) for k, s in enumerate(layout.shapes) for i in range(len(s))]
    error = None
    try:
        unreadable = fill_caches(caches, sources, share, threads)
    except Exception as e:  # re-raised once every rank knows
        error = e
    agree_or_raise(group, error, "building the image cache")
    if group.local_rank == 0:  # a warning where ranks could have shared one copy
        log.log(
            logging.WARNING if group.local_world > 1 else logging.INFO,
            "image cache: one copy per rank, %s each x %d rank(s) per node (no shared copy: %s); %d images "
            "in %.1f s, %d unreadable", _size(total), group.local_world, problem, count,
            time.perf_counter() - t0, unreadable,
        )  # fmt: skip
    return caches


def _size(nbytes: int) -> str:
    return f"{nbytes / GIB:.2f} GiB" if nbytes >= GIB // 4 else f"{nbytes / 2**20:.1f} MiB"


def _check_memory(
    count: int, size: int, total: int, copies: int, fraction: float, over: int, unit: str
) -> None:
    if not over:
        return
    check_cache_memory(count, size, total, copies, fraction, unit)  # raises with this rank's figures
    raise MemoryError(
        f"cache_images: the image cache ({total / GIB:.2f} GiB per {unit}) does not fit in the memory of "
        "another rank (its log has the figures). Set --data.cache_images false, or lower --data.image_size."
    )


def _segment_path(directory: Path, token: int, node_rank: int) -> Path:
    return directory / f"{PREFIX}{token:016x}-node{node_rank}"


def _expected_header(
    sources: Sequence[CacheSource], layout: CacheLayout, token: int, group: RankGroup
) -> SegmentHeader:
    return SegmentHeader(
        token, layout.storage_bytes, layout.num_images, boot_id(), fingerprint(sources, layout),
        group.node_rank, group.local_world,
    )  # fmt: skip


def _create(directory: Path, sources: Sequence[CacheSource], layout: CacheLayout, token: int,
            group: RankGroup) -> SharedSegment:  # fmt: skip
    sweep_stale_segments(directory)
    header = _expected_header(sources, layout, token, group)
    # Owned from the start (slot 0 = local rank 0), so no sweep of another job takes it for stale.
    header = dataclasses.replace(header, owners=((os.getpid(), process_start(os.getpid()) or 0),))
    return SharedSegment.create(_segment_path(directory, token, group.node_rank), header)


def _build_shared(
    sources: Sequence[CacheSource], layout: CacheLayout, segment: SharedSegment | None, directory: Path,
    token: int, group: RankGroup, threads: int,
) -> list[ImageCache]:  # fmt: skip
    path = _segment_path(directory, token, group.node_rank)
    caches: list[ImageCache] = []
    error = None
    t0 = time.perf_counter()
    try:
        if segment is None:
            segment = SharedSegment.attach(path, _expected_header(sources, layout, token, group))
        segment.register_owner(group.local_rank)
        caches = [ImageCache(SegmentPart(segment, start, n), o, s, src.records)
                  for src, s, o, start, n in zip(sources, layout.shapes, layout.offsets, layout.starts,
                                                 layout.lengths)]  # fmt: skip
        every = [(k, i) for k, s in enumerate(layout.shapes) for i in range(len(s))]
        share = every[group.local_rank :: group.local_world]
        unreadable = fill_caches(caches, sources, share, threads)
        log.debug("image cache: rank %d decoded %d images in %.1f s (%d unreadable)", group.rank, len(share),
                  time.perf_counter() - t0, unreadable)  # fmt: skip
    except Exception as e:  # re-raised once every rank knows
        error = e
    try:
        agree_or_raise(group, error, "building the image cache")
    finally:
        if group.local_rank == 0:  # every local rank has mapped it (or the build failed): drop the name
            if error is None and segment is not None:
                segment.mark_complete()
            with contextlib.suppress(OSError):
                os.unlink(path)
    return caches


def _report_shared(group: RankGroup, directory: Path, total: int, count: int, seconds: float) -> None:
    if group.local_rank != 0:
        return
    nodes = group.num_nodes
    across = f"; each of the {nodes} nodes builds its own copy" if nodes > 1 else ""
    log.info(
        "image cache: one copy per node in %s, %s shared by %d local rank(s) and their workers (node %d)%s; "
        "%d images decoded in %.1f s", directory, _size(total), group.local_world, group.node_rank, across, count,
        seconds,
    )  # fmt: skip


def attach_image_caches(
    datasets: Sequence[Any], group: RankGroup | None = None, max_fraction: float = 0.7
) -> None:
    """Build the caches of ``datasets`` (``BoxDataset``s) and hand each its own."""
    for dataset in datasets:
        dataset.image_cache = None
        dataset.decode_cache_size = 0  # the RAM cache replaces the per-worker one
    for dataset, cache in zip(datasets, build_image_caches(datasets, group, max_fraction)):
        dataset.image_cache = cache
