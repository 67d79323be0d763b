"""Converting a dataset we read (every format, every split) into shards and their indexes (``layout``).

The records come from ``sources.split.load_split`` (the checks every run applies: what a fit would skip is
skipped here and reported), so a shard folder holds exactly the samples a fit from the folder trains on, in the
same order (sample i of a split is record i). Output goes through fsspec (a folder, ``s3://``, ``gs://``, ...).

Where a sample lies is recorded per sample, so the shards need not follow the split's order. The training split
is dealt out like cards: of S shards, shard k holds samples k, k + S, k + 2S, ... Sources list their images in an
order that means something (an ImageFolder class by class, a COCO export by date or camera), and the training order
shuffles a window of a few shards at a time (``sampling.shard_windows``): dealt shards make every window a sample
of the whole split, so the window costs no accuracy, whatever the source order. The other splits are read in
order (validation, prediction) and are written in order, one shard after the other.

Deterministic: members in shard order with fixed tar headers, zip entries of a fixed date, json with sorted
keys: the same input gives the same bytes.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
import tarfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from yolo11_lightning.data.images.limits import DEFAULT_MAX_IMAGE_PIXELS
from yolo11_lightning.data.shards import layout
from yolo11_lightning.data.shards.cache import fetch_failure, fetch_retrying
from yolo11_lightning.data.shards.store import open_store
from yolo11_lightning.data.sources.config import SPLITS, DatasetConfig, DatasetError
from yolo11_lightning.data.sources.packed_records import PackedRecords
from yolo11_lightning.data.sources.split import load_split

__all__ = ["DEFAULT_SHARD_MB", "ShardedSplit", "write_shards"]

DEFAULT_SHARD_MB = 256  # WebDataset's advice: shards of 100 MB to 1 GB
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # the earliest date a zip entry holds: no clock in the output


@dataclass(frozen=True)
class ShardedSplit:
    """What the converter wrote for one split."""

    split: str
    samples: int
    shards: int
    bytes: int
    skipped: int


def _extension(path: str) -> str:
    ext = Path(path).suffix.lower().lstrip(".")
    return ext if ext.isalnum() else "img"


def _member(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, 0, 0o644
    info.uid, info.gid, info.uname, info.gname = 0, 0, "", ""
    return info


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """``arrays`` as an ``.npz`` (``np.load`` reads it) whose bytes depend on the arrays alone."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as z:
        for name in sorted(arrays):
            entry = io.BytesIO()
            np.lib.format.write_array(entry, np.ascontiguousarray(arrays[name]), allow_pickle=False)
            z.writestr(zipfile.ZipInfo(f"{name}.npy", _ZIP_DATE), entry.getvalue())
    return buffer.getvalue()


def _json_bytes(value: object) -> bytes:
    return (json.dumps(value, indent=1, sort_keys=True) + "\n").encode()


class _ShardWriter:
    """Tar shards of one split, written one after the other: each is closed by ``close_shard``, or once the next
    member would pass ``limit`` bytes (``limit`` None: only by ``close_shard``)."""

    def __init__(self, split: str, limit: int | None, put: Callable[[str, bytes], None]) -> None:
        self.split, self.limit, self.put = split, limit, put
        self.shardlist: list[dict[str, object]] = []
        self._buffer: io.BytesIO | None = None
        self._tar: tarfile.TarFile | None = None
        self._count = 0

    def add(self, name: str, data: bytes) -> tuple[int, int]:
        """Append a member; (shard number, byte offset of its data in that shard)."""
        full = (
            self.limit is not None
            and self._tar is not None
            and self._tar.offset + 512 + len(data) > self.limit
        )
        if full:
            self.close_shard()
        if self._tar is None:
            self._buffer = io.BytesIO()
            # closed in close_shard
            self._tar = tarfile.open(fileobj=self._buffer, mode="w", format=tarfile.USTAR_FORMAT)  # noqa: SIM115
        offset = self._tar.offset + 512  # a ustar header of a short name is one block
        self._tar.addfile(_member(name, len(data)), io.BytesIO(data))
        self._count += 1
        return len(self.shardlist), offset

    def close_shard(self) -> None:
        """Write the shard being filled (none: nothing happens)."""
        if self._tar is None or self._buffer is None:
            return
        self._tar.close()
        data = self._buffer.getvalue()
        url = layout.shard_file(self.split, len(self.shardlist))
        self.put(url, data)
        self.shardlist.append({"url": url, "nsamples": self._count, "filesize": len(data)})
        self._tar, self._buffer, self._count = None, None, 0

    def finish(self) -> list[dict[str, object]]:
        """Write the last shard; the split's wids shard list."""
        self.close_shard()
        return self.shardlist


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise DatasetError(f"{path}: cannot read image ({e.strerror or e})") from e


def _file_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError as e:
        raise DatasetError(f"{path}: cannot read image ({e.strerror or e})") from e


def dealt_order(sizes: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """The samples dealt out to S shards of about ``limit`` bytes (``sizes``: (N,) image bytes): (N,) sample
    indices in writing order, and (S + 1,) where each shard's run of that order starts and ends. Shard k holds
    samples k, k + S, k + 2S, ...; S is the fewest shards of at most ``limit`` bytes on average."""
    n = len(sizes)
    tar_bytes = int((512 + -(-sizes // 512) * 512).sum()) + 1024  # headers, padded data, end of archive
    count = min(max(1, -(-tar_bytes // limit)), max(n, 1))
    order = np.concatenate([np.arange(k, n, count) for k in range(count)]).astype(np.int64)
    per_shard = [len(range(k, n, count)) for k in range(count)]
    return order, np.concatenate([[0], np.cumsum(per_shard)]).astype(np.int64)


def _write_split(
    records: PackedRecords, split: str, limit: int, put: Callable[[str, bytes], None]
) -> tuple[dict[str, object], int]:
    """The split's shards and records file; (its wids index, bytes of its shards). The training split is dealt
    out over its shards (``dealt_order``), the others are written in order."""
    n = len(records)
    if split == "train":
        sizes = np.array([_file_size(records.path(i)) for i in range(n)], np.int64)
        order, bounds = dealt_order(sizes, limit)
        writer = _ShardWriter(split, None, put)
    else:
        order, bounds = np.arange(n, dtype=np.int64), np.array([0, n], np.int64)
        writer = _ShardWriter(split, limit, put)
    shard, offset, size = (np.zeros(n, np.int64) for _ in range(3))
    names: list[bytes] = [b""] * n
    for start, end in itertools.pairwise(bounds):
        for i in order[start:end]:
            path = records.path(int(i))
            data = _read(path)
            names[i] = layout.member_name(int(i), _extension(path)).encode()
            shard[i], offset[i] = writer.add(names[i].decode(), data)
            size[i] = len(data)
        writer.close_shard()
    shardlist = writer.finish()
    arrays = dict(records.arrays())
    arrays["paths"] = np.frombuffer(b"".join(names), np.uint8)
    arrays["path_ends"] = np.cumsum([len(m) for m in names], dtype=np.int64)
    arrays.update(zip(layout.LOCATION_FIELDS, (shard, offset, size)))
    blob = npz_bytes(arrays)
    put(layout.records_file(split), blob)
    index = {
        "__kind__": layout.WIDS_KIND,
        "wids_version": 1,
        "name": split,
        "shardlist": shardlist,
        layout.OUR_KEY: {
            "records": layout.records_file(split),
            "records_sha256": hashlib.sha256(blob).hexdigest(),
            "samples": n,
        },
    }
    return index, sum(int(s["filesize"]) for s in shardlist)  # type: ignore[call-overload]


def write_shards(
    config: DatasetConfig,
    out: str,
    task: str,
    shard_mb: float = DEFAULT_SHARD_MB,
    *,
    max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
    cache_dir: str | None = None,
    claim: tuple[str, str] | None = None,
) -> list[ShardedSplit]:
    """Write every split of ``config`` to ``out`` (a folder or an fsspec url) as shards; what each split got.

    ``task`` is recorded in the index (the records were read for it: ``config.outline_labels``), and ``claim``,
    (task, evidence) when the source's files say its task (``sources.task_hint``), for runs to read back. Raises
    DatasetError naming the split or file that cannot be read, or ``out`` when it cannot be written.
    """
    if shard_mb <= 0:
        raise DatasetError(f"--shard-size must be positive, got {shard_mb}")
    limit = int(shard_mb * 2**20)
    fs, root = open_store(out)  # the reader's timeouts; writes retried as its fetches are

    def put(name: str, data: bytes) -> None:
        try:
            fetch_retrying(lambda: fs.pipe_file(f"{root}/{name}", data))
        except Exception as e:  # the store's errors are of many kinds (botocore, aiohttp, OSError)
            why = e.strerror if isinstance(e, OSError) and e.strerror else fetch_failure(e)
            raise DatasetError(f"{out}/{name}: cannot write ({why})") from e

    try:
        fs.makedirs(root, exist_ok=True)
    except OSError as e:
        raise DatasetError(f"{out}: cannot create the shard folder ({e.strerror or e})") from e
    written, splits = [], {}
    for split in (s for s in SPLITS if config.splits.get(s)):
        records, report = load_split(config, split, cache_dir, max_image_pixels=max_image_pixels)
        index, size = _write_split(records, split, limit, put)
        put(layout.split_index(split), _json_bytes(index))
        splits[split] = layout.split_index(split)
        shards = len(index["shardlist"])  # type: ignore[arg-type]
        written.append(ShardedSplit(split, len(records), shards, size, report.num_skipped_images))
    top = {
        "format": layout.FORMAT,
        "version": layout.VERSION,
        "task": task,
        "task_claim": None if claim is None else {"task": claim[0], "evidence": claim[1]},
        "names": list(config.names),
        "label_options": config.options.yaml_keys(),
        "splits": splits,
    }
    put(layout.TOP_INDEX, _json_bytes(top))
    return written
