"""``ShardCache``: shards fetched from their store into a bounded node-local folder, least recently used out.

One folder per shard folder and node (every rank and DataLoader worker of the node shares it). A shard is
downloaded to a temporary file beside its final name and renamed into place only once complete and of the
size its index gives, so no process ever reads half a file; an advisory lock per shard (``fcntl.flock``) makes
the processes of a node download it once. Using a shard refreshes its modification time; after a download the
oldest shards go until the folder is within ``max_bytes`` (the shard just fetched stays, and one in use by
another process survives as an open file until it is closed).

Fetching retries with doubling pauses (a store answering 5xx, a dropped connection, a short read); an object
that does not exist or that the credentials may not read fails at once. Either way the error is one line naming
the object (``ShardFetchError``).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["ShardCache", "ShardFetchError", "default_cache_folder", "fetch_failure", "fetch_retrying"]

FETCH_ATTEMPTS = 4
FETCH_BACKOFF_S = 0.25  # pauses of 0.25, 0.5, 1 s between the attempts


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


def fetch_retrying(
    fetch: Callable[[], bytes], attempts: int | None = None, backoff_s: float | None = None
) -> bytes:
    """``fetch()`` tried ``attempts`` times (default ``FETCH_ATTEMPTS``) with doubling pauses from ``backoff_s``
    (default ``FETCH_BACKOFF_S``); a missing object, refused or missing credentials (``_permanent``) are raised at
    once, the last error after the attempts."""
    attempts = FETCH_ATTEMPTS if attempts is None else attempts
    backoff_s = FETCH_BACKOFF_S if backoff_s is None else backoff_s
    for attempt in range(attempts):
        try:
            return fetch()
        except Exception as e:  # the store's errors are of many kinds (botocore, aiohttp, OSError)
            if _permanent(e) or attempt + 1 >= attempts:
                raise
            time.sleep(backoff_s * 2**attempt)
    raise ValueError(f"attempts must be >= 1, got {attempts}")


def fetch_failure(error: BaseException) -> str:
    """An error of a fetch in words: its kind and its message."""
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


class ShardCache:
    """Shards of one shard folder in a node-local folder of at most ``max_bytes``.

    ``fetch(name) -> bytes`` reads one object of the shard folder (through fsspec in practice; any callable in
    tests); ``sizes`` gives each shard's expected size (from the index), checked after every download.
    """

    def __init__(
        self,
        folder: str | os.PathLike,
        max_bytes: int,
        fetch: Callable[[str], bytes],
        sizes: dict[str, int],
        *,
        attempts: int | None = None,
        backoff_s: float | None = None,
        where: str = "",
    ) -> None:
        if max_bytes <= 0:
            raise ValueError(f"the shard cache needs a positive size, got {max_bytes} bytes")
        self.folder, self.max_bytes, self.fetch, self.sizes = Path(folder), max_bytes, fetch, sizes
        self.attempts = FETCH_ATTEMPTS if attempts is None else attempts
        self.backoff_s = FETCH_BACKOFF_S if backoff_s is None else backoff_s
        self.where = where.rstrip("/")
        self.downloads = 0  # fetched by this process (statistics, tests)

    def path(self, name: str) -> Path:
        """The local file of shard ``name``, fetched first when the folder lacks it (ShardFetchError if it
        cannot be)."""
        local = self.folder / name
        if self._fresh(local, name):
            return local
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / f".{name}.lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # the node's other processes wait here, then find it fetched
            if not self._fresh(local, name):
                self._download(name, local)
                self._evict(keep=local)
        return local

    def _fresh(self, local: Path, name: str) -> bool:
        try:
            _touch(local)  # used now: the last one to go
        except FileNotFoundError:
            return False
        return True

    def _download(self, name: str, local: Path) -> None:
        expected = self.sizes.get(name)
        label = f"{self.where}/{name}" if self.where else name

        def fetch() -> bytes:
            data = self.fetch(name)
            if expected is not None and len(data) != expected:
                raise OSError(f"got {len(data)} bytes, the index says {expected}")
            return data

        try:
            data = fetch_retrying(fetch, self.attempts, self.backoff_s)
        except Exception as e:  # the store's errors are of many kinds (botocore, aiohttp, OSError)
            tries = "" if _permanent(e) else f" after {self.attempts} attempts"
            raise ShardFetchError(f"{label}: cannot fetch the shard{tries} ({fetch_failure(e)})") from e
        tmp = local.with_name(f".{name}.{os.getpid()}.part")
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, local)
            _touch(local)
        finally:
            tmp.unlink(missing_ok=True)
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
