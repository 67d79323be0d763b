"""``ShardCache``: shards fetched from their store into a bounded node-local folder, least recently used out.

One folder per shard folder and node (every rank and DataLoader worker of the node shares it). A shard is
streamed to a temporary file beside its final name (never whole in memory) and renamed into place only once
complete and of the size its index gives, so no process ever reads half a file; an advisory lock per shard
(``fcntl.flock``) makes the processes of a node download it once. Asking for a shard (``path``) and ``touch``
refresh its modification time; after a download the oldest shards go until the folder is within ``max_bytes``
(the shard just fetched stays, and one in use by another process survives as an open file until it is closed).

Fetching retries with doubling pauses (a store answering 5xx, a dropped connection, a stalled read, a short
download); an object that does not exist or that the credentials may not read fails at once. Either way the
error is one line naming the object (``ShardFetchError``), and the process gives the same error for that shard
without asking the store for ``retry_failed_s`` (its threads included: a prefetch's failure is the read's that
waited on it; a store's outage may end, so it asks again after that). The store's timeouts
(``store.open_store``) turn a stalled server into such an error, so a fetch ends within ``attempts`` x the
read timeout plus the pauses.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

__all__ = ["ShardCache", "ShardFetchError", "default_cache_folder", "fetch_failure", "fetch_retrying"]

# An object store sheds load with 503 SlowDown for seconds at a time: 6 attempts with doubling, jittered pauses
# (about 0.25, 0.5, 1, 2, 4 s, each drawn from half to all of it) ride that out, and ranks that failed together do
# not retry together.
FETCH_ATTEMPTS = 6
FETCH_BACKOFF_S = 0.25
RETRY_FAILED_SHARD_S = 60.0  # a shard that could not be fetched is not asked for again this long
T = TypeVar("T")


def _touch(path: Path) -> None:
    """Set the modification time to now at full resolution (the kernel's own clock for files is coarse)."""
    now = time.time_ns()
    os.utime(path, ns=(now, now))


class ShardFetchError(OSError):
    """A shard that could not be fetched; the message names the object and why."""


def default_cache_folder(location: str, base: str | os.PathLike | None = None) -> Path:
    """The node-local cache folder of the shard folder ``location``: ``<base>/shards/<hash of location>``
    (base: ``$XDG_CACHE_HOME/yolo11_lightning``, default ``~/.cache/yolo11_lightning``)."""
    if base is None:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "yolo11_lightning"
    return Path(base) / "shards" / hashlib.sha1(location.encode()).hexdigest()[:16]


def _permanent(error: BaseException) -> bool:
    """Whether retrying cannot help: the object is missing, the credentials may not read it (s3fs: a
    PermissionError), or there are none (botocore's ``NoCredentialsError``, ``PartialCredentialsError``)."""
    return isinstance(error, (FileNotFoundError, PermissionError)) or type(error).__name__.endswith(
        "CredentialsError"
    )


def fetch_retrying(fetch: Callable[[], T], attempts: int | None = None, backoff_s: float | None = None) -> T:
    """``fetch()`` tried ``attempts`` times (default ``FETCH_ATTEMPTS``) with doubling pauses from ``backoff_s``
    (default ``FETCH_BACKOFF_S``), each drawn from half to all of its value; a missing object, refused or missing
    credentials (``_permanent``) are raised at once, the last error after the attempts."""
    attempts = FETCH_ATTEMPTS if attempts is None else attempts
    backoff_s = FETCH_BACKOFF_S if backoff_s is None else backoff_s
    for attempt in range(attempts):
        try:
            return fetch()
        except Exception as e:  # the store's errors are of many kinds (botocore, aiohttp, OSError)
            if _permanent(e) or attempt + 1 >= attempts:
                raise
            time.sleep(backoff_s * 2**attempt * random.uniform(0.5, 1.0))
    raise ValueError(f"attempts must be >= 1, got {attempts}")


def fetch_failure(error: BaseException) -> str:
    """An error of a fetch in words: its kind and its message."""
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


class ShardCache:
    """Shards of one shard folder in a node-local folder of at most ``max_bytes``.

    ``fetch(name, path)`` writes object ``name`` of the shard folder to the local file ``path`` (fsspec's
    ``get_file`` in practice; any callable in tests); ``sizes`` gives each shard's expected size (from the
    index), checked after every download.
    """

    def __init__(
        self,
        folder: str | os.PathLike,
        max_bytes: int,
        fetch: Callable[[str, Path], None],
        sizes: dict[str, int],
        *,
        attempts: int | None = None,
        backoff_s: float | None = None,
        where: str = "",
        retry_failed_s: float = RETRY_FAILED_SHARD_S,
    ) -> None:
        if max_bytes <= 0:
            raise ValueError(f"the shard cache needs a positive size, got {max_bytes} bytes")
        self.folder, self.max_bytes, self.fetch, self.sizes = Path(folder), max_bytes, fetch, sizes
        self.attempts = FETCH_ATTEMPTS if attempts is None else attempts
        self.backoff_s = FETCH_BACKOFF_S if backoff_s is None else backoff_s
        self.where, self.retry_failed_s = where.rstrip("/"), retry_failed_s
        self.downloads = 0  # fetched by this process (statistics, tests)
        self._failed: dict[str, tuple[str, float]] = {}  # shard -> (why, when) of this process's last failure

    def path(self, name: str) -> Path:
        """The local file of shard ``name``, fetched first when the folder lacks it (ShardFetchError if it
        cannot be)."""
        local = self.folder / name
        if self._fresh(local, name):
            return local
        self._check_failed(name)
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / f".{name}.lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # the node's other processes wait here, then find it fetched
            if not self._fresh(local, name):
                self._check_failed(name)  # a thread of this process may have failed while this one waited
                try:
                    self._download(name, local)
                except ShardFetchError as e:
                    self._failed[name] = (str(e), time.monotonic())
                    raise
                self._evict(keep=local)
        return local

    def _check_failed(self, name: str) -> None:
        """Raise this process's last failure of shard ``name`` again if it is recent."""
        failed = self._failed.get(name)
        if failed is not None and time.monotonic() - failed[1] < self.retry_failed_s:
            raise ShardFetchError(failed[0])

    def touch(self, name: str) -> None:
        """Mark shard ``name`` used now (the last to go); nothing if it is not in the folder."""
        with contextlib.suppress(FileNotFoundError):
            _touch(self.folder / name)

    def _fresh(self, local: Path, name: str) -> bool:
        try:
            _touch(local)  # used now: the last one to go
        except FileNotFoundError:
            return False
        return True

    def _download(self, name: str, local: Path) -> None:
        expected = self.sizes.get(name)
        label = f"{self.where}/{name}" if self.where else name
        tmp = local.with_name(f".{name}.{os.getpid()}.part")

        def fetch() -> None:
            self.fetch(name, tmp)  # a failed attempt's partial file is overwritten by the next
            got = tmp.stat().st_size
            if expected is not None and got != expected:
                raise OSError(f"got {got} bytes, the index says {expected}")

        try:
            try:
                fetch_retrying(fetch, self.attempts, self.backoff_s)
            except Exception as e:  # the store's errors are of many kinds (botocore, aiohttp, OSError)
                tries = "" if _permanent(e) else f" after {self.attempts} attempts"
                raise ShardFetchError(f"{label}: cannot fetch the shard{tries} ({fetch_failure(e)})") from e
            os.replace(tmp, local)
        finally:
            tmp.unlink(missing_ok=True)
        _touch(local)
        self.downloads += 1

    def _evict(self, keep: Path) -> None:
        """Remove the least recently used shards until the folder holds at most ``max_bytes``."""
        entries = []
        for entry in os.scandir(self.folder):
            if entry.name.startswith(".") or not entry.is_file():
                continue
            stat = entry.stat()
            entries.append((stat.st_mtime_ns, entry.path, stat.st_size))
        total = sum(size for _, _, size in entries)
        for _, path, size in sorted(entries):
            if total <= self.max_bytes:
                break
            if path != str(keep):
                Path(path).unlink(missing_ok=True)
                total -= size
