"""One image cache per node (data.node_cache, data.shm_segment, data.disk_cache): one shared segment for 2 gloo ranks and their workers, the
batches of the uncached run, crashes and stale segments."""

from __future__ import annotations

import json
import logging
import os
import pickle
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_runs import SCRIPTS, run, tail

from yolo11_lightning.data.dataset import BoxDataset
from yolo11_lightning.data.images import cache as image_cache
from yolo11_lightning.data.images import node_cache
from yolo11_lightning.data.images.node_cache import RankGroup, attach_image_caches
from yolo11_lightning.data.images.shm_segment import (
    PREFIX,
    SegmentHeader,
    SegmentPart,
    boot_id,
    process_start,
    read_header,
    stale_reason,
    sweep_stale_segments,
)
from yolo11_lightning.data.sources.config import load_dataset_config
from yolo11_lightning.data.sources.split import load_split

SCRIPT = SCRIPTS / "node_cache_run.py"


@pytest.fixture(scope="module")
def shm_dir():
    """A private folder in the real /dev/shm (tmpfs, so PSS means what it means in production)."""
    if not os.access("/dev/shm", os.W_OK):
        pytest.skip("no writable /dev/shm")
    folder = Path("/dev/shm") / f"yolo11-test-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _wait_stale(path: Path, seconds: float = 30.0) -> str | None:
    """The reason ``path`` is stale once every process of the crashed run has exited (polled, bounded)."""
    deadline = time.monotonic() + seconds
    while (why := stale_reason(path)) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    return why


# A process building the cache of the train split, SIGKILLed by itself at its 3rd image: it holds the segment.
_CRASH = """
import os, signal, sys
from yolo11_lightning.data.dataset import BoxDataset
from yolo11_lightning.data.images.node_cache import attach_image_caches
from yolo11_lightning.data.sources.config import load_dataset_config
from yolo11_lightning.data.sources.split import load_split
config = load_dataset_config(sys.argv[1])
dataset, calls = BoxDataset(load_split(config, "train")[0], 64, augment=True), []
load = dataset.load_resized
def dying(index):
    calls.append(index)
    if len(calls) == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    return load(index)
dataset.load_resized = dying
attach_image_caches([dataset])
"""


@pytest.fixture(scope="module")
def two_rank_runs(tiny_dataset: Path, shm_dir: Path, tmp_path_factory) -> dict:
    """A process SIGKILLed while it builds a cache, then a 2-rank run with the cache in the same folder."""
    root = tmp_path_factory.mktemp("node_cache")
    env = {"YOLO11_SHM_DIR": str(shm_dir)}
    crashed = run([sys.executable, "-c", _CRASH, str(tiny_dataset)], root, 60, **env)
    left = sorted(shm_dir.iterdir())
    reason = _wait_stale(left[0]) if len(left) == 1 else None
    header = read_header(left[0]) if len(left) == 1 else None
    normal = run([sys.executable, str(SCRIPT), str(tiny_dataset), str(root / "normal")], root, 120, **env)
    ranks = (
        [json.loads((root / "normal" / f"rank{r}.json").read_text()) for r in (0, 1)]
        if not normal.returncode
        else []
    )
    return {"crashed": crashed, "left": left, "reason": reason, "header": header, "normal": normal, "ranks": ranks,
            "after": sorted(shm_dir.iterdir())}  # fmt: skip


def test_a_crash_during_the_build_leaves_a_segment_that_is_detected_as_stale(two_rank_runs: dict) -> None:
    assert two_rank_runs["crashed"].returncode == -9, tail(two_rank_runs["crashed"])
    assert len(two_rank_runs["left"]) == 1, two_rank_runs["left"]  # it held the name when it died
    header = two_rank_runs["header"]
    assert header is not None and not header.complete and len(header.owners) == 1
    assert "incomplete, and none of its owner processes" in (two_rank_runs["reason"] or "")


def test_the_next_run_replaces_the_stale_segment_and_leaves_nothing_named(two_rank_runs: dict) -> None:
    normal = two_rank_runs["normal"]
    assert normal.returncode == 0, tail(normal)
    log = normal.stdout + normal.stderr
    assert f"removed stale segment {two_rank_runs['left'][0]}" in log, tail(normal)
    assert log.count("image cache: one copy per node") == 1, tail(normal)  # local rank 0 of the one node
    assert two_rank_runs["after"] == []
    assert all(
        r["named_segments"] == [] for r in two_rank_runs["ranks"]
    )  # unlinked once every rank mapped it


def test_two_ranks_and_their_workers_map_one_segment_within_one_copy_of_pss(two_rank_runs: dict) -> None:
    ranks = two_rank_runs["ranks"]
    assert ranks, tail(two_rank_runs["normal"])
    maps: dict[str, list[dict]] = {}
    for r in ranks:
        maps.update(r["maps"])  # by pid: rank 0 sees rank 1 (its child) too
    assert all(maps[str(r["pid"])] for r in ranks), "each rank maps the cache"
    assert len([pid for pid, m in maps.items() if m]) >= 4, "2 ranks and at least one worker each"
    mappings = [m for ms in maps.values() for m in ms]
    assert len({m["inode"] for m in mappings}) == 1, "exactly one shared segment"
    copy_kb = mappings[0]["size"]
    pss_kb = sum(m["pss"] for m in mappings)
    assert 0.5 * copy_kb <= pss_kb <= 1.2 * copy_kb, (pss_kb, copy_kb)


def test_batches_from_the_shared_cache_equal_the_uncached_ones(two_rank_runs: dict) -> None:
    ranks = two_rank_runs["ranks"]
    assert ranks, tail(two_rank_runs["normal"])
    for r in ranks:
        assert len(r["same"]) >= 3 and all(r["same"]), r["same"]  # 2 train batches + 1 validation batch


# ------------------------------------------------------------------------------------ in-process
def _header(owners: tuple[tuple[int, int], ...], boot: bytes | None = None, complete: bool = True) -> bytes:
    return SegmentHeader(7, 10, 1, boot or boot_id(), bytes(32), 0, 1, complete, owners).pack() + bytes(10)


def test_stale_segments_are_removed_and_live_or_foreign_ones_kept(tmp_path: Path) -> None:
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead = int(gone.stdout)
    me = (os.getpid(), process_start(os.getpid()))
    files = {
        "dead-owner": _header(((dead, 1),)),
        "rebooted": _header((me,), boot=b"\1" * 16),
        "live": _header((me,), complete=False),  # being built by a living process
        "garbage": b"not a segment",
    }
    for name, content in files.items():
        (tmp_path / f"{PREFIX}{name}").write_bytes(content)
    (tmp_path / f"{PREFIX}x.tmp-{dead}-1").write_bytes(b"")  # a creation cut short
    (tmp_path / f"{PREFIX}y.tmp-{me[0]}-{me[1]}").write_bytes(b"")  # one under way
    (tmp_path / "unrelated").write_bytes(_header(((dead, 1),)))
    removed = dict(sweep_stale_segments(tmp_path))
    assert set(removed) == {f"{PREFIX}dead-owner", f"{PREFIX}rebooted", f"{PREFIX}x.tmp-{dead}-1"}
    assert "none of its owner processes" in removed[f"{PREFIX}dead-owner"]
    assert "rebooted" in removed[f"{PREFIX}rebooted"]
    left = {p.name for p in tmp_path.iterdir()}
    assert left == {f"{PREFIX}live", f"{PREFIX}garbage", f"{PREFIX}y.tmp-{me[0]}-{me[1]}", "unrelated"}


@pytest.fixture(scope="module")
def splits(tiny_dataset: Path) -> tuple[list, list]:
    config = load_dataset_config(tiny_dataset)
    return load_split(config, "train")[0], load_split(config, "val")[0]


def _datasets(splits: tuple[list, list], train_records: list | None = None) -> list[BoxDataset]:
    train, val = splits
    return [
        BoxDataset(train_records or train, 64, augment=True, seed=1, global_batch_size=8),
        BoxDataset(val, 64, augment=False),
    ]


def test_one_process_cache_equals_the_files_survives_pickling_and_flags_unreadable_images(
    splits: tuple[list, list], tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("YOLO11_SHM_DIR", str(tmp_path / "shm"))
    (tmp_path / "shm").mkdir()
    train = list(splits[0])
    gone = tmp_path / "gone.png"
    shutil.copy(train[3].path, gone)
    train[3] = type(train[3])(str(gone), train[3].height, train[3].width, train[3].classes, train[3].boxes)
    cached, plain = _datasets(splits, train), _datasets(splits, train)
    gone.unlink()  # unreadable before the build: the cache flags it, the Dataset substitutes as without one
    attach_image_caches(cached)
    assert isinstance(cached[0].image_cache.storage, SegmentPart)
    assert list((tmp_path / "shm").iterdir()) == []  # the name is gone once mapped; the memory is not
    assert cached[0].image_cache.unreadable().tolist() == [i == 3 for i in range(len(train))]
    for a, b in zip(cached, plain):
        for item in [(2, i) for i in range(len(a))] if a.augment else range(len(a)):
            x, y = a[item], b[item]
            assert torch.equal(x["image"], y["image"]) and torch.equal(x["labels"], y["labels"])
            assert x["substitute"] == y["substitute"]
    # What a spawn-started worker receives: the rank's open descriptor, mapped again read-only.
    copy = pickle.loads(pickle.dumps(cached[1].image_cache))
    assert not copy.storage.segment.writable
    assert all(np.array_equal(copy[i], cached[1].image_cache[i]) for i in range(len(copy)))


def test_without_shm_each_process_keeps_its_own_copy(
    splits: tuple[list, list], tmp_path: Path, monkeypatch, caplog
) -> None:
    monkeypatch.setenv("YOLO11_SHM_DIR", str(tmp_path / "absent"))
    cached, plain = _datasets(splits), _datasets(splits)
    with caplog.at_level(logging.INFO, logger="yolo11_lightning.data.images.node_cache"):
        attach_image_caches(cached)
    assert isinstance(cached[1].image_cache.storage, torch.Tensor)
    assert "one copy per rank" in caplog.text and "absent does not exist" in caplog.text
    assert torch.equal(cached[1][0]["image"], plain[1][0]["image"])


def test_the_memory_check_counts_one_copy_per_node(
    splits: tuple[list, list], tmp_path: Path, monkeypatch
) -> None:
    datasets = _datasets(splits)
    total = node_cache.plan_layout(datasets).storage_bytes
    monkeypatch.setattr(image_cache, "available_memory_bytes", lambda: int(1.5 * total / 0.7))  # 1.5 copies
    monkeypatch.setattr(image_cache, "PROC_SELF_CGROUP", str(tmp_path / "none"))  # no container limit
    group = RankGroup(local_world=2)  # 2 ranks on this node (a world of 1: no collective is needed)
    (tmp_path / "shm").mkdir()
    monkeypatch.setenv("YOLO11_SHM_DIR", str(tmp_path / "shm"))
    assert len(node_cache.build_image_caches(datasets, group)) == 2  # one copy for the node fits
    monkeypatch.setenv("YOLO11_SHM_DIR", str(tmp_path / "absent"))  # a copy per rank does not
    with pytest.raises(MemoryError, match=r"per process x 2 process\(es\)"):
        node_cache.build_image_caches(datasets, group)


def test_a_segment_is_owned_from_its_creation(splits: tuple[list, list], tmp_path: Path) -> None:
    datasets = _datasets(splits)
    node_cache._create(tmp_path, datasets, node_cache.plan_layout(datasets), 5, RankGroup())
    (path,) = tmp_path.iterdir()  # before any rank registered: a sweep of another job must leave it
    assert read_header(path).owners == ((os.getpid(), process_start(os.getpid())),)
    assert stale_reason(path) is None and sweep_stale_segments(tmp_path) == []


def test_disk_cache_is_written_once_beside_the_labels_and_reused_without_decoding(
    tmp_path: Path, monkeypatch
) -> None:
    from yolo11_lightning.synthetic.shapes import make_synthetic_dataset
    from yolo11_lightning.training.datamodule import YOLODataModule

    yaml = make_synthetic_dataset(
        tmp_path / "ds", num_train=8, num_val=3, image_size=64, num_classes=2, seed=0
    )
    options = {"dataset": str(yaml), "batch_size": 4, "image_size": 64, "num_workers": 0, "pin_memory": False}
    plain, disk = YOLODataModule(**options), YOLODataModule(**options, cache_images="disk")
    plain.prepare_data()
    for dm in (plain, disk):
        dm.setup("fit")
    files = sorted(p.name for p in (tmp_path / "ds").rglob("*.npy"))
    assert len(files) == 2 and all(".images-" in f for f in files), files  # train, val; no .tmp left over
    assert not list((tmp_path / "ds").rglob("*.tmp-*"))

    def batches(dm: YOLODataModule) -> list[dict]:
        return [next(iter(dm.train_dataloader())), next(iter(dm.val_dataloader()))]

    expected = batches(plain)
    load = BoxDataset.load_resized

    def cached_only(self: BoxDataset, index: int):
        assert self.image_cache is not None, "decoded again"
        return load(self, index)

    monkeypatch.setattr(BoxDataset, "load_resized", cached_only)
    again = YOLODataModule(**options, cache_images="disk")
    again.setup("fit")  # the files are complete: mapped, nothing decoded
    for dm in (disk, again):
        for a, b in zip(expected, batches(dm)):
            assert torch.equal(a["images"], b["images"]) and torch.equal(a["targets"], b["targets"])
    with pytest.raises(ValueError, match="cache_images must be"):
        YOLODataModule(**options, cache_images="ram")
