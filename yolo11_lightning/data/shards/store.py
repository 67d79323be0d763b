"""Opening a shard folder's store through fsspec, with timeouts and one retry layer: ours.

An ``s3://`` store is opened with connect and read timeouts (``STORE_TIMEOUTS_S``), so a server that accepts a
request and never answers, or stops sending a body, fails that request within the read timeout instead of
holding a loader worker; botocore's and s3fs's own retries are off, so a request is tried exactly as often as
``cache.fetch_retrying`` says (with the timeouts: a bounded time before the object is named); downloads stream
(one GET read in 64 KB pieces, not ``max_concurrency`` parts held in memory). The user's fsspec configuration
of the protocol (``~/.config/fsspec/*.json``, ``FSSPEC_S3='{...}'``) wins key by key, its ``config_kwargs``
merged into ours. Other stores (``gs://``, ``az://``, a folder) open with their own defaults.
"""

from __future__ import annotations

import os
from typing import Any

import fsspec
import fsspec.config

from yolo11_lightning.data.sources.config import DatasetError

__all__ = ["STORE_TIMEOUTS_S", "open_store"]

STORE_TIMEOUTS_S = {"connect_timeout": 5.0, "read_timeout": 10.0}
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
