"""Opening a shard folder's store through fsspec, with timeouts and one retry layer: ours.

An ``s3://`` store is opened with connect and read timeouts (``STORE_TIMEOUTS_S``), so a server that accepts a
request and never answers, or stops sending a body, fails that request within the read timeout instead of
holding a loader worker; botocore's and s3fs's own retries are off, so a request is tried exactly as often as
``cache.fetch_retrying`` says (with the timeouts: a bounded time before the object is named); downloads stream
(one GET read in 64 KB pieces, not ``max_concurrency`` parts held in memory). The user's fsspec configuration
of the protocol (``~/.config/fsspec/*.json``, ``FSSPEC_S3='{...}'``) wins key by key, its ``config_kwargs``
merged into ours. Other stores (``gs://``, ``az://``, a folder) open with their own defaults.

``fetch_file`` downloads one object and gives it up (``SlowFetchError``, which the caller retries) when a window of
``MIN_RATE_WINDOW_S`` brought fewer than ``MIN_RATE_BYTES``: a server that keeps sending a trickle never trips the
read timeout, which counts seconds without a single byte.
"""

from __future__ import annotations

import os
import time
from typing import Any

import fsspec
import fsspec.callbacks
import fsspec.config

from yolo11_lightning.data.sources.config import DatasetError

__all__ = [
    "MIN_RATE_BYTES",
    "MIN_RATE_WINDOW_S",
    "STORE_TIMEOUTS_S",
    "SlowFetchError",
    "fetch_file",
    "open_store",
]

STORE_TIMEOUTS_S = {"connect_timeout": 5.0, "read_timeout": 10.0}
# 256 KiB in 15 s (17 KB/s) is a stalled transfer, not a slow link: a shard of 100 MB would take 1.6 hours.
MIN_RATE_BYTES = 256 * 1024
MIN_RATE_WINDOW_S = 15.0
_S3 = ("s3", "s3a")


def _s3_options() -> dict[str, Any]:
    """The keyword arguments of ``s3fs.S3FileSystem``: ours, then the user's fsspec configuration of s3."""
    user: dict[str, Any] = {}
    for protocol in _S3:
        user |= fsspec.config.conf.get(protocol, {})
    ours = {**STORE_TIMEOUTS_S, "retries": {"total_max_attempts": 1}}
    config = ours | dict(user.get("config_kwargs") or {})
    return {"max_concurrency": 1} | user | {"config_kwargs": config}


def open_store(location: str) -> tuple[Any, str]:
    """The fsspec filesystem of the url or folder ``location`` and its root path (no trailing ``/``);
    DatasetError naming the location when the scheme is unknown or its package is missing."""
    protocol = fsspec.core.split_protocol(location)[0]
    s3 = protocol in _S3
    try:
        fs, root = fsspec.core.url_to_fs(os.path.expanduser(location), **(_s3_options() if s3 else {}))
    except (ImportError, ValueError) as e:  # an unknown scheme, or its package is not installed
        raise DatasetError(f"{location}: cannot open this store ({e})") from e
    if s3:
        fs.retries = 1  # s3fs's retry loop (not an argument of its own): one try per call, ours retry
    return fs, root.rstrip("/")


class SlowFetchError(OSError):
    """A download that brought fewer than ``MIN_RATE_BYTES`` in a window of ``MIN_RATE_WINDOW_S``."""


class _RateFloor(fsspec.callbacks.Callback):
    """fsspec's progress callback of one download, raising ``SlowFetchError`` when a window of
    ``MIN_RATE_WINDOW_S`` ends with fewer than ``MIN_RATE_BYTES`` received in it.

    The check runs as bytes arrive; a window in which none arrive at all is the read timeout's to end.
    """

    def __init__(self) -> None:
        super().__init__()
        self._window_start, self._window_value = time.monotonic(), 0

    def call(self, hook_name: str | None = None, **kwargs: Any) -> None:
        now = time.monotonic()
        if now - self._window_start < MIN_RATE_WINDOW_S:
            return
        received = self.value - self._window_value
        if received < MIN_RATE_BYTES:
            raise SlowFetchError(
                f"{received} bytes in {now - self._window_start:.0f} s, under the floor of {MIN_RATE_BYTES} bytes "
                f"in {MIN_RATE_WINDOW_S:.0f} s"
            )
        self._window_start, self._window_value = now, self.value


def fetch_file(fs: Any, remote: str, local: str) -> None:
    """Download object ``remote`` of the fsspec filesystem ``fs`` to the local file ``local`` (streamed), giving
    up with ``SlowFetchError`` on a transfer under the rate floor."""
    fs.get_file(remote, local, callback=_RateFloor())
