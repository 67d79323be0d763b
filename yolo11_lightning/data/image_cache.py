"""Optional RAM cache of decoded, resized images, shared by the DataLoader workers.

All images live in one flat uint8 buffer (one allocation, no per-image Python objects), so forked
workers read it without copying: no reference counts are written into its pages. With a ``spawn`` or
``forkserver`` start method the buffer is moved to shared memory instead of being pickled per worker.
The size is estimated from the records first; the cache refuses to start when it would not fit.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from .records import ImageRecord

log = logging.getLogger(__name__)

GIB = 1 << 30


def resized_shape(height: int, width: int, size: int, scaleup: bool = True) -> tuple[int, int, float]:
    """(h', w', r) of ``transforms.resize_long_side`` for an image of (height, width), without decoding."""
    r = size / max(height, width)
    if not scaleup:
        r = min(r, 1.0)
    if r == 1.0:
        return height, width, r
    return max(1, round(height * r)), max(1, round(width * r)), r


def available_memory_bytes() -> int:
    """Memory the OS can give without swapping (``MemAvailable``), or free physical pages as a fallback."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def estimate_cache_bytes(records: Sequence[ImageRecord], size: int, scaleup: bool = True) -> int:
    """Bytes the cache of ``records`` resized to long side ``size`` takes (3 bytes per pixel)."""
    return sum(3 * h * w for h, w, _ in (resized_shape(r.height, r.width, size, scaleup) for r in records))


class ImageCache:
    """Resized images of a list of records, indexed like the records.

    Use ``ImageCache.build``; ``cache[i]`` is a read-only (h', w', 3) uint8 view.
    """

    def __init__(self, buffer: torch.Tensor, offsets: np.ndarray, shapes: np.ndarray) -> None:
        self.buffer = buffer  # (total,) uint8
        self.offsets = offsets  # (n,) int64 start of each image in the buffer
        self.shapes = shapes  # (n, 2) int64 (h', w')

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, index: int) -> np.ndarray:
        h, w = self.shapes[index]
        start = self.offsets[index]
        view = self.buffer.numpy()[start : start + h * w * 3].reshape(h, w, 3)
        view.flags.writeable = False  # augmentations must copy, never write into the cache
        return view

    @classmethod
    def build(
        cls,
        records: Sequence[ImageRecord],
        size: int,
        load: Callable[[int], np.ndarray],
        scaleup: bool = True,
        copies: int = 1,
        max_fraction: float = 0.7,
        num_threads: int | None = None,
    ) -> ImageCache:
        """Estimate, check against available memory, then decode every image with a thread pool.

        Args:
            records: the images (their heights/widths give the estimate).
            size: long side of the cached images.
            load: index -> resized (h', w', 3) uint8 image (the Dataset's own loader, so both agree).
            copies: processes on this node that each build such a cache (DDP ranks per node).
            max_fraction: largest share of the available memory the caches may take together.
            num_threads: decoding threads (OpenCV releases the GIL); default min(8, cpu count).

        Raises:
            MemoryError: with the figures, when ``copies`` caches would exceed the allowed share.
        """
        shapes = np.array([resized_shape(r.height, r.width, size, scaleup)[:2] for r in records], np.int64)
        shapes = shapes.reshape(-1, 2)
        nbytes = 3 * shapes.prod(axis=1)
        total = int(nbytes.sum())
        available = available_memory_bytes()
        if total * copies > max_fraction * available:
            raise MemoryError(
                f"cache_images: {len(records)} images at long side {size} need {total / GIB:.2f} GiB per process "
                f"x {copies} process(es) = {total * copies / GIB:.2f} GiB, more than {max_fraction:.0%} of the "
                f"{available / GIB:.2f} GiB available. Turn cache_images off or lower image_size."
            )
        log.info("caching %d images in RAM: %.2f GiB", len(records), total / GIB)
        offsets = np.concatenate([[0], np.cumsum(nbytes)[:-1]]).astype(np.int64)
        buffer = torch.empty(total, dtype=torch.uint8)
        flat = buffer.numpy()

        def fill(i: int) -> None:
            image = load(i)
            if image.shape[:2] != tuple(shapes[i]):
                raise ValueError(
                    f"{records[i].path}: resized to {image.shape[:2]}, expected {tuple(shapes[i])}"
                )
            flat[offsets[i] : offsets[i] + nbytes[i]] = image.reshape(-1)

        threads = num_threads or min(8, os.cpu_count() or 1)
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(fill, range(len(records))))
        method = (
            multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
        )
        if method != "fork":
            buffer.share_memory_()  # spawn/forkserver workers get a handle, not a pickled copy
        return cls(buffer, offsets, shapes)
