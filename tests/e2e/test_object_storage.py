"""Training from shards in a real S3-compatible server (moto on 127.0.0.1), against the same data as a folder.

The tiny dataset is converted and uploaded (``write_shards`` to ``s3://``); a 2-rank fit from ``s3://`` is cut
mid-epoch and finished on 1 rank (``--ckpt_path last``): with ``--data.shard_window 0`` the order is the folder's,
so the runs must see the uninterrupted folder run's sample ids, batch by batch, and end in its state.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_runs import check_resume_two_ranks_to_one
from object_store import s3_server

from yolo11_lightning.data.shards.writer import write_shards
from yolo11_lightning.data.sources.split import dataset_config

BUCKET = "yolo11-shards"


@pytest.fixture(scope="module")
def tiny_in_s3(tiny_dataset: Path) -> Iterator[str]:
    """The tiny dataset as shards of ~20 KB (several per split) at ``s3://<BUCKET>/tiny``."""
    with s3_server(BUCKET):
        url = f"s3://{BUCKET}/tiny"
        write_shards(dataset_config(tiny_dataset), url, "detect", shard_mb=0.02)
        yield url


def test_two_ranks_from_s3_cut_and_resumed_on_one_equal_the_folder_run(
    tiny_in_s3: str, uninterrupted: Path, tmp_path: Path
) -> None:
    cache = ["--data.shard_cache_dir", str(tmp_path / "node-cache"), "--data.shard_window", "0"]
    check_resume_two_ranks_to_one(tiny_in_s3, uninterrupted, tmp_path, *cache)  # type: ignore[arg-type]
    fetched = sorted(p.name for p in (tmp_path / "node-cache").glob("shards/*/*.tar"))
    assert fetched and all(name.startswith(("train-", "val-")) for name in fetched)
