"""Reading a shard folder (``layout``) through fsspec: its index, a split's records, a sample's image bytes.

Start-up reads ``index.json``, the split's wids index and its records file: three objects, never a listing of
the store, whatever the number of samples. The records file is fetched once per node and unpacked into the node's
cache folder as ``.npy`` files every process maps (one copy per node in the page cache). Images are read from the tar shards by the offsets the records
file gives, each shard fetched whole into the node-local ``ShardCache`` first. A shard folder is a url
(``s3://bucket/prefix``, ``gs://``, ``az://``: fsspec with the store's package; credentials from the store's
usual environment and config) or a local folder holding ``index.json``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import shutil
import tempfile
import time
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from yolo11_lightning.data.images.limits import ImageReadError
from yolo11_lightning.data.shards import layout
from yolo11_lightning.data.shards.cache import (
    ShardCache,
    ShardFetchError,
    default_cache_folder,
    fetch_failure,
    fetch_retrying,
)
from yolo11_lightning.data.shards.store import fetch_file, open_store
from yolo11_lightning.data.sources.config import DatasetConfig, DatasetError
from yolo11_lightning.data.sources.label_options import LabelOptions
from yolo11_lightning.data.sources.packed_records import FIELDS, PackedRecords

__all__ = ["ShardImages", "ShardIndex", "is_shard_location", "load_shard_split", "open_index", "shard_config"]

DEFAULT_CACHE_GB = 64.0
OPEN_SHARDS = 32  # per process: shard files kept open for reading (twice the default shard window)
TOUCH_EVERY_S = 1.0  # how often a shard in use refreshes its place in the node cache's LRU order
PREFETCH_THREADS = 2  # per process: shards fetched ahead of use while the samples of the current ones decode


def is_shard_location(dataset: str) -> bool:
    """Whether ``dataset`` names a shard folder: a url (``scheme://``), or a local folder with ``index.json``."""
    if "://" in dataset:
        return True
    return os.path.isfile(os.path.join(os.path.expanduser(dataset), layout.TOP_INDEX))


def read_object(location: str, name: str) -> bytes:
    """Object ``name`` of the shard folder ``location``, retried as shards are (``cache.fetch_retrying``);
    DatasetError naming it when it cannot be read."""
    fs, root = open_store(location)
    try:
        return fetch_retrying(lambda: fs.cat_file(f"{root}/{name}"))
    except Exception as e:  # botocore's and aiohttp's errors are not all OSErrors
        raise DatasetError(f"{location.rstrip('/')}/{name}: cannot read ({fetch_failure(e)})") from e


def _json(location: str, name: str) -> dict[str, Any]:
    data = read_object(location, name)
    try:
        value = json.loads(data)
    except ValueError as e:
        raise DatasetError(f"{location.rstrip('/')}/{name}: not valid json ({e})") from e
    if not isinstance(value, dict):
        raise DatasetError(f"{location.rstrip('/')}/{name}: expected a json object")
    return value


@dataclass(frozen=True)
class ShardIndex:
    """A shard folder's ``index.json``: task, class names, label options and each split's index file.

    ``claim``: (task, evidence) when the source dataset's files said its task (``sources.task_hint``), else None.
    """

    location: str
    task: str
    names: list[str]
    options: LabelOptions
    splits: dict[str, str]
    claim: tuple[str, str] | None = None


def open_index(location: str) -> ShardIndex:
    """The index of the shard folder ``location``; DatasetError naming the file and key when it is not ours."""
    where = f"{location.rstrip('/')}/{layout.TOP_INDEX}"
    raw = _json(location, layout.TOP_INDEX)
    if raw.get("format") != layout.FORMAT or raw.get("version") != layout.VERSION:
        raise DatasetError(
            f"{where}: not a shard index of format {layout.FORMAT} version {layout.VERSION} "
            f"(format {raw.get('format')!r}, version {raw.get('version')!r})"
        )
    names, splits = raw.get("names"), raw.get("splits")
    if not (isinstance(names, list) and names and all(isinstance(n, str) for n in names)):
        raise DatasetError(f"{where}: key `names` must be a non-empty list of class names")
    if not (isinstance(splits, dict) and all(isinstance(v, str) for v in splits.values())):
        raise DatasetError(f"{where}: key `splits` must map split names to index files")
    try:
        options = LabelOptions.from_yaml(raw.get("label_options") or {}, where)
    except ValueError as e:
        raise DatasetError(str(e)) from None
    claim = raw.get("task_claim")
    if claim is not None and not (isinstance(claim, dict) and {"task", "evidence"} <= set(claim)):
        raise DatasetError(f"{where}: key `task_claim` must be null or hold `task` and `evidence`")
    found = None if claim is None else (str(claim["task"]), str(claim["evidence"]))
    return ShardIndex(location, str(raw.get("task") or "detect"), names, options, dict(splits), found)


def shard_config(location: str) -> DatasetConfig:
    """The shard folder ``location`` as a dataset config: its class names, label options and splits (each the
    url of its index file); ``shards`` set."""
    index = open_index(location)
    local = "://" not in location
    root = Path(os.path.expanduser(location)).resolve() if local else Path(".")
    shards = str(root) if local else location.rstrip("/")
    splits = {split: [f"{shards}/{name}"] for split, name in index.splits.items()}
    return DatasetConfig(root=root, splits=splits, names=index.names, options=index.options, shards=shards)


class ShardImages:
    """The image bytes of a split's samples, read from their shards through the node-local cache.

    Picklable (DataLoader workers): the filesystem, the cache and the shard files are opened in each process
    on first use; a sample is one ``pread`` of its shard's open file (``OPEN_SHARDS`` per process). The samples
    of a shard that cannot be fetched fail with the cache's one line (remembered for
    ``cache.RETRY_FAILED_SHARD_S``, then the shard is asked for again).
    """

    def __init__(
        self,
        location: str,
        shards: list[str],
        sizes: dict[str, int],
        where: np.ndarray,
        cache_folder: str | os.PathLike,
        cache_bytes: int,
    ) -> None:
        self.location, self.shards, self.sizes = location.rstrip("/"), shards, sizes
        self.shard, self.offset, self.size = (np.ascontiguousarray(a) for a in where)
        self.cache_folder, self.cache_bytes = str(cache_folder), cache_bytes
        self._cache: ShardCache | None = None
        self._fetcher: ThreadPoolExecutor | None = None
        self._asked: tuple[int | None, set[str]] = (None, set())  # (epoch, shards asked for in it)
        self._open: OrderedDict[str, tuple[io.FileIO, float]] = OrderedDict()  # shard -> (file, touched when)

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__ | {
            "_cache": None,
            "_fetcher": None,
            "_asked": (None, set()),
            "_open": OrderedDict(),
        }

    def prefetch(self, epoch: int, shard_numbers: Iterable[int]) -> None:
        """Fetch these shards into the node cache in the background (each once per epoch and process); a failure
        is remembered by the cache for ``read`` to report."""
        if self._asked[0] != epoch:
            self._asked = (epoch, set())
        for number in shard_numbers:
            name = self.shards[int(number)]
            if name not in self._asked[1]:
                self._asked[1].add(name)
                if self._fetcher is None:
                    self.cache()  # made here, before any thread: one cache (and its memory of failures) a process
                    self._fetcher = ThreadPoolExecutor(PREFETCH_THREADS, thread_name_prefix="shard-prefetch")
                self._fetcher.submit(self._fetch_quietly, name)

    def _fetch_quietly(self, name: str) -> None:
        with contextlib.suppress(ShardFetchError):
            self.cache().path(name)

    def cache(self) -> ShardCache:
        """This process's view of the node-local cache."""
        if self._cache is None:
            fs, root = open_store(self.location)
            self._cache = ShardCache(
                self.cache_folder,
                self.cache_bytes,
                lambda name, path: fetch_file(fs, f"{root}/{name}", str(path)),
                self.sizes,
                where=self.location,
            )
        return self._cache

    def name(self, index: int, member: str) -> str:
        """How messages name sample ``index`` (tar member ``member``): ``<shard url>#<member>``."""
        return f"{self.location}/{self.shards[self.shard[index]]}#{member}"

    def read(self, index: int, member: str) -> bytes:
        """The image bytes of sample ``index``; ImageReadError naming the shard and member when unreadable."""
        shard = self.shards[self.shard[index]]
        offset, size = int(self.offset[index]), int(self.size[index])
        try:
            data = os.pread(self._shard_file(shard, index, member).fileno(), size, offset)
        except OSError as e:
            raise ImageReadError(self.name(index, member), f"cannot read the cached shard ({e})") from e
        if len(data) != size:
            raise ImageReadError(self.name(index, member), f"the shard ends {size - len(data)} bytes early")
        return data

    def _shard_file(self, shard: str, index: int, member: str) -> io.FileIO:
        """This process's open file of ``shard``, fetched into the node cache and opened on first use (the least
        recently read of ``OPEN_SHARDS`` closed); a shard in use refreshes its place in the cache's order at most
        every ``TOUCH_EVERY_S``. An open file reads on if another process evicts the shard meanwhile."""
        now = time.monotonic()
        held = self._open.get(shard)
        if held is not None:
            self._open.move_to_end(shard)
            if now - held[1] >= TOUCH_EVERY_S:
                self._open[shard] = (held[0], now)
                self.cache().touch(shard)
            return held[0]
        try:
            try:
                file = io.FileIO(self.cache().path(shard), "r")
            except FileNotFoundError:  # evicted by another process between the cache's answer and the open
                file = io.FileIO(self.cache().path(shard), "r")
        except ShardFetchError as e:
            raise ImageReadError(self.name(index, member), str(e)) from e
        self._open[shard] = (file, now)
        if len(self._open) > OPEN_SHARDS:
            self._open.popitem(last=False)[1][0].close()
        return file


def _node_records(location: str, name: str, digest: str, folder: Path) -> dict[str, np.ndarray]:
    """The arrays of the records file ``name`` (sha256 ``digest``) as memory maps of ``.npy`` files in the node's
    cache folder: fetched and unpacked once per node (the first process under the lock; the others wait, then map
    the same files), so the ranks and workers of a node share one copy in the page cache."""
    final = folder / f"records-{digest[:32]}"
    fields = (*FIELDS, *layout.LOCATION_FIELDS)
    if not final.is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / f".{final.name}.lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not final.is_dir():
                blob = read_object(location, name)
                if hashlib.sha256(blob).hexdigest() != digest:
                    raise DatasetError(f"{location}/{name}: does not match its index (sha256 differs)")
                staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=folder))
                try:
                    with np.load(io.BytesIO(blob), allow_pickle=False) as z:
                        for field in fields:
                            np.save(staging / f"{field}.npy", z[field], allow_pickle=False)
                    os.replace(staging, final)  # complete or absent: never half a folder
                except (KeyError, ValueError, OSError) as e:
                    raise DatasetError(f"{location}/{name}: unreadable records ({e})") from e
                finally:
                    shutil.rmtree(staging, ignore_errors=True)
    try:
        return {field: np.load(final / f"{field}.npy", mmap_mode="r", allow_pickle=False) for field in fields}
    except (OSError, ValueError) as e:
        raise DatasetError(
            f"{final}: unreadable node copy of {location}/{name} ({e}); delete the folder"
        ) from e


def load_shard_split(
    index: ShardIndex,
    split: str,
    cache_base: str | os.PathLike | None = None,
    cache_gb: float = DEFAULT_CACHE_GB,
) -> tuple[PackedRecords, ShardImages]:
    """The records of ``split`` (paths: the tar members) and the reader of its images.

    Raises DatasetError naming the file when the split is missing, its index or records do not match.
    """
    location = index.location.rstrip("/")
    if split not in index.splits:
        defined = ", ".join(index.splits) or "none"
        raise DatasetError(f"{location}: split `{split}` is not defined (defined: {defined})")
    split_file = index.splits[split]
    raw = _json(location, split_file)
    ours = raw.get(layout.OUR_KEY)
    shardlist = raw.get("shardlist")
    if (
        raw.get("__kind__") != layout.WIDS_KIND
        or not isinstance(ours, dict)
        or not isinstance(shardlist, list)
    ):
        raise DatasetError(f"{location}/{split_file}: not a {layout.WIDS_KIND} index of {layout.FORMAT}")
    try:
        shards = [str(s["url"]) for s in shardlist]
        sizes = {str(s["url"]): int(s["filesize"]) for s in shardlist}
        records_name, digest = str(ours["records"]), str(ours["records_sha256"])
    except (KeyError, TypeError, ValueError) as e:
        raise DatasetError(f"{location}/{split_file}: key {e} missing or malformed in the shard list") from e
    folder = default_cache_folder(location, cache_base)
    arrays = _node_records(location, records_name, digest, folder)
    try:
        records = PackedRecords.from_arrays(arrays)
    except ValueError as e:
        raise DatasetError(f"{location}/{records_name}: unreadable records ({e})") from e
    where = [arrays[name] for name in layout.LOCATION_FIELDS]
    if any(w.dtype != np.int64 or len(w) != len(records) for w in where) or (
        len(records) and not 0 <= where[0].min() <= where[0].max() < len(shards)
    ):
        raise DatasetError(f"{location}/{records_name}: sample locations do not match the shard list")
    folder = default_cache_folder(location, cache_base)
    images = ShardImages(location, shards, sizes, where, folder, int(cache_gb * 2**30))
    return records.with_flip_idx(index.options.flip_idx), images
