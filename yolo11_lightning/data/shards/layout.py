"""The names and keys of a shard folder: what the converter writes and the reader expects.

A shard folder (local or in an object store) holds::

    index.json                 format, version, task, class names, label options, split -> its index
    <split>.json               a wids-shard-index-v1 index: shard urls (relative) and sample counts,
                               our fields under ``yolo11_lightning``
    <split>.records.npz        the split's PackedRecords arrays plus each sample's shard, offset and size
    <split>-000000.tar, ...    WebDataset tar shards: member ``<key>.<ext>``, the image's original bytes
"""

from __future__ import annotations

FORMAT = "yolo11_lightning-shards"
VERSION = 1
TOP_INDEX = "index.json"
WIDS_KIND = "wids-shard-index-v1"
OUR_KEY = "yolo11_lightning"  # our fields inside a wids index
# Per-sample arrays of the records file beside the PackedRecords ones: where each image lies in its shard.
LOCATION_FIELDS = ("shard", "offset", "size")
KEY_DIGITS = 9  # a sample's key: its index in the split, zero-padded


def split_index(split: str) -> str:
    """The wids index file of ``split``."""
    return f"{split}.json"


def records_file(split: str) -> str:
    """The records file of ``split``."""
    return f"{split}.records.npz"


def shard_file(split: str, number: int) -> str:
    """Shard ``number`` of ``split``."""
    return f"{split}-{number:06d}.tar"


def member_name(index: int, extension: str) -> str:
    """The tar member of sample ``index`` whose image has ``extension`` (lower case, no dot)."""
    return f"{index:0{KEY_DIGITS}d}.{extension}"
