"""The label check and cache at a few thousand images: an exact round trip, records shared by DataLoader workers
without copies, and ranks that wait for rank 0's build longer than the process group's timeout."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
from torch.utils.data import DataLoader, Dataset

from yolo11_lightning.data.dataset import BoxDataset
from yolo11_lightning.data.sources.config import load_dataset_config
from yolo11_lightning.data.sources.packed_records import FIELDS, PackedRecords
from yolo11_lightning.data.sources.split import load_split
from yolo11_lightning.structures.records import ImageRecord

SCRIPT = Path(__file__).resolve().parents[2] / "helpers" / "scripts" / "cache_wait_run.py"
IMAGES = 2100  # runs of the check (``yolo.RUN_IMAGES``) in two worker processes, or in this one


def _dataset(root: Path, count: int = IMAGES) -> Path:
    """``count`` tiny JPEGs with box rows, and among them every kind of problem the check reports."""
    rng = np.random.default_rng(0)
    ok, jpeg = cv2.imencode(".jpg", rng.integers(0, 255, (24, 32, 3), dtype=np.uint8))
    assert ok
    images, labels = root / "images" / "train", root / "labels" / "train"
    images.mkdir(parents=True)
    labels.mkdir(parents=True)
    special = {
        5: "0 0.5 0.5 0.2 0.2\n9 0.5 0.5 0.2 0.2\n",  # class out of range
        6: "1 0.5 0.5 0.2 0.2\n1 0.5 0.5 0.2 0.2\n",  # duplicate
        7: "2 0.95 0.5 0.2 0.2\n",  # clipped
        8: "0 0.1 0.1 0.4 0.1 0.3 0.4\n1 0.5 0.5 0.1 0.1\n",  # a polygon and a box
        9: "0 0.5 zero 0.2 0.2\n\n3 0.2 0.2 0.1 0.1\n",  # not a number, a blank line
        2050: "0 0.5 0.5 0.2 0.2 0.1\n",  # a wrong number of values, in the second run
    }
    for i in range(count):
        data = jpeg.tobytes()[:100] if i in (11, 2060) else jpeg.tobytes()  # truncated
        (images / f"{i:05d}.jpg").write_bytes(data)
        if i in (12, 2070):
            continue  # background: no label file
        n = 1 + i % 3
        rows = "".join(f"{(i + k) % 4} {0.3 + 0.1 * k:.3f} 0.5 0.1 0.2\n" for k in range(n))
        (labels / f"{i:05d}.txt").write_text(special.get(i, rows))
    names = "".join(f"  {i}: c{i}\n" for i in range(4))
    (root / "data.yaml").write_text(f"path: {root}\ntrain: images/train\nval: images/train\nnames:\n{names}")
    return root / "data.yaml"


def test_cache_round_trip_is_exact_and_processes_change_nothing(tmp_path: Path) -> None:
    config = load_dataset_config(_dataset(tmp_path))
    one, one_report = load_split(config, "train", use_cache=False, verbose=False, workers=1)
    built, report = load_split(config, "train", verbose=False, workers=2)  # two processes, then the cache
    read, cached = load_split(config, "train", verbose=False)
    assert not report.from_cache and cached.from_cache and isinstance(read, PackedRecords)
    assert len(read) == IMAGES - 2 and read.num_polygons() == 1
    for other in (built, read):  # every array equal, dtype included
        for name in FIELDS:
            a, b = one.arrays()[name], other.arrays()[name]
            assert a.dtype == b.dtype and np.array_equal(a, b), name
    for rec_a, rec_b in zip(one, read):  # and record by record
        assert (rec_a.path, rec_a.height, rec_a.width) == (rec_b.path, rec_b.height, rec_b.width)
        for field in ("classes", "boxes", "segments", "segment_sizes"):
            assert np.array_equal(getattr(rec_a, field), getattr(rec_b, field))
    as_dicts = [r.to_dict() | {"cache_path": None, "from_cache": None} for r in (one_report, report, cached)]
    assert as_dicts[0] == as_dicts[1] == as_dicts[2]
    assert one_report.num_skipped_images == 2 and one_report.num_skipped_rows == 4
    assert one_report.num_clipped_rows == 1 and one_report.num_background == 3  # 2 without labels, 1 all bad
    assert any(w.endswith("00009.txt:1: not a number: 'zero'") for w in one_report.warnings)
    assert any("02050.txt:1: expected 5 values" in w for w in one_report.warnings)
    numbers = [int(re.search(r"/(\d{5})\.", w).group(1)) for w in one_report.warnings]
    assert numbers == sorted(numbers) and 11 in numbers and 2060 in numbers  # in the images' order


def _uss_mib() -> float:
    """This process's unique memory (Private_Clean + Private_Dirty of /proc/self/smaps_rollup), MiB."""
    fields = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]:
        key, value = line.split(":", 1)
        fields[key] = int(value.split()[0])
    return (fields["Private_Clean"] + fields["Private_Dirty"]) / 1024


class _TouchAll(Dataset):
    """Item 0: a worker's USS growth (MiB) while it builds every record of ``records`` once."""

    def __init__(self, records) -> None:
        self.records = records

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> float:
        before = _uss_mib()
        touched = sum(len(self.records[i].classes) for i in range(len(self.records)))
        assert touched >= len(self.records)
        return _uss_mib() - before


def _worker_growth(records) -> float:
    loader = DataLoader(_TouchAll(records), batch_size=None, num_workers=1, multiprocessing_context="fork")
    return float(next(iter(loader)))


def _records(count: int) -> list[ImageRecord]:
    boxes = np.array([[0.5, 0.5, 0.2, 0.2], [0.3, 0.3, 0.1, 0.1]], np.float32)
    return [ImageRecord(f"/data/images/{i:07d}.jpg", 48, 64, [i % 8, 1], boxes) for i in range(count)]


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="needs Linux's /proc smaps_rollup")
def test_dataloader_workers_share_the_records() -> None:
    small, large = _records(2_000), _records(40_000)
    packed_small = BoxDataset(PackedRecords(small), 64).records
    packed_large = BoxDataset(PackedRecords(large), 64).records
    # A list of record objects: touching them copies their pages into the worker (the measure works).
    assert _worker_growth(large) > 4.0
    # Packed arrays: a worker that builds every record once grows by less than 1 MiB, whatever the count.
    growth_small, growth_large = _worker_growth(packed_small), _worker_growth(packed_large)
    assert growth_large < 1.0 and growth_large - growth_small < 0.5, (growth_small, growth_large)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_other_ranks_wait_for_rank_0_past_the_collective_timeout(tmp_path: Path) -> None:
    yaml = _dataset(tmp_path / "ds", 40)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    port = str(_free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, str(SCRIPT), str(rank), port, str(yaml), str(tmp_path)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-3000:] for o in outputs)
    zero, one = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    # Rank 0's failure reaches rank 1 as the same one-line error, after rank 0 failed (no hang, no timeout).
    assert zero["first"] == one["first"] == "DatasetError: data.yaml:3: a made-up problem on rank 0"
    # Then rank 1 waits for rank 0's build longer than the timeout, reads its cache, checks nothing itself.
    assert one["second_s"] > one["timeout_s"]
    assert zero["images"] == one["images"] == 39 and zero["checked_images"] == 80  # train, and val (the same)
    assert one["checked_images"] == 0


class _DictStore:
    """The two calls of a torch.distributed Store that ``build_once`` makes."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    def check(self, keys: list[str]) -> bool:
        return all(k in self.values for k in keys)

    def get(self, key: str) -> bytes:
        return self.values[key]

    def set(self, key: str, value: bytes) -> None:
        self.values[key] = value


def test_two_nodes_one_build_each_without_a_shared_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """2 nodes x 2 ranks, the cache node-local: rank 0 builds, node 1's local rank 0 builds its own, the others
    read; then rank 0 fails and every rank raises its message. Ranks run one after the other in an order where
    each finds what it waits for already set."""
    import itertools

    from yolo11_lightning.data import build_once
    from yolo11_lightning.data.images.node_cache import RankGroup
    from yolo11_lightning.data.sources.config import DatasetError

    store = _DictStore()
    monkeypatch.setattr(build_once, "_store", lambda: store)
    monkeypatch.setattr(build_once.torch.distributed, "is_initialized", lambda: True)
    caches: dict[int, bool] = {}  # node -> its cache exists
    done: list[str] = []

    def run(rank: int, fail: bool = False) -> str:
        node = rank // 2
        group = RankGroup(rank, 4, rank % 2, 2, node)

        def work() -> str:
            if fail:
                raise DatasetError("data.yaml: broken\nsecond line")
            how = "read" if caches.get(node) else "built"
            caches[node] = True
            done.append(f"rank {rank} {how}")
            return how

        return build_once.run_once_per_node(group, "train labels", work)

    for call, fail in ((0, False), (1, True)):
        answers = []
        for rank in (0, 2, 1, 3):  # rank 0, node 1's local rank 0, then the rest
            monkeypatch.setattr(build_once, "_calls", itertools.count(call))
            if not fail:
                answers.append(run(rank))
                continue
            with pytest.raises(DatasetError, match=r"^data.yaml: broken") as raised:
                run(rank, fail=rank == 0)
            assert rank == 0 or str(raised.value) == "data.yaml: broken"  # the first line, passed on
        if not fail:
            assert answers == ["built", "built", "read", "read"]
    assert done == ["rank 0 built", "rank 2 built", "rank 1 read", "rank 3 read"]


def test_cache_key_stats_go_to_threads_only_when_each_stat_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filesystem whose stat waits (a network mount, here 200 us a call) has the key's stats overlapped in threads;
    a fast one keeps them in the calling thread, where threads would only fight over the GIL. Same hash either way,
    and a change to any file's size changes it."""
    from yolo11_lightning.data.sources import cache

    monkeypatch.setattr(cache, "STAT_CHUNK", 16)
    paths = []
    for i in range(100):
        (tmp_path / f"{i}.txt").write_text("x" * i)
        paths.append(str(tmp_path / f"{i}.txt"))
    paths.append(str(tmp_path / "missing.txt"))
    local_stat, threads = os.stat, set()

    def waiting_stat(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        threads.add(threading.current_thread().name)
        time.sleep(200e-6)
        return local_stat(path, *args, **kwargs)

    fast = cache.hash_files(paths).hexdigest()
    monkeypatch.setattr(cache.os, "stat", waiting_stat)
    slow = cache.hash_files(paths).hexdigest()
    assert slow == fast
    assert threading.current_thread().name in threads  # the first chunk, which measured the wait
    assert any(name.startswith("stat") for name in threads), threads
    monkeypatch.setattr(cache.os, "stat", local_stat)
    (tmp_path / "57.txt").write_text("changed")
    assert cache.hash_files(paths).hexdigest() != fast
