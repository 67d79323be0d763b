"""Shard folders (``data.shards``): the converter's output for every task and format, reading it back, the
node-local shard cache."""

from __future__ import annotations

import dataclasses
import json
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest

from yolo11_lightning.data.dataset import BoxDataset
from yolo11_lightning.data.images.limits import ImageReadError
from yolo11_lightning.data.sampling.sampler import ElasticDistributedSampler, epoch_order
from yolo11_lightning.data.sampling.shard_windows import ShardWindows
from yolo11_lightning.data.shards import reader
from yolo11_lightning.data.shards.cache import FETCH_ATTEMPTS, ShardCache, ShardFetchError
from yolo11_lightning.data.shards.reader import load_shard_split, open_index
from yolo11_lightning.data.shards.writer import write_shards
from yolo11_lightning.data.sources.config import DatasetError
from yolo11_lightning.data.sources.split import dataset_config, load_split
from yolo11_lightning.synthetic.shapes import make_synthetic_coco, make_synthetic_dataset
from yolo11_lightning.tasks import get_task


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize(
    ("task", "coco"),
    [
        ("detect", False),
        ("detect", True),
        ("segment", False),
        ("pose", True),
        ("obb", False),
        ("classify", False),
    ],
)
def test_every_task_and_format_converts_to_the_same_records_and_bytes(
    tmp_path: Path, task: str, coco: bool
) -> None:
    made = (make_synthetic_coco if coco else make_synthetic_dataset)(
        tmp_path / "ds", num_train=5, num_val=3, image_size=64, seed=1, task=task
    )
    config = dataclasses.replace(dataset_config(made), outline_labels=get_task(task).outline_labels)
    first = write_shards(config, str(tmp_path / "a"), task, shard_mb=0.01)
    write_shards(config, str(tmp_path / "b"), task, shard_mb=0.01)
    assert _files(tmp_path / "a") == _files(tmp_path / "b")  # deterministic: same input, same bytes
    assert [s.split for s in first] == ["train", "val"] and first[0].shards > 1  # 10 KB shards: several

    index = open_index(str(tmp_path / "a"))
    assert (index.task, index.names, index.options) == (task, config.names, config.options)
    for split in ("train", "val"):
        folder, _ = load_split(config, split)
        records, images = load_shard_split(index, split, tmp_path / "cache")
        assert len(records) == len(folder) == first[split == "val"].samples
        for i, (a, b) in enumerate(zip(folder, records)):
            assert b.path == f"{i:09d}{Path(a.path).suffix.lower()}"
            assert (a.height, a.width) == (b.height, b.width)
            for field in ("classes", "boxes", "segments", "segment_sizes", "keypoints"):
                np.testing.assert_array_equal(
                    getattr(a, field), getattr(b, field), err_msg=f"{split} {i} {field}"
                )
            np.testing.assert_array_equal(a.flip_idx, b.flip_idx)
            assert images.read(i, b.path) == Path(a.path).read_bytes()  # the original bytes
        # Any tar tool reads the shards: one member per sample, keyed by its index; the validation split in
        # order, the training split dealt out (shard k of S holds samples k, k + S, ...).
        wids = json.loads((tmp_path / "a" / f"{split}.json").read_text())
        assert wids["__kind__"] == "wids-shard-index-v1" and sum(
            s["nsamples"] for s in wids["shardlist"]
        ) == len(records)
        members = []
        for shard in wids["shardlist"]:
            with tarfile.open(tmp_path / "a" / shard["url"]) as tar:
                members.append(tar.getnames())
        count = len(members)
        expected = (
            [range(len(records))] if split == "val" else [range(k, len(records), count) for k in range(count)]
        )
        if split == "val":
            assert [m for shard in members for m in shard] == [records.path(i) for i in range(len(records))]
        else:
            assert members == [[records.path(i) for i in shard] for shard in expected]


def test_a_class_sorted_training_split_is_dealt_so_that_every_shard_holds_every_class(tmp_path: Path) -> None:
    """An ImageFolder lists its images class by class: shards written in that order would each hold one class
    and a shuffle window of a few shards would train on a few classes at a time."""
    root = make_synthetic_dataset(tmp_path / "cls", num_train=24, num_val=6, image_size=32, task="classify")
    config = dataset_config(str(root))
    folder, _ = load_split(config, "train")
    source_classes = folder.arrays()["classes"]
    assert (
        np.count_nonzero(np.diff(source_classes)) == len(set(source_classes.tolist())) - 1
    )  # class by class
    write_shards(config, str(tmp_path / "sh"), "classify", shard_mb=0.01)
    records, images = load_shard_split(open_index(str(tmp_path / "sh")), "train", tmp_path / "cache")
    shard_of, classes = np.asarray(images.shard), records.arrays()["classes"]
    assert shard_of.max() >= 2  # several shards
    for k in range(int(shard_of.max()) + 1):
        assert set(classes[shard_of == k].tolist()) == set(classes.tolist()), f"shard {k}"
    for i in range(len(records)):  # every sample still reads back its own image
        assert images.read(i, records.path(i)) == Path(folder.path(i)).read_bytes()


def test_a_shard_folder_gives_the_folders_samples(tiny_dataset: Path, tmp_path: Path) -> None:
    """Same (epoch, index): the same augmented sample from the shards as from the folder, read as the DataModule
    reads it (``dataset_config`` of the folder's location)."""
    write_shards(dataset_config(tiny_dataset), str(tmp_path / "sh"), "detect", shard_mb=0.02)
    config = dataset_config(str(tmp_path / "sh"))
    assert config.shards == str(tmp_path / "sh") and config.source == str(tmp_path / "sh")
    records, images = load_shard_split(open_index(config.shards), "train", tmp_path / "cache")
    folder, _ = load_split(dataset_config(tiny_dataset), "train")
    a = BoxDataset(folder, 64, augment=True, seed=3, reduced_decode=True)
    b = BoxDataset(records, 64, augment=True, seed=3, reduced_decode=True, image_bytes=images)
    for item in [(0, 0), (0, 5), (1, 15), (2, 7)]:
        sa, sb = a[item], b[item]
        assert np.array_equal(sa["image"].numpy(), sb["image"].numpy())
        assert np.array_equal(sa["labels"].numpy(), sb["labels"].numpy())


def test_shard_index_errors_name_the_file(tmp_path: Path, tiny_dataset: Path) -> None:
    with pytest.raises(DatasetError, match=r"index.json: cannot read"):
        open_index(str(tmp_path / "nowhere"))
    write_shards(dataset_config(tiny_dataset), str(tmp_path / "sh"), "detect")
    (tmp_path / "sh" / "train.records.npz").write_bytes(b"changed")
    with pytest.raises(DatasetError, match=r"train.records.npz: does not match its index"):
        load_shard_split(open_index(str(tmp_path / "sh")), "train")
    with pytest.raises(DatasetError, match=r"split `test` is not defined \(defined: train, val\)"):
        load_shard_split(open_index(str(tmp_path / "sh")), "test")


class _Store:
    """A fake store: objects by name, a number of transient failures to give first."""

    def __init__(self, objects: dict[str, bytes], failures: int = 0) -> None:
        self.objects, self.failures, self.calls = objects, failures, 0

    def fetch(self, name: str, path: Path) -> None:
        self.calls += 1
        if self.failures:
            self.failures -= 1
            path.write_bytes(b"half a body")  # a download cut short: the next attempt starts over
            raise ConnectionError("503 Slow Down")
        if name not in self.objects:
            raise FileNotFoundError(name)
        path.write_bytes(self.objects[name])


def test_shard_cache_fetches_once_keeps_the_recent_and_retries(tmp_path: Path) -> None:
    objects = {f"s{i}.tar": bytes([i]) * 100 for i in range(4)}
    sizes = {k: len(v) for k, v in objects.items()}
    store = _Store(objects, failures=2)
    cache = ShardCache(tmp_path, 250, store.fetch, sizes, backoff_s=0.001, where="s3://b/p")
    assert cache.path("s0.tar").read_bytes() == objects["s0.tar"] and store.calls == 3  # 2 retries
    cache.path("s1.tar"), cache.path("s0.tar")  # s0 used last
    cache.path("s2.tar")  # 300 bytes > 250: the least recently used (s1) goes
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["s0.tar", "s2.tar"]
    calls = store.calls
    cache.path("s0.tar")
    assert store.calls == calls  # a hit: not fetched again
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".part")]  # nothing half-written left

    with pytest.raises(
        ShardFetchError, match=r"^s3://b/p/gone.tar: cannot fetch the shard \(FileNotFoundError"
    ):
        cache.path("gone.tar")  # missing: no retry
    short = ShardCache(
        tmp_path / "t", 1000, _Store({"s.tar": b"x" * 10}).fetch, {"s.tar": 20}, backoff_s=0.001
    )
    with pytest.raises(
        ShardFetchError,
        match=rf"s.tar: cannot fetch the shard after {FETCH_ATTEMPTS} attempts .*10 bytes, the index says 20",
    ):
        short.path("s.tar")  # a short body streamed to the .part file fails the size check
    assert [p.name for p in (tmp_path / "t").iterdir()] == [".s.tar.lock"]  # no .part, no shard


def test_an_unfetchable_shard_makes_its_samples_unreadable(tiny_dataset: Path, tmp_path: Path) -> None:
    write_shards(dataset_config(tiny_dataset), str(tmp_path / "sh"), "detect", shard_mb=0.02)
    records, images = load_shard_split(open_index(str(tmp_path / "sh")), "train", tmp_path / "cache")
    gone = images.shards[int(images.shard[0])]
    (tmp_path / "sh" / gone).unlink()
    with pytest.raises(ImageReadError, match=rf"sh/{gone}#000000000.png: .*cannot fetch the shard"):
        images.read(0, records.path(0))
    assert images.read(len(records) - 1, records.path(len(records) - 1))  # another shard reads


def test_a_shard_is_opened_once_per_process_and_touched_at_most_every_second(
    tiny_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Samples are ``pread`` from the process's open file of their shard: the cache is asked (and the shard's
    place in its order refreshed) when the shard is opened, then at most every ``TOUCH_EVERY_S``; the least
    recently read of ``OPEN_SHARDS`` files is closed; an open shard evicted from the cache still reads."""
    write_shards(
        dataset_config(tiny_dataset), str(tmp_path / "sh"), "detect", shard_mb=0.005
    )  # 1 image a shard
    records, images = load_shard_split(open_index(str(tmp_path / "sh")), "train", tmp_path / "cache")
    monkeypatch.setattr(reader, "OPEN_SHARDS", 2)
    monkeypatch.setattr(reader, "TOUCH_EVERY_S", 3600.0)
    asked = []
    path = images.cache().path
    monkeypatch.setattr(images.cache(), "path", lambda name: asked.append(name) or path(name))
    expected = [Path(records.path(i)).name for i in range(3)]
    first = images.read(0, expected[0])
    held = images._open[images.shards[0]][0]
    cached = Path(images.cache_folder) / images.shards[0]
    os.utime(cached, ns=(0, 0))
    assert images.read(0, expected[0]) == first and cached.stat().st_mtime_ns == 0  # not touched again
    monkeypatch.setattr(reader, "TOUCH_EVERY_S", 0.0)
    images.read(0, expected[0])
    assert cached.stat().st_mtime_ns > 0 and asked == [images.shards[0]]  # touched, still one ask
    cached.unlink()  # evicted by another process: the open file reads on
    assert images.read(0, expected[0]) == first and asked == [images.shards[0]]
    images.read(1, expected[1]), images.read(2, expected[2])
    assert held.closed and list(images._open) == images.shards[1:3]  # 2 open at most, the oldest closed
    assert (
        images.read(0, expected[0]) == first and asked == images.shards[:3] + images.shards[:1]
    )  # fetched again


def test_shard_command_writes_what_the_source_says_of_its_task(tmp_path: Path, capsys) -> None:
    from yolo11_lightning.cli.main import main
    from yolo11_lightning.data.sources.task_hint import dataset_task

    root = make_synthetic_dataset(tmp_path / "cls", num_train=4, num_val=2, image_size=32, task="classify")
    assert main(["shard", "--data", str(root), "--out", str(tmp_path / "sh"), "--shard-size", "1"]) == 0
    out = capsys.readouterr().out
    assert "train: 4 samples in 1 shards" in out and f"wrote {tmp_path / 'sh'}/index.json (classify)" in out
    hint = dataset_task(str(tmp_path / "sh"))
    assert hint is not None and hint.task == "classify" and "its shard index: " in hint.evidence
    assert main(["shard", "--data", str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "x")]) == 2
    assert "missing.yaml: cannot read dataset yaml" in capsys.readouterr().err


# ----------------------------------------------------------------------------------- shard-aware order
def test_shard_windows_order_is_a_function_of_seed_and_epoch_and_reads_few_shards() -> None:
    shard_of = np.repeat(np.arange(10), [7, 5, 9, 1, 8, 8, 3, 6, 7, 6])  # 60 samples in 10 shards of any size
    windows = ShardWindows(shard_of, 3)
    order = epoch_order(60, 5, 2, 12, windows)
    assert np.array_equal(order, epoch_order(60, 5, 2, 12, ShardWindows(shard_of.copy(), 3)))
    assert sorted(order.tolist()) == list(range(60))  # every sample once (60 = 5 global batches)
    assert not np.array_equal(order, epoch_order(60, 5, 3, 12, windows))  # another epoch, another order
    # The order runs through windows of 3 shards one after the other: never more than 3 shards begun and unfinished.
    left = np.bincount(shard_of)
    opened: set[int] = set()
    for shard in shard_of[order]:
        opened.add(int(shard))
        left[shard] -= 1
        assert len(opened) <= 3
        if not left[shard]:
            opened.discard(int(shard))
    full = epoch_order(60, 5, 2, 12)  # the global order of all samples opens most shards at once
    assert not np.array_equal(full, order)


def test_shard_order_resumes_on_another_world_size(tmp_path: Path) -> None:
    shard_of = np.repeat(np.arange(6), 6)
    dataset = list(range(36))
    windows = ShardWindows(shard_of, 2)

    def global_batches(world: int, state: dict | None = None) -> list[list[int]]:
        samplers = [
            ElasticDistributedSampler(dataset, 6, world, r, seed=4, windows=windows) for r in range(world)
        ]
        for s in samplers:
            s.set_epoch(1)
            if state is not None:
                s.load_state_dict(state)
        per_rank = [[i for _, i in s] for s in samplers]
        per = 6 // world
        return [
            sorted(i for p in per_rank for i in p[b * per : (b + 1) * per])
            for b in range(len(per_rank[0]) // per)
        ]

    full = global_batches(1)
    assert global_batches(2) == global_batches(3) == full  # the same global batches on any world size
    saved = ElasticDistributedSampler(dataset, 6, 2, 0, seed=4, windows=windows)
    saved.set_epoch(1)
    saved.set_consumed_samples(12)
    state = saved.state_dict()
    assert state["order"] == "shards/2"
    assert global_batches(3, state) == full[2:]  # saved on 2 ranks, resumed on 3: exactly the rest
    with pytest.raises(ValueError, match=r"saved with the order 'shards/2' but this run uses 'global'"):
        ElasticDistributedSampler(dataset, 6, 1, 0, seed=4).load_state_dict(state)


def test_training_samples_fetch_the_shards_ahead_of_use(tiny_dataset: Path, tmp_path: Path) -> None:
    """Reading one training sample starts the background fetch of the shards the next positions of the epoch's
    order need, into the node cache (every rank and worker then finds them there)."""
    write_shards(
        dataset_config(tiny_dataset), str(tmp_path / "sh"), "detect", shard_mb=0.005
    )  # 1 image a shard
    records, images = load_shard_split(open_index(str(tmp_path / "sh")), "train", tmp_path / "cache")
    dataset = BoxDataset(records, 64, augment=True, image_bytes=images, global_batch_size=4)
    first = int(epoch_order(16, 0, 0, 4)[0])
    dataset[(0, first)]
    images._fetcher.shutdown(wait=True)
    cached = sorted(p.name for p in Path(images.cache_folder).glob("*.tar"))
    assert len(cached) == 16  # the sample's own shard and the 15 after it in the order


def _mapped(array: np.ndarray) -> bool:
    """Whether ``array`` is a view of a memory-mapped file (no copy of its own)."""
    while array is not None and not isinstance(array, np.memmap):
        array = array.base if isinstance(array.base, np.ndarray) else None
    return array is not None


def test_the_records_are_fetched_once_per_node_and_mapped(tiny_dataset: Path, tmp_path: Path) -> None:
    """The first process of a node fetches and unpacks the records into the node cache; the others map those files
    (one copy in the page cache), so the store is not asked again."""
    write_shards(dataset_config(tiny_dataset), str(tmp_path / "sh"), "detect")
    first, _ = load_shard_split(open_index(str(tmp_path / "sh")), "val", tmp_path / "cache")
    (tmp_path / "sh" / "val.records.npz").unlink()  # gone from the store: the node's copy serves
    again, images = load_shard_split(open_index(str(tmp_path / "sh")), "val", tmp_path / "cache")
    assert [r.path for r in first] == [r.path for r in again] and len(again) == 7
    assert _mapped(again._boxes) and _mapped(again._paths) and _mapped(images.offset)
    assert not [p for p in (tmp_path / "cache").rglob(".records-*") if p.is_dir()]  # no staging folder left
    with pytest.raises(DatasetError, match=r"val.records.npz: cannot read \(FileNotFoundError"):
        load_shard_split(open_index(str(tmp_path / "sh")), "val", tmp_path / "other-node")


def test_check_data_reads_a_shard_folder(
    tiny_dataset: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    from yolo11_lightning.cli.check_data import check_dataset

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "node"))  # the default node cache folder

    write_shards(dataset_config(tiny_dataset), str(tmp_path / "sh"), "detect")
    config = dataset_config(str(tmp_path / "sh"))
    assert check_dataset(config, tmp_path / "out", 64, 2, 0, True)
    out = capsys.readouterr().out
    assert "train: 16 images (0 background)" in out and f"(cache: {tmp_path / 'sh'} (shards))" in out
    assert (tmp_path / "out" / "val_preview.png").is_file()  # its images read from the shards
    assert list((tmp_path / "node" / "yolo11_lightning" / "shards").glob("*/val-000000.tar"))
