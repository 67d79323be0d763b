"""Optional RAM cache of decoded, resized images, shared by the DataLoader workers.

All images of a split live in one flat uint8 storage (no per-image Python objects), so workers read it
without copying: no reference counts are written into its pages. ``data.images.node_cache`` puts that storage
in a ``/dev/shm`` segment shared by every rank of a node; ``ImageCache.build`` (this process's own copy,
the fallback) keeps it in a tensor, moved to shared memory for ``spawn``/``forkserver`` workers.
The size is estimated from the records first; the cache refuses to start when it would not fit in the
memory this process may use: the smaller of the host's ``MemAvailable`` and the headroom of every cgroup
memory limit above the process (Docker, Kubernetes, SLURM; cgroup v2 ``memory.max`` / ``memory.current``
or v1 ``memory.limit_in_bytes`` / ``memory.usage_in_bytes``), so a container limit refuses the cache with
a message instead of the kernel OOM-killing the run.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from yolo11_lightning.data.images.limits import ImageReadError
from yolo11_lightning.structures.records import ImageRecord

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


# Where the cgroup filesystems are mounted and where the process's cgroups are listed (tests point these
# at temporary files).
CGROUP_ROOT = "/sys/fs/cgroup"
PROC_SELF_CGROUP = "/proc/self/cgroup"
# cgroup v1 reports "no limit" as a huge page-rounded number.
_UNLIMITED = 1 << 60


def available_memory_bytes() -> int:
    """Memory the host can give without swapping (``MemAvailable``), or free physical pages as a fallback.

    Blind to container limits: ``memory_budget`` combines it with them.
    """
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class CgroupMemory:
    """One cgroup memory limit above this process: ``limit`` and ``usage`` in bytes, at ``path``.

    ``usage`` excludes inactive file cache, which the kernel reclaims before it OOM-kills.
    """

    path: str
    limit: int
    usage: int

    @property
    def headroom(self) -> int:
        return max(self.limit - self.usage, 0)


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (v2 without a limit) -> None


def _inactive_file(directory: Path, key: str) -> int:
    try:
        for line in (directory / "memory.stat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key and value.strip().isdigit():
                return int(value)
    except OSError:
        pass
    return 0


def _own_cgroups(proc_cgroup: str) -> tuple[str | None, str | None]:
    """(v2 path, v1 memory path) of this process from ``/proc/self/cgroup`` (None where absent)."""
    v2 = v1 = None
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v2, v1


def _levels(base: Path, path: str) -> list[Path]:
    """``base/path`` and each of its ancestors down to ``base``, those that exist.

    Inside a container the process's cgroup is often mounted as ``base`` itself (cgroup namespace, or a
    v1 bind mount) while ``/proc/self/cgroup`` names the host's path: then only ``base`` exists.
    """
    parts = [p for p in path.strip("/").split("/") if p and p != ".."]
    found = [base.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]
    return [d for d in found if d.is_dir()]


def cgroup_memory_limits(root: str | None = None, proc_cgroup: str | None = None) -> list[CgroupMemory]:
    """Every memory limit (cgroup v2, else v1) on this process's cgroup path; [] when there is none."""
    base = Path(root if root is not None else CGROUP_ROOT)
    v2, v1 = _own_cgroups(proc_cgroup if proc_cgroup is not None else PROC_SELF_CGROUP)
    limits: list[CgroupMemory] = []
    if v2 is not None:
        mount = base if (base / "cgroup.controllers").exists() else base / "unified"
        for d in _levels(mount, v2):
            limit, usage = _read_int(d / "memory.max"), _read_int(d / "memory.current")
            if limit is not None and usage is not None:
                limits.append(CgroupMemory(str(d), limit, usage - _inactive_file(d, "inactive_file")))
    if not limits and v1 is not None:
        for d in _levels(base / "memory", v1):
            limit, usage = _read_int(d / "memory.limit_in_bytes"), _read_int(d / "memory.usage_in_bytes")
            if limit is not None and usage is not None and limit < _UNLIMITED:
                limits.append(CgroupMemory(str(d), limit, usage - _inactive_file(d, "total_inactive_file")))
    return limits


def memory_budget(root: str | None = None, proc_cgroup: str | None = None) -> tuple[int, str]:
    """(bytes this process can still take, what bounds it): the host or the tightest cgroup limit."""
    available, where = available_memory_bytes(), "host MemAvailable"
    for cg in cgroup_memory_limits(root, proc_cgroup):
        if cg.headroom < available:
            available = cg.headroom
            where = (
                f"container memory limit {cg.limit / GIB:.2f} GiB with {cg.usage / GIB:.2f} GiB in use "
                f"(cgroup {cg.path})"
            )
    return available, where


def estimate_cache_bytes(records: Sequence[ImageRecord], size: int, scaleup: bool = True) -> int:
    """Bytes the cache of ``records`` resized to long side ``size`` takes (3 bytes per pixel)."""
    return sum(3 * h * w for h, w, _ in (resized_shape(r.height, r.width, size, scaleup) for r in records))


# Images start this many bytes into the storage, after one "unreadable" flag byte per image.
_ALIGN = 64


def cache_layout(shapes: np.ndarray) -> tuple[np.ndarray, int]:
    """(offsets (n,) int64 of each image in the storage, storage bytes) for (n, 2) resized (h', w').

    The storage is one flag byte per image (1: unreadable when the cache was built), padded to 64 bytes,
    then the images back to back as (h', w', 3) uint8.
    """
    nbytes = 3 * shapes.prod(axis=1) if len(shapes) else np.zeros(0, np.int64)
    start = -(-len(shapes) // _ALIGN) * _ALIGN
    offsets = start + np.concatenate([[0], np.cumsum(nbytes)[:-1]]).astype(np.int64)
    return offsets, int(start + nbytes.sum())


class ImageCache:
    """Resized images of a list of records, indexed like the records.

    ``cache[i]`` is a read-only (h', w', 3) uint8 view, or raises ``ImageReadError`` for an image that
    could not be read when the cache was built (the Dataset then substitutes or skips it, as without a
    cache). ``storage`` owns the bytes: a torch tensor (one process's copy; ``ImageCache.build``) or a
    ``node_cache.SharedSegment`` (one copy per node). Workers get the storage, never a pickled copy.
    """

    def __init__(
        self, storage: Any, offsets: np.ndarray, shapes: np.ndarray, records: Sequence[Any] | None = None
    ) -> None:
        self.storage = storage  # torch.Tensor (total,) uint8, or an object with .array() -> np.ndarray
        self.offsets = offsets  # (n,) int64 start of each image in the storage
        self.shapes = shapes  # (n, 2) int64 (h', w')
        self.records = records  # names the files in errors (the Dataset's flat PackedRecords)
        self._flat = self._array()

    def _array(self) -> np.ndarray:
        if isinstance(self.storage, torch.Tensor):
            return self.storage.numpy()
        return self.storage.array()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_flat"]  # rebuilt from the storage: a view must never be pickled as a copy
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._flat = self._array()

    @property
    def buffer(self) -> torch.Tensor:
        """The storage as a (total,) uint8 tensor (flag bytes, then the images)."""
        return torch.from_numpy(self._flat) if not isinstance(self.storage, torch.Tensor) else self.storage

    @property
    def image_bytes(self) -> int:
        """Bytes of the images alone (what ``estimate_cache_bytes`` predicts)."""
        return int(3 * self.shapes.prod(axis=1).sum()) if len(self.shapes) else 0

    def __len__(self) -> int:
        return len(self.offsets)

    def unreadable(self) -> np.ndarray:
        """(n,) bool: images that could not be read when the cache was built."""
        return self._flat[: len(self)].astype(bool)

    def __getitem__(self, index: int) -> np.ndarray:
        if self._flat[index]:
            raise ImageReadError(self._name(index), "could not be read when the image cache was built")
        h, w = self.shapes[index]
        start = self.offsets[index]
        view = self._flat[start : start + h * w * 3].reshape(h, w, 3)
        view.flags.writeable = False  # augmentations must copy, never write into the cache
        return view

    def _name(self, index: int) -> str:
        return str(self.records[index].path) if self.records is not None else f"image {index}"

    def fill(self, index: int, load: Callable[[int], np.ndarray]) -> bool:
        """Decode image ``index`` with ``load`` into the cache; False (and flagged) when unreadable."""
        try:
            image = load(index)
        except ImageReadError as e:
            log.warning("image cache: %s (the image is left out, as if missing)", e)
            self._flat[index] = 1
            return False
        if image.shape[:2] != tuple(self.shapes[index]):
            raise ValueError(
                f"{self._name(index)}: resized to {image.shape[:2]}, expected {tuple(self.shapes[index])}"
            )
        start = self.offsets[index]
        self._flat[start : start + image.size] = image.reshape(-1)
        self._flat[index] = 0
        return True

    @staticmethod
    def shapes_of(records: Sequence[ImageRecord], size: int, scaleup: bool = True) -> np.ndarray:
        """(n, 2) int64 resized (h', w') of ``records`` at long side ``size``."""
        shapes = [resized_shape(r.height, r.width, size, scaleup)[:2] for r in records]
        return np.array(shapes, np.int64).reshape(-1, 2)

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
        shapes: np.ndarray | None = None,
    ) -> ImageCache:
        """This process's own cache: estimate, check against available memory, then decode every image.

        ``node_cache.build_image_caches`` builds one copy per node instead and falls back to this.

        Args:
            records: the images (their heights/widths give the estimate).
            size: long side of the cached images.
            load: index -> resized (h', w', 3) uint8 image (the Dataset's own loader, so both agree).
            copies: processes on this node that each build such a cache (DDP ranks per node).
            max_fraction: largest share of the available memory the caches may take together.
            num_threads: decoding threads (OpenCV releases the GIL); default min(8, cpu count).
            shapes: (n, 2) (h', w') that ``load`` returns; default ``resized_shape`` of each record
                (evaluation rounds differently, ``BoxDataset.resized_shapes``).

        Raises:
            MemoryError: with the figures, when ``copies`` caches would exceed the allowed share.
        """
        shapes = cls.shapes_of(records, size, scaleup) if shapes is None else np.asarray(shapes, np.int64)
        shapes = shapes.reshape(-1, 2)
        offsets, total = cache_layout(shapes)
        check_cache_memory(len(records), size, total, copies, max_fraction)
        log.info("caching %d images in RAM: %.2f GiB", len(records), total / GIB)
        cache = cls(cls.allocate(total), offsets, shapes, records)
        threads = num_threads or min(8, os.cpu_count() or 1)
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda i: cache.fill(i, load), range(len(records))))
        return cache

    @staticmethod
    def allocate(total: int) -> torch.Tensor:
        """A (total,) uint8 tensor, in shared memory unless DataLoader workers are forked."""
        buffer = torch.zeros(total, dtype=torch.uint8)
        method = (
            multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
        )
        if method != "fork":
            buffer.share_memory_()  # spawn/forkserver workers get a handle, not a pickled copy
        return buffer


def check_cache_memory(
    num_images: int, size: int, total: int, copies: int, max_fraction: float, unit: str = "process"
) -> None:
    """Raise ``MemoryError`` (with the figures and the way out) when ``copies`` caches of ``total`` bytes
    exceed ``max_fraction`` of the memory this process may use (host or container limit)."""
    available, where = memory_budget()
    if total * copies > max_fraction * available:
        raise MemoryError(
            f"cache_images: {num_images} images at long side {size} need an estimated "
            f"{total / GIB:.2f} GiB "
            f"per {unit} x {copies} {unit}{'(es)' if unit.endswith('s') else '(s)'} = "
            f"{total * copies / GIB:.2f} GiB, more than "
            f"{max_fraction:.0%} of the {available / GIB:.2f} GiB available ({where}). Set "
            "--data.cache_images false, or lower --data.image_size."
        )
