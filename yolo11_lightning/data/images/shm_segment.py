"""Shared-memory segments of the node image cache: header, owners, stale detection, mapping.

A segment is a file (``/dev/shm/yolo11-cache-<token>-node<N>``) that starts with a ``HEADER_BYTES`` header:
magic and version, the job token, the storage size, the boot id of the host, a fingerprint of the cached
datasets and settings, the node, a "complete" flag written last, and the owner table (pid and process start
time of each local rank that maps it). ``stale_reason`` tells a segment no living job owns (another boot,
every owner gone) from one in use; ``sweep_stale_segments`` removes the stale ones. ``SharedSegment`` maps
one; ``data.images.node_cache`` builds and uses them. ``YOLO11_SHM_DIR`` moves the segments elsewhere (tests use it).
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from yolo11_lightning.data.images.cache import GIB

log = logging.getLogger("yolo11_lightning.data.images.node_cache")

PREFIX = "yolo11-cache-"
MAGIC = b"Y11CACHE"
VERSION = 1
HEADER_BYTES = 4096  # the storage starts on a page boundary
# magic, version, header bytes, token, storage bytes, images, boot id, fingerprint, node rank, local world
_FIXED = struct.Struct("<8sIIQQQ16s32sII")
COMPLETE_AT = 128  # one byte, written once every rank has decoded its share
OWNERS_AT = 256
MAX_OWNERS = 64
_OWNER = struct.Struct("<QQ")  # pid, process start time (clock ticks after boot)


# ------------------------------------------------------------------------------------ processes
def boot_id() -> bytes:
    """16 bytes naming this boot of the host (a segment from another boot is stale by definition)."""
    try:
        return bytes.fromhex(Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", ""))
    except (OSError, ValueError):
        return bytes(16)


def process_start(pid: int) -> int | None:
    """Start time of process ``pid`` in clock ticks after boot (tells a pid reused later apart); None: gone
    or exited (a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()  # field 3 onwards; the name may contain spaces
    if len(fields) <= 19 or fields[0] in ("Z", "X"):  # a zombie has exited: it maps nothing any more
        return None
    return int(fields[19])


def alive(pid: int, start: int) -> bool:
    return pid > 0 and process_start(pid) == start


# ------------------------------------------------------------------------------------ header
@dataclass(frozen=True)
class SegmentHeader:
    """The first ``HEADER_BYTES`` of a segment (the storage follows)."""

    token: int
    storage_bytes: int
    num_images: int
    boot_id: bytes
    fingerprint: bytes
    node_rank: int
    local_world: int
    complete: bool = False
    owners: tuple[tuple[int, int], ...] = ()

    @property
    def file_bytes(self) -> int:
        return HEADER_BYTES + self.storage_bytes

    def pack(self) -> bytes:
        raw = bytearray(HEADER_BYTES)
        _FIXED.pack_into(
            raw, 0, MAGIC, VERSION, HEADER_BYTES, self.token, self.storage_bytes, self.num_images,
            self.boot_id, self.fingerprint, self.node_rank, self.local_world,
        )  # fmt: skip
        raw[COMPLETE_AT] = int(self.complete)
        for slot, owner in enumerate(self.owners[:MAX_OWNERS]):
            _OWNER.pack_into(raw, OWNERS_AT + slot * _OWNER.size, *owner)
        return bytes(raw)

    @classmethod
    def unpack(cls, raw: bytes) -> SegmentHeader | None:
        """The header in ``raw``; None when it is not a segment of this version."""
        if len(raw) < HEADER_BYTES:
            return None
        magic, version, size, token, storage, images, boot, print_, node, local = _FIXED.unpack_from(raw)
        if magic != MAGIC or version != VERSION or size != HEADER_BYTES:
            return None
        owners = tuple(
            o
            for o in (_OWNER.unpack_from(raw, OWNERS_AT + s * _OWNER.size) for s in range(MAX_OWNERS))
            if o[0]
        )
        return cls(token, storage, images, boot, print_, node, local, bool(raw[COMPLETE_AT]), owners)

    def same_job(self, other: SegmentHeader) -> bool:
        """Same token, layout, fingerprint and node (owners and the complete flag aside)."""
        fields = (
            "token",
            "storage_bytes",
            "num_images",
            "boot_id",
            "fingerprint",
            "node_rank",
            "local_world",
        )
        return all(getattr(self, f) == getattr(other, f) for f in fields)


def read_header(path: str | Path) -> SegmentHeader | None:
    try:
        with open(path, "rb") as f:
            return SegmentHeader.unpack(f.read(HEADER_BYTES))
    except OSError:
        return None


def stale_reason(path: str | Path) -> str | None:
    """Why the segment (or half-created segment) at ``path`` belongs to no living job; None: it may.

    A segment is stale when it was made in another boot of the host or none of its owners is alive. A
    ``.tmp-<pid>-<start>`` file (a creation cut short) is stale when its creator is gone. A file that
    reads as neither is left alone (not ours to judge).
    """
    name = Path(path).name
    if ".tmp-" in name:
        try:
            pid, start = (int(x) for x in name.rsplit(".tmp-", 1)[1].split("-"))
        except ValueError:
            return None
        return None if alive(pid, start) else f"its creator (pid {pid}) is gone"
    header = read_header(path)
    if header is None:
        return None
    if header.boot_id != boot_id():
        return "it was made before the host rebooted"
    if not any(alive(pid, start) for pid, start in header.owners):
        pids = ", ".join(str(pid) for pid, _ in header.owners) or "none"
        state = "complete" if header.complete else "incomplete"
        return f"{state}, and none of its owner processes (pid {pids}) is alive"
    return None


def sweep_stale_segments(directory: str | Path) -> list[tuple[str, str]]:
    """Remove this user's stale segments in ``directory``; returns (name, why) of each removed."""
    removed = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(PREFIX):
            continue
        try:
            if entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
        except OSError:
            continue
        why = stale_reason(entry.path)
        if why is None:
            continue
        try:
            os.unlink(entry.path)
        except OSError:
            continue
        log.info("image cache: removed stale segment %s (%s)", entry.path, why)
        removed.append((entry.name, why))
    return removed


# ------------------------------------------------------------------------------------ segments
class SharedSegment:
    """One mapped segment; ``array()`` is its storage (the bytes after the header) as uint8.

    Pickled (for ``spawn``/``forkserver`` DataLoader workers) as the way to reopen it: the creating rank's
    open descriptor under ``/proc``, valid after the name is unlinked, read-only.
    """

    def __init__(self, fd: int, size: int, writable: bool = True) -> None:
        self.fd = fd
        self.size = size
        access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
        self.mm = mmap.mmap(fd, size, access=access)
        self.writable = writable

    @classmethod
    def create(cls, path: Path, header: SegmentHeader) -> SharedSegment:
        """A new segment at ``path`` with ``header``; space reserved before the name appears."""
        start = process_start(os.getpid()) or 0
        tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}-{start}")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(fd, 0, header.file_bytes)
            os.pwrite(fd, header.pack(), 0)
            os.rename(tmp, path)
            return cls(fd, header.file_bytes)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    @classmethod
    def attach(cls, path: Path, expected: SegmentHeader) -> SharedSegment:
        """Map the segment at ``path`` after checking it is the one ``expected`` (this job's, this layout)."""
        fd = os.open(path, os.O_RDWR)
        try:
            found = SegmentHeader.unpack(os.pread(fd, HEADER_BYTES, 0))
            if found is None or not found.same_job(expected) or os.fstat(fd).st_size != expected.file_bytes:
                raise RuntimeError(f"image cache: {path} is not the segment this job created")
            return cls(fd, expected.file_bytes)
        except BaseException:
            os.close(fd)
            raise

    def header(self) -> SegmentHeader | None:
        return SegmentHeader.unpack(bytes(self.mm[:HEADER_BYTES]))

    def register_owner(self, slot: int) -> None:
        """Record this process as an owner (slots beyond ``MAX_OWNERS`` are not recorded)."""
        if slot < MAX_OWNERS:
            owner = (os.getpid(), process_start(os.getpid()) or 0)
            self.mm[OWNERS_AT + slot * _OWNER.size : OWNERS_AT + (slot + 1) * _OWNER.size] = _OWNER.pack(
                *owner
            )

    def mark_complete(self) -> None:
        self.mm[COMPLETE_AT] = 1

    def array(self) -> np.ndarray:
        return np.frombuffer(self.mm, np.uint8, count=self.size - HEADER_BYTES, offset=HEADER_BYTES)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _reopen, (f"/proc/{os.getpid()}/fd/{self.fd}", self.size)


def _reopen(path: str, size: int) -> SharedSegment:
    fd = os.open(path, os.O_RDONLY)
    return SharedSegment(fd, size, writable=False)


@dataclass
class SegmentPart:
    """Bytes ``start .. start + length`` of a segment's storage: one dataset's cache (pickles as a reference)."""

    segment: SharedSegment
    start: int
    length: int

    def array(self) -> np.ndarray:
        return self.segment.array()[self.start : self.start + self.length]


def shm_directory() -> Path:
    return Path(os.environ.get("YOLO11_SHM_DIR", "/dev/shm"))


def shm_problem(directory: Path, needed: int) -> str | None:
    """Why ``directory`` cannot hold a segment of ``needed`` bytes; None when it can."""
    if not directory.is_dir():
        return f"{directory} does not exist"
    if not os.access(directory, os.W_OK | os.X_OK):
        return f"{directory} is not writable"
    try:
        stat = os.statvfs(directory)
    except OSError as e:
        return f"{directory}: {e}"
    free = stat.f_bavail * stat.f_frsize
    if free < needed:
        return f"{directory} has {free / GIB:.2f} GiB free, the cache needs {needed / GIB:.2f} GiB"
    return None
