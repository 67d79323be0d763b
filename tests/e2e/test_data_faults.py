"""Data that changes under a run: unreadable images substituted, counted and limited; evaluation images
left out; rank-0 side work that fails; ranks that loaded different data.

The unit tests use the Dataset and callbacks in-process. The run tests go through the real CLI
(``python -m yolo11_lightning fit``, 2 gloo ranks by Lightning's launcher) on ``tests/helpers/scripts/tiny_fit.yaml``
with the callbacks of ``tests/helpers/scripts/data_faults.py``; each subprocess has a timeout. The 1-rank resume
runs the CLI's ``main`` in this process (``cli_runs.fit_here``): nothing is asked of its process.
"""

from __future__ import annotations

import csv
import json
import shutil
import traceback
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from cli_runs import (
    assert_same_training_state,
    ddp,
    final_checkpoint,
    fit_args,
    fit_here,
    load,
    run_cli,
    tail,
)
from torch.utils.data import DataLoader

from yolo11_lightning.data.agreement import SPLITS, compare, fingerprint, first_difference, record_digests
from yolo11_lightning.data.dataset import BoxDataset
from yolo11_lightning.data.images import io as image_io
from yolo11_lightning.data.images.limits import ImageReadError
from yolo11_lightning.data.images.loading import BLANK_SUBSTITUTE
from yolo11_lightning.data.sampling.sampler import epoch_order
from yolo11_lightning.data.sampling.seeds import substitute_index
from yolo11_lightning.data.sources.config import load_dataset_config
from yolo11_lightning.data.sources.split import load_split
from yolo11_lightning.structures.batch import collate_detection
from yolo11_lightning.structures.records import ImageRecord
from yolo11_lightning.training.callbacks.unreadable_images import SubstitutionLimitError, UnreadableImages

SIZE = 64


@pytest.fixture()
def train_records(tiny_dataset: Path, tmp_path: Path) -> list[ImageRecord]:
    """The tiny dataset's 16 training records, on a private copy of its images."""
    copy = tmp_path / "data"
    shutil.copytree(tiny_dataset.parent, copy)
    records, _ = load_split(
        load_dataset_config(copy / tiny_dataset.name), "train", use_cache=False, verbose=False
    )
    return records


def break_files(records: list[ImageRecord], delete: int, corrupt: int) -> None:
    Path(records[delete].path).unlink()
    path = Path(records[corrupt].path)
    path.write_bytes(path.read_bytes()[:40])


# ------------------------------------------------------------------------------------------ substitution
def test_unreadable_training_images_get_the_same_substitute_in_any_process(train_records, monkeypatch):
    monkeypatch.setattr(image_io.time, "sleep", lambda s: None)  # the retries' backoff
    break_files(train_records, delete=3, corrupt=7)
    make = lambda: BoxDataset(train_records, SIZE, augment=True, seed=5, retry_backoff_s=0)  # noqa: E731
    dataset = make()
    for epoch in (0, 1):
        for index in (3, 7):
            sample = dataset[(epoch, index)]
            expected = substitute_index(5, epoch, index, 0, 16)
            if expected in (3, 7):  # that candidate is unreadable too: the next one stands in
                expected = substitute_index(5, epoch, index, 1, 16)
            assert sample["substitute"] == expected and sample["index"] == index
            assert sample["unreadable"][0][0] == train_records[index].path
            assert torch.equal(sample["image"], make()[(epoch, index)]["image"])  # a fresh process agrees
    assert "corrupt or truncated PNG" in dataset[(0, 7)]["unreadable"][0][1]
    assert "cannot read file" in dataset[(0, 3)]["unreadable"][0][1]
    assert dataset[(0, 2)]["substitute"] == -1 and dataset[(0, 2)]["unreadable"] == []
    # 0 and 2 DataLoader workers: the same batches, the same substitutes
    keys = [(1, int(i)) for i in epoch_order(16, 5, 1, 16)]
    batches = [
        list(
            DataLoader(make(), batch_size=4, sampler=keys, num_workers=workers, collate_fn=collate_detection)
        )
        for workers in (0, 2)
    ]
    for a, b in zip(*batches):
        assert torch.equal(a["images"], b["images"]) and torch.equal(a["substitutes"], b["substitutes"])
    assert sum(int((b["substitutes"] >= 0).sum()) for b in batches[0]) == 2


def test_when_no_substitute_can_be_read_a_blank_sample_stands_in(train_records):
    for record in train_records[:3]:
        Path(record.path).unlink()
    sample = BoxDataset(train_records[:3], SIZE, augment=True, retry_backoff_s=0)[(0, 1)]
    assert sample["substitute"] == BLANK_SUBSTITUTE and sample["labels"].shape == (0, 5)
    assert sample["image"].shape == (3, SIZE, SIZE) and len(sample["unreadable"]) > 1
    batch = collate_detection([sample])
    assert int((batch["substitutes"] != -1).sum()) == 1  # counted: the limit sees it


def test_a_transient_read_error_is_retried_and_no_substitute_is_needed(train_records, monkeypatch):
    sleeps: list[float] = []
    monkeypatch.setattr(image_io.time, "sleep", sleeps.append)
    real, failures = image_io.read_image, iter([True, True])

    def flaky(path, *args):
        if next(failures, False):
            raise ImageReadError(path, "cannot read file (Stale file handle)")
        return real(path, *args)

    monkeypatch.setattr(image_io, "read_image", flaky)
    sample = BoxDataset(train_records, SIZE, augment=True, retry_backoff_s=0.05)[(0, 4)]
    assert sample["substitute"] == -1 and sample["unreadable"] == []
    assert sleeps == [0.05, 0.1]  # 3 attempts, doubling backoff


def test_unreadable_evaluation_images_are_left_out_of_the_batch(train_records):
    break_files(train_records, delete=0, corrupt=1)
    dataset = BoxDataset(train_records, SIZE, augment=False, retry_backoff_s=0)
    batch = collate_detection([dataset[i] for i in range(4)])
    assert batch["indices"].tolist() == [2, 3] and batch["missing"] == 2
    assert [p for p, _ in batch["unreadable"]] == [train_records[0].path, train_records[1].path]
    assert batch["images"].shape[0] == 2 and set(batch["targets"][:, 0].tolist()) <= {0.0, 1.0}
    empty = collate_detection([dataset[0], dataset[1]])
    assert empty["images"].shape[0] == 0 and empty["missing"] == 2 and empty["targets"].shape == (0, 6)


def test_too_many_substituted_samples_stop_the_run_with_the_figures(caplog):
    callback = UnreadableImages()
    datamodule = SimpleNamespace(max_substituted_fraction=0.01, datasets={"train": range(1000)})
    trainer = SimpleNamespace(datamodule=datamodule, world_size=1, current_epoch=0)
    module = SimpleNamespace(logged={}, device=torch.device("cpu"))
    module.log = lambda name, value, **kw: module.logged.__setitem__(name, value)
    assert callback.limit(trainer) == 10  # 1 % of 1000
    batch = {
        "substitutes": torch.tensor([-1, 4, -1, 9]),
        "unreadable": [("a.jpg", "gone"), ("b.jpg", "gone")],
    }
    for step in range(5):  # 2 per batch: 10 in the epoch is still within the limit
        callback.on_train_batch_end(trainer, module, None, batch, step)
    assert module.logged["train/substituted_samples"] == 10.0
    assert caplog.text.count("unreadable image a.jpg (gone)") == 1  # named once
    trainer.current_epoch = 1  # a new epoch starts counting again; the logged figure is the run total
    callback.on_train_batch_end(trainer, module, None, batch, 0)
    assert (callback.epoch_count, callback.total) == (2, 12)
    for step in range(4):
        callback.on_train_batch_end(trainer, module, None, batch, step + 1)
    with pytest.raises(SubstitutionLimitError, match=r"12 training samples of epoch 1 .* limit of 10 "
                       r"\(data.max_substituted_fraction=0.01 of the training set, at least 8\)"):  # fmt: skip
        callback.on_train_batch_end(trainer, module, None, batch, 9)
    restored = UnreadableImages()
    restored.load_state_dict(callback.state_dict())
    assert (restored.total, restored.epoch, restored.epoch_count) == (22, 1, 12)
    datamodule.datasets = {"train": range(16)}
    assert callback.limit(trainer) == 8  # the floor for small datasets


# ------------------------------------------------------------------------------------------ agreement
def test_fingerprints_differ_by_file_list_and_label_content_and_name_the_file(train_records, tmp_path):
    a = BoxDataset(train_records, SIZE)
    moved = [ImageRecord(str(tmp_path / "elsewhere" / Path(r.path).name), r.height, r.width, r.classes, r.boxes)
             for r in train_records]  # fmt: skip
    relabelled = list(train_records)
    r = relabelled[5]
    relabelled[5] = ImageRecord(r.path, r.height, r.width, r.classes, r.boxes + np.float32(0.01))
    dropped = train_records[:5] + train_records[6:]
    rows = {name: fingerprint({"train": BoxDataset(recs, SIZE)})
            for name, recs in [("same", train_records), ("moved", moved), ("relabelled", relabelled),
                               ("dropped", dropped)]}  # fmt: skip
    assert rows["same"].shape == (1 + 3 * len(SPLITS),) and rows["same"].tolist()[:3] == [0, 1, 16]
    assert compare(torch.stack([rows["same"], rows["moved"]])) == ([], [])  # another mount point agrees
    assert compare(torch.stack([rows["same"], rows["relabelled"]])) == ([], ["train"])
    assert compare(torch.stack([rows["same"], rows["dropped"]])) == ([], ["train"])
    failed = fingerprint({"train": a}, failed=True)
    assert compare(torch.stack([rows["same"], failed]))[0] == ["rank 1"]
    name = Path(train_records[5].path).name
    assert name in first_difference([record_digests(a), record_digests(BoxDataset(relabelled, SIZE))])
    assert "labels" in first_difference([record_digests(a), record_digests(BoxDataset(relabelled, SIZE))])
    assert f"image 5 is {name} on rank 0 but" in first_difference(
        [record_digests(a), record_digests(BoxDataset(dropped, SIZE))]
    )


# ------------------------------------------------------------------------------------------ CLI runs
EPOCHS, BATCH, IMAGES, SEED = 2, 4, 16, 0


def _pick(epoch_1_batches: range) -> int:
    """A training index in epoch 1's given batches, not among epoch 0's last batch (already fetched when
    the files break) and not index 0."""
    late_epoch_0 = set(epoch_order(IMAGES, SEED, 0, BATCH)[12:].tolist())
    order = epoch_order(IMAGES, SEED, 1, BATCH)
    return next(
        int(i) for b in epoch_1_batches for i in order[b * 4 : b * 4 + 4] if i not in late_epoch_0 and i
    )


def _substitutes(folder: Path) -> dict[tuple[int, int, int], int]:
    """(epoch, batch_idx, sample id) -> substitute id (-1: none), over every rank's records."""
    out = {}
    for path in folder.glob("rank*.jsonl"):
        for row in map(json.loads, path.read_text().splitlines()):
            for i, s in zip(row["indices"], row["substitutes"]):
                out[(row["epoch"], row["batch_idx"], i)] = s
    return out


@pytest.fixture(scope="module")
def broken_runs(tiny_dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Run A: 2 ranks; at epoch 0, batch 2 one training image is deleted (it comes up in epoch 1 before
    the cut at batch 2), another truncated (after the cut) and one validation image truncated; saving the
    validation images fails as on a full disk. Rank 0 keeps the checkpoint of the cut. Run B: 1 rank
    resumes from it on a fresh copy with the same files broken (in this process; ``"B"`` holds its run folder and
    its failure, empty when it finished)."""
    root = tmp_path_factory.mktemp("broken_runs")
    data = {run: root / f"data_{run}" for run in "AB"}
    for folder in data.values():
        shutil.copytree(tiny_dataset.parent, folder)
    yaml_a, yaml_b = (data[run] / tiny_dataset.name for run in "AB")
    records, _ = load_split(load_dataset_config(yaml_a), "train", use_cache=False, verbose=False)
    val, _ = load_split(load_dataset_config(yaml_a), "val", use_cache=False, verbose=False)
    deleted, corrupted = _pick(range(0, 2)), _pick(range(2, 4))
    rel = [Path(records[i].path).relative_to(data["A"]) for i in (deleted, corrupted)]
    rel_val = Path(val[3].path).relative_to(data["A"])

    def breaks(folder: Path, *where: str) -> list[str]:
        return [
            "--trainer.callbacks+=data_faults.BreakImages", "--trainer.callbacks.delete", json.dumps([str(folder / rel[0])]),
            "--trainer.callbacks.corrupt", json.dumps([str(folder / rel[1]), str(folder / rel_val)]), *where,
        ]  # fmt: skip

    cut = root / "cut.ckpt"
    run_a = root / "A"
    args_a = fit_args(yaml_a, run_a, "rec", *ddp(), *breaks(data["A"], "--trainer.callbacks.epoch", "0",
                      "--trainer.callbacks.batch_idx", "2"), "--model.log_images", "2",
                      "--trainer.callbacks+=data_faults.FullDiskForValidationImages",
                      "--trainer.callbacks+=data_faults.RecordSubstitutes", "--trainer.callbacks.out_dir", str(run_a / "subs"),
                      "--trainer.callbacks+=data_faults.CopyCheckpointAt", "--trainer.callbacks.target", str(cut),
                      "--trainer.callbacks.epoch", "1", "--trainer.callbacks.batch_idx", "2",
                      "--pictures.curves", "true", "--pictures.labels", "true")  # fmt: skip
    proc_a = run_cli(args_a, cwd=root, timeout=240)
    (root / "A.log").write_text(proc_a.stderr)
    run_b = root / "B"
    args_b = fit_args(yaml_b, run_b, "rec", *breaks(data["B"], "--trainer.callbacks.at_setup", "true"),
                      "--trainer.callbacks+=data_faults.RecordSubstitutes", "--trainer.callbacks.out_dir", str(run_b / "subs"),
                      "--ckpt_path", str(cut))  # fmt: skip
    failure_b = _failure_of(fit_here, args_b) if cut.exists() else "run A kept no checkpoint at the cut"
    return {"A": (run_a, proc_a), "B": (run_b, failure_b), "deleted": deleted, "corrupted": corrupted,
            "paths": [str(data["A"] / p) for p in (*rel, rel_val)]}  # fmt: skip


def _failure_of(run: Callable[[list[str]], object], args: list[str]) -> str:
    """The traceback ``run(args)`` ended with, or "" when it returned: a failed run fails only the test reading it."""
    try:
        run(args)
    except Exception:
        return traceback.format_exc()
    return ""


def test_images_broken_mid_run_are_substituted_counted_and_named(broken_runs):
    run_a, proc = broken_runs["A"]
    assert proc.returncode == 0, tail(proc)
    subs = _substitutes(run_a / "subs")
    replaced = {i: s for (e, b, i), s in subs.items() if s >= 0}
    assert sorted(replaced) == sorted([broken_runs["deleted"], broken_runs["corrupted"]]), replaced
    for i, s in replaced.items():
        assert s == substitute_index(SEED, 1, i, 0, IMAGES) or s == substitute_index(SEED, 1, i, 1, IMAGES)
    (metrics,) = run_a.glob("lightning_logs/version_0/metrics.csv")
    logged = [float(r["train/substituted_samples"]) for r in csv.DictReader(metrics.open())
              if r.get("train/substituted_samples")]  # fmt: skip
    assert logged and logged[0] == 1.0 and logged[-1] == 2.0, logged
    missing = [
        float(r["val/missing_images"]) for r in csv.DictReader(metrics.open()) if r.get("val/missing_images")
    ]
    assert missing == [1.0, 1.0], missing  # the truncated validation image, in both validations
    deleted, corrupted, val = broken_runs["paths"]
    assert f"unreadable image {deleted} (cannot read file" in proc.stderr
    assert f"unreadable image {corrupted} (corrupt or truncated PNG" in proc.stderr
    assert (
        f"unreadable image {val} (corrupt or truncated PNG): left out of the validation metric" in proc.stderr
    )
    assert proc.stderr.count(f"unreadable image {deleted} ") == 1  # named once per file


def test_failing_validation_images_on_rank_0_do_not_end_the_run(broken_runs):
    run_a, proc = broken_runs["A"]
    assert proc.returncode == 0, tail(proc)
    assert "ValidationImages: could not draw or save the validation images (OSError" in proc.stderr
    assert proc.stderr.count("ValidationImages: could not draw") == 1  # warned once, then quiet
    assert not list(run_a.rglob("val_images/*.png"))
    # The result pictures too: each group warned once, none saved, and the closing summary still printed.
    assert "ResultPictures: could not draw or save the labels pictures (OSError" in proc.stderr
    assert proc.stderr.count("ResultPictures: could not draw or save the curves") == 1
    assert not list(run_a.rglob("pictures/*.png")) and "fit finished in" in proc.stderr


def test_resume_with_the_same_files_broken_substitutes_exactly_as_the_uninterrupted_run(broken_runs):
    (run_a, proc_a), (run_b, failure_b) = broken_runs["A"], broken_runs["B"]
    assert proc_a.returncode == 0, tail(proc_a)
    assert not failure_b, failure_b[-6000:]
    a, b = _substitutes(run_a / "subs"), _substitutes(run_b / "subs")
    assert b and all(key[:2] >= (1, 2) for key in b), sorted(b)  # B ran only what followed the cut
    assert {k: a[k] for k in b} == b
    assert any(s >= 0 for s in b.values()), "the resumed part never met the broken file"
    assert_same_training_state(load(final_checkpoint(run_a)), load(final_checkpoint(run_b)))
    assert load(final_checkpoint(run_b))["callbacks"]["UnreadableImages"]["total"] == 2


def test_ranks_with_different_data_fail_together_at_setup_with_the_difference(tiny_dataset, tmp_path):
    drop = ["--trainer.callbacks+=data_faults.DropRecordOnRank", "--trainer.callbacks.rank", "1",
            "--trainer.callbacks.split", "train", "--trainer.callbacks.index", "5"]  # fmt: skip
    proc = run_cli(fit_args(tiny_dataset, tmp_path, "rec", *ddp("0:01:00"), *drop), cwd=tmp_path, timeout=120)
    assert proc.returncode != 0, tail(proc)
    records, _ = load_split(load_dataset_config(tiny_dataset), "train", use_cache=False, verbose=False)
    name = Path(records[5].path).name
    message = "the ranks loaded different `train` data (images per rank: rank 0: 16, rank 1: 15); image 5 is"
    assert message in proc.stderr and name in proc.stderr, tail(proc)
    assert "Timed out" not in proc.stderr and "timed out" not in proc.stderr
    assert not list(tmp_path.rglob("rec/rank*.jsonl")), "a rank started training"
