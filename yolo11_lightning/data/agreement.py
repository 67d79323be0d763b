"""Ranks agree on the data: one collective at DataModule setup compares what every rank loaded.

With node-local dataset copies, or a label cache one node could not rewrite, ranks can load different
image lists. The global batches are then silently mis-split, or a rank runs out of batches first and the
job hangs at the epoch's end. ``check_ranks_agree`` gathers from every rank a small fixed-size int64
tensor: a setup-error flag, then per split the image count and a 63-bit hash of the file list (paths
relative to their common folder, so copies at different mount points agree) and of the label contents
(sizes, classes, boxes, and the polygons when the dataset keeps them: segment task). Every rank receives the same table, so all ranks decide alike: they all go on,
or all raise ``DataMismatchError``. Only on a mismatch a second collective gathers the per-image
digests of the differing split, to name the first file that differs.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

# Splits in a fixed order, so every rank lays out the same tensor.
SPLITS = ("train", "val", "test", "predict")
_MASK = (1 << 63) - 1


class DataMismatchError(RuntimeError):
    """The ranks loaded different datasets (or one of them failed to load its data)."""


def _relative_paths(paths: Sequence[str]) -> list[str]:
    if not paths:
        return []
    root = os.path.commonpath(paths) if len(paths) > 1 else os.path.dirname(paths[0])
    return [os.path.relpath(p, root) for p in paths]


def record_digests(dataset: Any) -> list[tuple[str, int]]:
    """(relative path, 63-bit digest of its size and labels) per image of a ``BoxDataset``."""
    records = [dataset.records[i] for i in range(len(dataset))]
    paths = _relative_paths([r.path for r in records])
    out = []
    for path, r in zip(paths, records):
        h = hashlib.blake2b(digest_size=8)
        h.update(np.array([r.height, r.width], np.int64).tobytes())
        h.update(np.ascontiguousarray(r.classes, np.int64).tobytes())
        h.update(np.ascontiguousarray(r.boxes, np.float32).tobytes())
        if getattr(dataset.records, "has_polygons", False):
            h.update(np.ascontiguousarray(r.segment_sizes, np.int64).tobytes())
            h.update(np.ascontiguousarray(r.segments, np.float32).tobytes())
        if r.keypoints.size:  # a keypoint dataset's
            h.update(np.ascontiguousarray(r.keypoints, np.float32).tobytes())
        out.append((path, int.from_bytes(h.digest(), "little") & _MASK))
    return out


def split_hash(dataset: Any) -> int:
    """63-bit hash of a ``BoxDataset``'s relative file list, image sizes and labels.

    Hashes the flat arrays of its ``PackedRecords`` directly (about 0.1 s for COCO's 118k images; the
    polygons of a segment dataset, about 160 MB for COCO, add about 0.3 s).
    """
    packed = dataset.records
    raw = packed._paths.tobytes()
    ends = packed._path_ends.tolist()
    starts = [0, *ends[:-1]]
    paths = [raw[a:b] for a, b in zip(starts, ends)]
    cut = 0
    if paths:  # the common folder: the longest common prefix of the smallest and largest path, to a "/"
        low, high = min(paths), max(paths)
        n = next((i for i, (x, y) in enumerate(zip(low, high)) if x != y), min(len(low), len(high)))
        cut = low.rfind(b"/", 0, n if len(paths) > 1 else len(low)) + 1
    h = hashlib.blake2b(digest_size=8)
    h.update(b"\0".join(p[cut:] for p in paths))
    for array in (packed._sizes, packed._label_ends, packed._classes):
        h.update(np.ascontiguousarray(array, np.int64).tobytes())
    h.update(np.ascontiguousarray(packed._boxes, np.float32).tobytes())
    if packed.has_polygons:  # a dataset that keeps no polygons (detection) hashes without them
        h.update(np.ascontiguousarray(packed._segment_sizes, np.int64).tobytes())
        h.update(np.ascontiguousarray(packed._segments, np.float32).tobytes())
    if packed._keypoints.size:  # a keypoint dataset's keypoints
        h.update(np.ascontiguousarray(packed._keypoints, np.float32).tobytes())
    return int.from_bytes(h.digest(), "little") & _MASK


def fingerprint(datasets: Mapping[str, Any], failed: bool = False) -> torch.Tensor:
    """(1 + 3 * len(SPLITS),) int64: failed flag, then per split [loaded, image count, hash]."""
    values = [int(failed)]
    for split in SPLITS:
        dataset = datasets.get(split)
        values += [0, 0, 0] if dataset is None else [1, len(dataset), split_hash(dataset)]
    return torch.tensor(values, dtype=torch.int64)


def first_difference(per_rank: Sequence[Sequence[tuple[str, int]]]) -> str:
    """Where rank r's (path, digest) list first departs from rank 0's, in words."""
    reference = per_rank[0]
    for rank, mine in enumerate(per_rank[1:], start=1):
        for i in range(max(len(reference), len(mine))):
            a = reference[i] if i < len(reference) else None
            b = mine[i] if i < len(mine) else None
            if a == b:
                continue
            if a is not None and b is not None and a[0] == b[0]:
                return f"the labels (or recorded size) of {a[0]} differ between rank 0 and rank {rank}"
            ours, theirs = a[0] if a else "absent", b[0] if b else "absent"
            return f"image {i} is {ours} on rank 0 but {theirs} on rank {rank}"
    return "no single file differs (the file lists are ordered differently)"


def compare(table: torch.Tensor) -> tuple[list[str], list[str]]:
    """Read the gathered (world, n) table: (failed ranks as words, splits that differ)."""
    rows = table.tolist()
    failed = [f"rank {r}" for r, row in enumerate(rows) if row[0]]
    differ = []
    for s, split in enumerate(SPLITS):
        cols = [tuple(row[1 + 3 * s : 4 + 3 * s]) for row in rows]
        if len(set(cols)) > 1:
            differ.append(split)
    return failed, differ


def check_ranks_agree(datasets: Mapping[str, Any], strategy: Any, error: BaseException | None = None) -> None:
    """Every rank calls this after loading ``datasets`` (``error``: what its own loading raised, if any).

    Raises on every rank together: ``error`` itself on the rank that failed, ``DataMismatchError`` on the
    others and on all ranks when the loaded data differ. No-op unless torch.distributed is initialised.
    """
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        if error is not None:
            raise error
        return
    mine = fingerprint(datasets, failed=error is not None).to(strategy.root_device)
    table = strategy.all_gather(mine).reshape(torch.distributed.get_world_size(), -1).cpu()
    failed, differ = compare(table)
    if error is not None:
        raise error
    if failed:
        raise DataMismatchError(
            f"data setup failed on {', '.join(failed)} (its log has the error); every rank stops with it"
        )
    if not differ:
        return
    split = differ[0]
    gathered: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, record_digests(datasets[split]))
    counts = ", ".join(f"rank {r}: {len(g)}" for r, g in enumerate(gathered))
    raise DataMismatchError(
        f"the ranks loaded different `{split}` data (images per rank: {counts}); "
        f"{first_difference(gathered)}. "
        "Every rank must see the same dataset files and labels: sync node-local copies, or rebuild the label "
        "cache where it is stale"
    )
