"""Decoded images on disk (``cache_images: disk``): ``.npy`` memory maps beside the label cache.

The data stays on disk (the page cache keeps what fits) but no image is decoded again: each split's decoded,
resized images are one ``.npy`` file of the ``images.cache.cache_layout`` storage (flag bytes, then the
images), named after the fingerprint of the split, the output size and scale-up (``node_cache.fingerprint``):
``<label cache stem>.images-<fingerprint>.npy``. A changed dataset or setting gets another file; nothing is
read that was not written whole, since a file only gets its name by an atomic rename once complete. The
fingerprint covers the file list, image sizes and labels, not the pixels: an image rewritten in place with
the same size and labels keeps its old decoded copy until the ``.npy`` is deleted.

Every rank calls ``attach_disk_caches`` with the same datasets. When a file is missing on any rank, the local
ranks of each node build it together into ``<name>.tmp-<host>-<pid>`` (local rank 0 creates it, each rank
decodes its share, one barrier), then local rank 0 renames it into place (nodes sharing the filesystem write
identical bytes, the last rename wins). Where the dataset folder is read-only the files go to the label
cache folder (``label_cache_dir``, default ``~/.cache/yolo11_lightning``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from yolo11_lightning.data.images.cache import GIB, ImageCache
from yolo11_lightning.data.images.node_cache import (
    CacheSource,
    RankGroup,
    agree_or_raise,
    decode_threads,
    fill_caches,
    fingerprint,
    plan_layout,
)

log = logging.getLogger(__name__)


@dataclass
class DiskStorage:
    """Bytes of a ``.npy`` file, memory-mapped read-only (pickles as its path: workers map it themselves)."""

    path: str
    writable: bool = False

    def __post_init__(self) -> None:
        self._array = np.load(self.path, mmap_mode="r+" if self.writable else "r")

    def array(self) -> np.ndarray:
        return self._array

    def flush(self) -> None:
        if isinstance(self._array, np.memmap):
            self._array.flush()

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return DiskStorage, (self.path,)


def _valid(path: Path, nbytes: int) -> bool:
    try:
        array = np.load(path, mmap_mode="r")
    except (OSError, ValueError):
        return False
    return array.dtype == np.uint8 and array.shape == (nbytes,)


def _writable_folder(candidates: Sequence[Path]) -> Path:
    for folder in candidates:
        with contextlib.suppress(OSError):
            folder.mkdir(parents=True, exist_ok=True)
        if folder.is_dir() and os.access(folder, os.W_OK | os.X_OK):
            return folder
    raise OSError(f"cache_images: disk: none of {', '.join(map(str, candidates))} is writable")


def attach_disk_caches(
    datasets: Sequence[Any],
    locations: Sequence[tuple[Path, Path]],
    group: RankGroup | None = None,
    num_threads: int | None = None,
) -> None:
    """Memory-map (building where missing) each dataset's decoded images and hand each its cache.

    Args:
        datasets: ``BoxDataset``s.
        locations: per dataset, (label cache path beside the labels, its fallback in the cache folder).
        group: the ranks of the job (one process when None).
        num_threads: decoding threads per rank (default cores / local ranks, at most 8).
    """
    group = group or RankGroup()
    for dataset in datasets:
        dataset.image_cache = None
        dataset.decode_cache_size = 0
    for dataset, location in zip(datasets, locations):
        layout = plan_layout([dataset])
        (shapes,), (offsets,), (nbytes,) = layout.shapes, layout.offsets, layout.lengths
        name = f"{location[0].name.removesuffix('.npz').removesuffix('.cache')}.images-"
        name += fingerprint([dataset], layout).hex()[:16] + ".npy"
        error, path = None, None
        try:
            folder = next((p.parent for p in location if (p.parent / name).exists()), None)
            folder = folder or _writable_folder([p.parent for p in location])
            path = folder / name
        except OSError as e:
            error = e
        agree_or_raise(group, error, "finding a folder for the disk image cache")
        (missing,) = group.max([not _valid(path, nbytes)])
        if missing:
            _build(
                dataset,
                path,
                shapes,
                offsets,
                nbytes,
                group,
                num_threads or decode_threads(group.local_world),
            )
        dataset.image_cache = ImageCache(DiskStorage(str(path)), offsets, shapes, dataset.records)


def _build(dataset: CacheSource, path: Path, shapes: np.ndarray, offsets: np.ndarray, nbytes: int,
           group: RankGroup, threads: int) -> None:  # fmt: skip
    """The local ranks of each node write ``path`` together through a temporary file; local rank 0 renames it."""
    t0 = time.perf_counter()
    tmp = path.with_name(f"{path.name}.tmp-{socket.gethostname()}-{group.node_rank}")
    error = None
    if group.local_rank == 0:
        try:
            free = os.statvfs(path.parent).f_bavail * os.statvfs(path.parent).f_frsize
            if free < nbytes:
                raise OSError(
                    f"cache_images: disk: {path.parent} has {free / GIB:.2f} GiB free, the cache needs "
                    f"{nbytes / GIB:.2f} GiB"
                )
            np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=(nbytes,)).flush()
        except OSError as e:
            error = e
    agree_or_raise(group, error, "creating the disk image cache")
    try:
        storage = DiskStorage(str(tmp), writable=True)
        cache = ImageCache(storage, offsets, shapes, dataset.records)
        share = [(0, i) for i in range(len(shapes))][group.local_rank :: group.local_world]
        unreadable = fill_caches([cache], [dataset], share, threads)
        storage.flush()
    except Exception as e:  # re-raised once every rank knows
        error = e
    try:
        agree_or_raise(group, error, "building the disk image cache")
        if group.local_rank == 0:
            os.replace(tmp, path)
            log.info(
                "image cache on disk: %s, %.2f GiB, %d images decoded in %.1f s (%d unreadable on local rank 0)",
                path, nbytes / GIB, len(shapes), time.perf_counter() - t0, unreadable,
            )  # fmt: skip
    finally:
        if group.local_rank == 0:
            with contextlib.suppress(OSError):
                tmp.unlink()
    (failed,) = group.max([group.local_rank == 0 and not path.exists()])
    if failed:
        raise RuntimeError(f"cache_images: disk: {path} was not written on some node")
