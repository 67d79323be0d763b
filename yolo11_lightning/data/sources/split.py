"""Entry point of the data sources: a split of a dataset config -> checked records and a report.

``load_split`` lists the split's files, returns the label cache when it is still valid, and
otherwise checks every image and label (in worker processes for YOLO folders, whose label parsing holds the
GIL; threads for a COCO json), then saves the cache. Records travel as ``PackedRecords`` (flat arrays) from
the check to the cache and the Dataset. Images above the pixel limit (``max_image_pixels``, ``images.io``) are refused
from their headers in the check, and, cheaply from their stored sizes, in a cache built under a higher
limit. The DataModule's ``setup`` runs it on global rank 0 first (``data.build_once``),
so that the other ranks only read the cache.

Cache location: beside the labels (``<labels dir>.<split>.cache.npz``, or
``<json stem>.<split>.cache.npz`` beside a COCO json); when that folder is read-only or does not exist (no dataset
folder is created), in ``cache_dir`` (default ``~/.cache/yolo11_lightning``) under a name derived from that location.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from yolo11_lightning.data.images.limits import DEFAULT_MAX_IMAGE_PIXELS, ImageTooLargeError, pixel_limit
from yolo11_lightning.data.shards.reader import is_shard_location, load_shard_split, open_index, shard_config
from yolo11_lightning.data.sources import coco, imagefolder, yolo
from yolo11_lightning.data.sources.cache import CACHE_VERSION, default_cache_dir, load_cache, save_cache
from yolo11_lightning.data.sources.checks import CLIP_TOLERANCE, DataReport
from yolo11_lightning.data.sources.config import DatasetConfig, DatasetError, load_dataset_config
from yolo11_lightning.data.sources.packed_records import PackedRecords
from yolo11_lightning.data.sources.split_entry import SplitEntry

__all__ = ["DataReport", "DatasetError", "dataset_config", "load_split", "split_name"]

log = logging.getLogger("yolo11_lightning.data")
MAX_LOGGED_WARNINGS = 100  # per load; `yolo11-lightning check-data` prints them all
_emitted: set[str] = set()  # each warning line goes to the log once per process


# Every format's ``open_entry``, asked in turn; the first that claims an entry reads it. YOLO takes any entry
# the others leave, so it comes last. A new format is one module with an ``open_entry`` listed here.
FORMATS: tuple[Callable[[str, set[str]], SplitEntry | None], ...] = (
    coco.open_entry,
    imagefolder.open_entry,
    yolo.open_entry,
)


def dataset_config(path: str | os.PathLike) -> DatasetConfig:
    """The dataset at ``path``: a shard folder (a url, or a folder holding ``index.json``: ``shards.reader``), a
    dataset yaml (``config.load_dataset_config``), or a folder, read as the ImageFolder root of a classification
    dataset (``imagefolder.folder_config``)."""
    if is_shard_location(os.fspath(path)):
        return shard_config(os.fspath(path))
    if os.path.isdir(os.path.expanduser(os.fspath(path))):
        return imagefolder.folder_config(path)
    return load_dataset_config(path)


def split_name(config: DatasetConfig, split: str) -> str:
    """How a message names a split: ``<dataset>: split `val` (<its entries>)``."""
    entries = ", ".join(config.resolve(e) for e in config.splits.get(split) or [])
    return f"{config.source}: split `{split}` ({entries})"


def _open_entry(path: str, seen: set[str]) -> SplitEntry:
    for open_entry in FORMATS:
        entry = open_entry(path, seen)
        if entry is not None:
            return entry
    raise DatasetError(f"{path}: no dataset format reads this entry")  # unreachable: YOLO takes any entry


def _list_entries(config: DatasetConfig, split: str) -> list[SplitEntry]:
    if not config.splits.get(split):
        defined = ", ".join(config.splits) or "none"
        raise DatasetError(f"{config.source}: split `{split}` is not defined (defined: {defined})")
    entries, seen = [], set()
    for raw in config.splits[split]:
        path = config.resolve(raw)
        if not os.path.exists(path):
            raise DatasetError(f"{config.source}: key `{split}`: {path} does not exist")
        entries.append(_open_entry(path, seen))  # an image listed twice is used once
    if not any(e.has_images() for e in entries):
        raise DatasetError(
            f"{config.source}: split `{split}`: no image files found in {config.splits[split]}"
        )
    return entries


def _cache_key(config: DatasetConfig, split: str, entries: list[SplitEntry]) -> str:
    h = hashlib.sha1(
        json.dumps(
            [CACHE_VERSION, split, config.names, CLIP_TOLERANCE, config.options.cache_value()]
            + ([True] if config.outline_labels else [])
        ).encode()
    )
    for e in entries:
        e.fingerprint(h, config.image_dirs.get(e.path, ""))
    return h.hexdigest()


def _cache_locations(
    entries: list[SplitEntry], split: str, cache_dir: str | Path | None
) -> tuple[Path, Path]:
    """(beside the labels, in the cache folder) for a split; both in the cache folder when the folder beside the
    labels does not exist (an unlabelled set has no ``labels/``: the cache never creates a dataset folder)."""
    primary = entries[0].cache_path(split)
    tag = hashlib.sha1(str(primary).encode()).hexdigest()[:12]
    fallback = Path(cache_dir or default_cache_dir()) / f"{primary.stem}-{tag}.npz"
    return (primary if primary.parent.is_dir() else fallback), fallback


def label_cache_locations(
    config: DatasetConfig, split: str, cache_dir: str | Path | None = None
) -> tuple[Path, Path]:
    """(beside the labels, in the cache folder): where the label cache of ``split`` goes."""
    return _cache_locations(_list_entries(config, split), split, cache_dir)


def check_workers() -> int:
    """Processes (or threads) that check a split's images: the cores this process may run on, at most 32."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(32, cores))


def _parse(
    config: DatasetConfig,
    split: str,
    entries: list[SplitEntry],
    workers: int | None,
    max_pixels: int | None,
) -> tuple[PackedRecords, DataReport, list[str]]:
    report = DataReport(split=split)
    parts: list[PackedRecords] = []
    deps: list[str] = []
    for e in entries:
        recs, paths = e.parse(config, split, report, workers or check_workers(), max_pixels)
        parts.append(recs if isinstance(recs, PackedRecords) else PackedRecords(recs))
        deps += paths
    return PackedRecords.concatenate(parts), report, deps


def refuse_too_large(records: PackedRecords, report: DataReport, max_pixels: int | None) -> PackedRecords:
    """The records within ``max_pixels`` (None or 0: all); the others move to the report's refused images.

    For records of a cache built under a higher limit (or none): their sizes are stored, so nothing is read.
    """
    limit = pixel_limit(max_pixels)
    pixels = records._sizes[:, 0] * records._sizes[:, 1]
    if limit is None or not (pixels > limit).any():
        return records
    for i in np.flatnonzero(pixels > limit):
        r = records[int(i)]
        report.remove_image(len(r.classes), r.num_polygons)
        report.skip_image(r.path, ImageTooLargeError(r.path, r.height, r.width, limit).reason, too_large=True)
    return records.select(pixels <= limit)


def _emit(report: DataReport, config: DatasetConfig) -> None:
    fresh = [w for w in report.warnings if w not in _emitted]
    for line in fresh[:MAX_LOGGED_WARNINGS]:
        log.warning(line)
    _emitted.update(fresh)
    if len(fresh) > MAX_LOGGED_WARNINGS:
        log.warning(
            "... and %d more warnings; list them all with: yolo11-lightning check-data --dataset %s",
            len(fresh) - MAX_LOGGED_WARNINGS,
            config.source,
        )
    log.info(report.summary())


def load_split(
    config: DatasetConfig,
    split: str,
    cache_dir: str | Path | None = None,
    use_cache: bool = True,
    *,
    verbose: bool = True,
    workers: int | None = None,
    max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
) -> tuple[PackedRecords, DataReport]:
    """Checked records of one split (in a stable order) and the report of what was skipped.

    Args:
        config: the dataset.
        split: "train", "val" or "test".
        cache_dir: where the cache goes when the dataset folder is read-only.
        use_cache: False: check everything and neither read nor write a cache.
        verbose: log each warning (once per process) and the summary; pass False on ranks > 0.
        workers: processes (threads for COCO) checking images (default ``check_workers()``: every usable core).
        max_image_pixels: images of more pixels are refused from their headers, undecoded, and reported
            (``images.limits.DEFAULT_MAX_IMAGE_PIXELS``, the reference's limit; None or 0: no limit).

    Raises:
        DatasetError: the split is not defined, an entry is missing, or no image is usable.
    """
    pixel_limit(max_image_pixels)  # a negative limit fails here, before any work
    if config.shards is not None:  # checked when converted: the records as they were written
        records, _ = load_shard_split(open_index(config.shards), split)
        rows = np.diff(records._label_ends, prepend=0)
        report = DataReport(split=split, num_images=len(records), num_boxes=records.num_labels())
        report.num_background, report.num_polygons = int((rows == 0).sum()), records.num_polygons()
        report.cache_path = f"{config.shards} (shards)"
        return records, report
    entries = _list_entries(config, split)
    cached = None
    if use_cache:
        key = _cache_key(config, split, entries)
        primary, fallback = _cache_locations(entries, split, cache_dir)
        cached = load_cache(primary, key, max_image_pixels) or load_cache(fallback, key, max_image_pixels)
    if cached is not None:
        records, report = cached
        records = refuse_too_large(records, report, max_image_pixels)
    else:
        records, report, deps = _parse(config, split, entries, workers, max_image_pixels)
        if use_cache:
            for path in (primary, fallback):
                try:
                    save_cache(path, key, records, report, deps, max_image_pixels)
                    report.cache_path = str(path)
                    break
                except OSError as e:
                    log.debug("cannot write label cache %s: %s", path, e)
            else:
                log.warning(
                    "could not write the label cache for split %s (tried %s, %s)", split, primary, fallback
                )
    report.split = split
    if verbose:
        _emit(report, config)
    if not records:
        problems = "\n  ".join(report.warnings[:10]) or "(no warnings)"
        raise DatasetError(
            f"{config.source}: split `{split}` has no usable image ({report.summary()}). First problems:\n  {problems}"
        )
    return records.with_flip_idx(config.options.flip_idx), report
