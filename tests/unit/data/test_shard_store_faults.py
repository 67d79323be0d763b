"""A real S3 server failing under the shard reader: 5xx answers, dropped connections and stalls, injected by a
proxy (``fault_proxy``) between s3fs and moto (``object_store``).

The shards are written to the server directly; the reader reaches it through the proxy, named by the user's
fsspec configuration of s3 (``fsspec.config.conf``, where ``~/.config/fsspec`` and ``FSSPEC_S3`` land), which
also shortens the read timeout to 1 s. One image per shard, so each fault hits one sample.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import fsspec.config
import pytest
from doc_pages import REPO
from fault_proxy import FaultProxy, fault_proxy
from object_store import s3_server

from yolo11_lightning.data.dataset import BoxDataset
from yolo11_lightning.data.images.limits import ImageReadError
from yolo11_lightning.data.shards import cache as cache_module
from yolo11_lightning.data.shards import store as store_module
from yolo11_lightning.data.shards.reader import ShardImages, load_shard_split, open_index
from yolo11_lightning.data.shards.store import open_store
from yolo11_lightning.data.shards.writer import write_shards
from yolo11_lightning.data.sources.split import dataset_config

BUCKET = "fault-shards"
READ_TIMEOUT_S = 1.0  # long enough for a healthy answer of the in-process server on a busy machine
HANG_GUARD_S = 60  # a read still running after this is a hang: the test fails instead of waiting on it


@pytest.fixture(scope="module")
def served(tiny_dataset: Path) -> Iterator[str]:
    """The tiny set as one-image shards in a moto server; yields the server's endpoint."""
    with s3_server(BUCKET) as endpoint:
        write_shards(dataset_config(tiny_dataset), f"s3://{BUCKET}/tiny", "detect", shard_mb=0.005)
        yield endpoint


@pytest.fixture
def proxy(served: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultProxy]:
    """The proxy in front of the server, set as the s3 endpoint in the user's fsspec configuration."""
    monkeypatch.setattr(cache_module, "FETCH_BACKOFF_S", 0.001)
    with fault_proxy(served) as proxy:
        user = {"endpoint_url": proxy.endpoint, "config_kwargs": {"read_timeout": READ_TIMEOUT_S}}
        monkeypatch.setitem(fsspec.config.conf, "s3", user)
        yield proxy


def _reader(tmp_path: Path) -> tuple[ShardImages, BoxDataset]:
    records, images = load_shard_split(open_index(f"s3://{BUCKET}/tiny"), "train", tmp_path / "cache")
    return images, BoxDataset(records, 64, augment=True, image_bytes=images, retry_backoff_s=0)


def _object(images: ShardImages, index: int) -> str:
    """The request path of sample ``index``'s shard."""
    return f"/{BUCKET}/tiny/{images.shards[int(images.shard[index])]}"


def _guarded(read, *args):
    """``read(*args)`` in a thread, failing the test if it has not ended within ``HANG_GUARD_S``."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(read, *args).result(timeout=HANG_GUARD_S)


def _left_behind(images: ShardImages) -> list[str]:
    return [p.name for p in Path(images.cache_folder).iterdir() if p.name.endswith(".part")]


def test_the_store_is_opened_with_timeouts_one_retry_layer_and_the_users_configuration(proxy: FaultProxy):
    fs, root = open_store(f"s3://{BUCKET}/tiny")
    assert root == f"{BUCKET}/tiny" and fs.endpoint_url == proxy.endpoint  # the user's key kept
    assert fs.config_kwargs["connect_timeout"] == 5.0 and fs.config_kwargs["read_timeout"] == READ_TIMEOUT_S
    assert fs.config_kwargs["retries"] == {"total_max_attempts": 1} and fs.retries == 1
    assert fs.max_concurrency == 1  # one GET streamed to the file, not parts held in memory


def test_the_documented_configuration_changes_the_timeouts_and_retries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/object-storage.md's fsspec configuration file and environment variable, as fsspec reads them."""
    page = (REPO / "docs" / "object-storage.md").read_text()
    (tmp_path / "s3.json").write_text(re.search(r"```json\n(.*?)```", page, re.S).group(1))
    conf: dict = {}
    fsspec.config.set_conf_files(str(tmp_path), conf)
    monkeypatch.setattr(fsspec.config, "conf", conf)
    fs, _ = open_store("s3://bucket/prefix")
    assert fs.config_kwargs == {
        "connect_timeout": 5.0, "read_timeout": 30, "retries": {"mode": "adaptive", "max_attempts": 5},
    }  # fmt: skip
    conf.clear()
    fsspec.config.set_conf_env(conf, {"FSSPEC_S3": re.search(r"`FSSPEC_S3='(.*?)'`", page).group(1)})
    assert conf == {"s3": {"config_kwargs": {"read_timeout": 30}}}
    fs, _ = open_store("s3://bucket/prefix")
    assert fs.config_kwargs["read_timeout"] == 30 and fs.config_kwargs["retries"] == {"total_max_attempts": 1}


def test_5xx_answers_are_retried_then_the_shard_named_and_its_samples_substituted(
    proxy: FaultProxy, tmp_path: Path
) -> None:
    images, dataset = _reader(tmp_path)
    attempts = cache_module.FETCH_ATTEMPTS
    proxy.fail(_object(images, 0), attempts - 1, 503)  # one attempt left: the shard arrives
    proxy.fail(_object(images, 1), attempts, 500)
    sample = _guarded(dataset.__getitem__, (0, 0))
    assert sample["substitute"] == -1 and proxy.gets[_object(images, 0)] == attempts  # no hidden retries

    sample = _guarded(dataset.__getitem__, (0, 1))
    assert sample["substitute"] not in (-1, 1) and sample["image"].shape[1:] == (64, 64)
    ((where, why),) = sample["unreadable"]
    assert where == f"s3://{BUCKET}/tiny/{images.shards[int(images.shard[1])]}#000000001.png"
    assert why.startswith(
        f"s3://{BUCKET}/tiny/{images.shards[int(images.shard[1])]}: cannot fetch the shard after"
    )
    assert proxy.gets[_object(images, 1)] == attempts and "\n" not in why
    with pytest.raises(ImageReadError, match=f"cannot fetch the shard after {attempts} attempts"):
        images.read(1, "000000001.png")  # remembered: not asked again at once
    assert proxy.gets[_object(images, 1)] == attempts and not _left_behind(images)


def test_a_connection_dropped_mid_body_is_retried(proxy: FaultProxy, tmp_path: Path) -> None:
    images, _ = _reader(tmp_path)
    proxy.drop(_object(images, 2), 2)
    assert _guarded(images.read, 2, "000000002.png")[:4] == b"\x89PNG"
    assert proxy.gets[_object(images, 2)] == 3 and not _left_behind(images)


def test_a_stalled_server_becomes_a_retry_then_the_shard_is_named(proxy: FaultProxy, tmp_path: Path) -> None:
    """No answer at all, or headers and half the body then silence: each GET fails after the read timeout (1 s
    here), is retried, and a shard that stalls on every attempt is named; nothing hangs."""
    images, dataset = _reader(tmp_path)
    proxy.stall(_object(images, 3), 1)
    proxy.stall(_object(images, 3), 1, after_headers=True)
    assert _guarded(images.read, 3, "000000003.png")[:4] == b"\x89PNG"
    assert proxy.gets[_object(images, 3)] == 3

    proxy.stall(_object(images, 4), cache_module.FETCH_ATTEMPTS, after_headers=True)
    sample = _guarded(dataset.__getitem__, (0, 4))
    ((where, why),) = sample["unreadable"]
    assert sample["substitute"] not in (-1, 4) and where.endswith("#000000004.png")
    assert f"cannot fetch the shard after {cache_module.FETCH_ATTEMPTS} attempts" in why and "Timeout" in why
    assert proxy.gets[_object(images, 4)] == cache_module.FETCH_ATTEMPTS and not _left_behind(images)


def test_a_trickling_server_is_cut_at_the_rate_floor_then_the_shard_is_named(
    proxy: FaultProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A byte every 0.1 s never leaves the connection silent for the read timeout (1 s here); the rate floor (here
    512 bytes in 0.5 s) ends each such download, which is retried, and a shard that trickles on every attempt is named."""
    monkeypatch.setattr(store_module, "MIN_RATE_BYTES", 512)
    monkeypatch.setattr(store_module, "MIN_RATE_WINDOW_S", 0.5)
    images, dataset = _reader(tmp_path)
    proxy.trickle(_object(images, 5), 1)
    assert _guarded(images.read, 5, "000000005.png")[:4] == b"\x89PNG"
    assert proxy.gets[_object(images, 5)] == 2

    proxy.trickle(_object(images, 6), cache_module.FETCH_ATTEMPTS)
    sample = _guarded(dataset.__getitem__, (0, 6))
    ((where, why),) = sample["unreadable"]
    assert sample["substitute"] not in (-1, 6) and where.endswith("#000000006.png")
    assert (
        f"after {cache_module.FETCH_ATTEMPTS} attempts (SlowFetchError: " in why and "under the floor" in why
    )
    assert proxy.gets[_object(images, 6)] == cache_module.FETCH_ATTEMPTS and not _left_behind(images)
