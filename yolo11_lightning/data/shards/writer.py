"""Converting a dataset we read (every format, every split) into shards and their indexes (``layout``).

The records come from ``sources.split.load_split`` (the checks every run applies: what a fit would skip is
skipped here and reported), so a shard folder holds exactly the samples a fit from the folder trains on, in the
same order (sample i of a split is record i). Output goes through fsspec (a folder, ``s3://``, ``gs://``, ...).
Deterministic: members in dataset order with fixed tar headers, zip entries of a fixed date, json with sorted
keys: the same input gives the same bytes.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import fsspec
import numpy as np

from yolo11_lightning.data.images.limits import DEFAULT_MAX_IMAGE_PIXELS
from yolo11_lightning.data.shards import layout
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
    """Tar shards of one split, each closed once the next member would pass ``limit`` bytes."""

    def __init__(self, split: str, limit: int, put: Callable[[str, bytes], None]) -> None:
        self.split, self.limit, self.put = split, limit, put
        self.shardlist: list[dict[str, object]] = []
        self._buffer: io.BytesIO | None = None
        self._tar: tarfile.TarFile | None = None
        self._count = 0

    def add(self, name: str, data: bytes) -> tuple[int, int]:
        """Append a member; (shard number, byte offset of its data in that shard)."""
        if self._tar is not None and self._tar.offset + 512 + len(data) > self.limit:
            self._close()
        if self._tar is None:
            self._buffer = io.BytesIO()
            # closed in _close
            self._tar = tarfile.open(fileobj=self._buffer, mode="w", format=tarfile.USTAR_FORMAT)  # noqa: SIM115
        offset = self._tar.offset + 512  # a ustar header of a short name is one block
        self._tar.addfile(_member(name, len(data)), io.BytesIO(data))
        self._count += 1
        return len(self.shardlist), offset

    def _close(self) -> None:
        assert self._tar is not None and self._buffer is not None
        self._tar.close()
        data = self._buffer.getvalue()
        url = layout.shard_file(self.split, len(self.shardlist))
        self.put(url, data)
        self.shardlist.append({"url": url, "nsamples": self._count, "filesize": len(data)})
        self._tar, self._buffer, self._count = None, None, 0

    def finish(self) -> list[dict[str, object]]:
        if self._tar is not None:
            self._close()
        return self.shardlist


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise DatasetError(f"{path}: cannot read image ({e.strerror or e})") from e


def _write_split(
    records: PackedRecords, split: str, limit: int, put: Callable[[str, bytes], None]
) -> tuple[dict[str, object], int]:
    """The split's shards and records file; (its wids index, bytes of its shards)."""
    writer = _ShardWriter(split, limit, put)
    n = len(records)
    shard, offset, size = (np.zeros(n, np.int64) for _ in range(3))
    names = []
    for i in range(n):
        path = records.path(i)
        data = _read(path)
        names.append(layout.member_name(i, _extension(path)).encode())
        shard[i], offset[i] = writer.add(names[-1].decode(), data)
        size[i] = len(data)
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
    fs, root = fsspec.core.url_to_fs(os.path.expanduser(out))

    def put(name: str, data: bytes) -> None:
        try:
            fs.pipe_file(f"{root.rstrip('/')}/{name}", data)
        except OSError as e:
            raise DatasetError(f"{out}/{name}: cannot write ({e.strerror or e})") from e

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
