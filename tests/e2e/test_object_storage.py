"""Training from shards in a real S3-compatible server (moto on 127.0.0.1), against the same data as a folder.

The tiny dataset is converted and uploaded (``write_shards`` to ``s3://``); a 2-rank fit from ``s3://`` with a
shard window is cut mid-epoch and finished on 1 rank (``--ckpt_path last``): the runs must train the shard-aware
order exactly once, end in the state of the uninterrupted 1-rank run from the same shards, and see each epoch the
samples the uninterrupted folder run saw.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from cli_runs import (
    EPOCHS,
    check_resume_two_ranks_to_one,
    expected_order,
    fit_args,
    fit_here,
    flatten,
    global_batches,
    records,
)
from object_store import s3_server

from yolo11_lightning.data.dataset import BoxDataset
from yolo11_lightning.data.sampling.shard_windows import ShardWindows
from yolo11_lightning.data.shards import cache as cache_module
from yolo11_lightning.data.shards.reader import load_shard_split, open_index
from yolo11_lightning.data.shards.writer import write_shards
from yolo11_lightning.data.sources.config import DatasetError
from yolo11_lightning.data.sources.split import dataset_config

BUCKET = "yolo11-shards"


@pytest.fixture(scope="module")
def tiny_in_s3(tiny_dataset: Path) -> Iterator[str]:
    """The tiny dataset as shards of ~20 KB (several per split) at ``s3://<BUCKET>/tiny``."""
    with s3_server(BUCKET):
        url = f"s3://{BUCKET}/tiny"
        write_shards(dataset_config(tiny_dataset), url, "detect", shard_mb=0.02)
        yield url


def test_two_ranks_from_s3_cut_and_resumed_on_one_equal_the_uninterrupted_run(
    tiny_in_s3: str, uninterrupted: Path, tmp_path: Path
) -> None:
    cache = ["--data.shard_cache_dir", str(tmp_path / "node-cache"), "--data.shard_window", "2"]
    _, images = load_shard_split(open_index(tiny_in_s3), "train", tmp_path / "node-cache")
    assert int(images.shard.max()) + 1 > 2  # more shards than a window: the order is not a full shuffle
    order = expected_order(ShardWindows(np.asarray(images.shard), 2))
    assert order != expected_order()

    whole = tmp_path / "whole"
    fit_here(fit_args(tiny_in_s3, whole, "rec", "--ckpt_path", "last", *cache))  # type: ignore[arg-type]
    assert flatten(global_batches(records(whole / "rec"))) == order
    (tmp_path / "cut").mkdir()
    check_resume_two_ranks_to_one(tiny_in_s3, whole, tmp_path / "cut", *cache, order=order)  # type: ignore[arg-type]

    def per_epoch(rows: list[dict]) -> list[list[int]]:
        batches = global_batches(rows)
        return [
            sorted(i for (e, _), ids in batches.items() if e == epoch for i in ids) for epoch in range(EPOCHS)
        ]

    assert per_epoch(records(whole / "rec")) == per_epoch(
        records(uninterrupted / "rec")
    )  # the folder's samples
    fetched = sorted(p.name for p in (tmp_path / "node-cache").glob("shards/*/*.tar"))
    assert fetched and all(name.startswith(("train-", "val-")) for name in fetched)


def _fault_set(tiny_dataset: Path, name: str, tmp_path: Path):
    """The tiny set at ``s3://<BUCKET>/<name>`` (one image per shard) and its training split read back."""
    url = f"s3://{BUCKET}/{name}"
    write_shards(dataset_config(tiny_dataset), url, "detect", shard_mb=0.005)
    records, images = load_shard_split(open_index(url), "train", tmp_path / "cache")
    return url, records, images, BoxDataset(records, 64, augment=True, image_bytes=images)


def test_faults_of_the_store_are_named_and_the_samples_substituted(
    tiny_in_s3: str, tiny_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A truncated shard (retried, then named), a missing one (named at once) and corrupt image bytes: each
    sample of theirs is replaced by a readable substitute and counted, as an unreadable image file is; missing
    records, a missing bucket or no credentials stop the run with one line naming the object. No message carries
    the credentials."""
    monkeypatch.setattr(cache_module, "FETCH_BACKOFF_S", 0.001)
    import boto3

    url, _, images, dataset = _fault_set(tiny_dataset, "faults", tmp_path)
    s3 = boto3.client("s3")
    short, gone, corrupt = (images.shards[int(images.shard[i])] for i in (0, 1, 2))
    s3.put_object(Bucket=BUCKET, Key=f"faults/{short}", Body=b"truncated")
    s3.delete_object(Bucket=BUCKET, Key=f"faults/{gone}")
    body = s3.get_object(Bucket=BUCKET, Key=f"faults/{corrupt}")["Body"].read()
    offset, size = int(images.offset[2]), int(images.size[2])
    damaged = body[:offset] + b"\x89PNG\r\n\x1a\n" + bytes(size - 8) + body[offset + size :]
    s3.put_object(Bucket=BUCKET, Key=f"faults/{corrupt}", Body=damaged)

    reasons = {}
    for index in (0, 1, 2):
        sample = dataset[(0, index)]
        assert sample["substitute"] not in (-1, index) and sample["image"].shape[1:] == (64, 64)
        ((where, why),) = sample["unreadable"][:1]
        reasons[index] = f"{where}: {why}"
    assert (
        reasons[0].startswith(f"{url}/{short}#000000000.")
        and f"after {cache_module.FETCH_ATTEMPTS} attempts" in reasons[0]
    )
    assert "bytes, the index says" in reasons[0]
    assert (
        reasons[1].startswith(f"{url}/{gone}#000000001.")
        and "cannot fetch the shard (FileNotFoundError" in reasons[1]
    )
    assert reasons[2].startswith(f"{url}/{corrupt}#000000002.") and "corrupt or truncated PNG" in reasons[2]
    assert dataset[(0, 3)]["substitute"] == -1  # the other shards read

    s3.delete_object(Bucket=BUCKET, Key="faults/train.records.npz")
    with pytest.raises(DatasetError, match=rf"^{url}/train.records.npz: cannot read \(FileNotFoundError"):
        load_shard_split(open_index(url), "train")
    with pytest.raises(
        DatasetError, match=r"^s3://no-such-bucket-42/x/index.json: cannot read \(FileNotFoundError"
    ):
        open_index("s3://no-such-bucket-42/x")
    assert not any("testing" in r for r in reasons.values())  # the secret key of the environment

    import s3fs

    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    s3fs.S3FileSystem.clear_instance_cache()  # a new client, which looks for credentials again
    try:
        with pytest.raises(DatasetError, match=rf"^{url}/index.json: cannot read \(NoCredentialsError"):
            open_index(url)  # at once: no retry can find credentials
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
