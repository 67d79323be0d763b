"""Label cache: a split's checked records and report, saved once so the next start skips the checks.

Format: one ``.npz`` (``np.savez``, read with ``allow_pickle=False``: a cache file can never run
code; before that, ``check_npz`` checks that no entry claims more bytes than the file holds, so a
crafted cache cannot make ``np.load`` allocate either) holding flat arrays: the image paths as one UTF-8 blob, sizes, per-image box counts, all
classes and boxes, every instance's polygon vertex count and all vertices, and a small json header
(format version, key, report, dependency hash).

Validity: ``key`` hashes what can be listed before parsing (config, entries, image and label
paths with sizes and mtimes, json files); ``deps`` lists files only known after parsing (the
images a COCO json names), re-stat'ed on load. Any change -> rebuilt. The pixel limit the cache was
built under is in the header, not the key: a cache built under a higher limit (or none) stays valid
under a lower one, whose caller refuses the records above it from their stored sizes
(``split.load_split``); one that refused images for their size is rebuilt under a higher limit (those
images may now be usable). Writes are atomic
(temporary file in the same folder, then ``os.replace``), so concurrent readers see the old or the
new file, never half of one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import zipfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from yolo11_lightning.data.images.io import DEFAULT_MAX_IMAGE_PIXELS, pixel_limit
from yolo11_lightning.data.sources.checks import DataReport
from yolo11_lightning.data.sources.records import ImageRecord

# 2: records keep their polygons (``segments``, ``segment_sizes``). A cache of another version is rebuilt:
# the key hashes the version too, and ``load_cache`` refuses any other one.
CACHE_VERSION = 2
log = logging.getLogger("yolo11_lightning.data.cache")  # its name before the move to data.sources


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/yolo11_lightning`` (``~/.cache/yolo11_lightning``): used when the dataset is read-only."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "yolo11_lightning"


def _stat_token(path: str) -> str:
    try:
        st = os.stat(path)
    except OSError:
        return "missing"
    return f"{st.st_size}:{st.st_mtime_ns}"


def hash_files(paths: Iterable[str], h=None):
    """Update (or start) a sha1 with each path and its size and mtime; returns the hash object."""
    h = h or hashlib.sha1()
    for p in paths:
        h.update(f"{p}\0{_stat_token(p)}\n".encode())
    return h


def _blob(strings: list[str]) -> np.ndarray:
    return np.frombuffer("\0".join(strings).encode("utf-8"), np.uint8)


def _unblob(arr: np.ndarray, count: int) -> list[str]:
    if count == 0:
        return []
    out = arr.tobytes().decode("utf-8").split("\0")
    if len(out) != count:
        raise ValueError("path blob does not match the record count")
    return out


def save_cache(
    path: Path,
    key: str,
    records: list[ImageRecord],
    report: DataReport,
    deps: list[str],
    max_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
) -> None:
    """Write atomically; raises OSError when the folder is not writable. ``max_pixels``: the pixel limit
    the records were checked under (None or 0: none)."""
    counts = np.array([len(r.classes) for r in records], np.int64)
    meta = {
        "version": CACHE_VERSION,
        "key": key,
        "max_image_pixels": pixel_limit(max_pixels) or 0,
        "deps_hash": hash_files(deps).hexdigest(),
        "num_deps": len(deps),
        "report": {**report.to_dict(), "cache_path": None, "from_cache": False},
    }
    arrays = {
        "meta": np.frombuffer(json.dumps(meta).encode("utf-8"), np.uint8),
        "paths": _blob([r.path for r in records]),
        "deps": _blob(deps),
        "sizes": np.array([(r.height, r.width) for r in records], np.int64).reshape(-1, 2),
        "counts": counts,
        "classes": np.concatenate([r.classes for r in records] + [np.zeros(0, np.int64)]),
        "boxes": np.concatenate([r.boxes for r in records] + [np.zeros((0, 4), np.float32)]),
        "segment_sizes": np.concatenate([r.segment_sizes for r in records] + [np.zeros(0, np.int64)]),
        "segments": np.concatenate([r.segments for r in records] + [np.zeros((0, 2), np.float32)]),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_npz(path: Path) -> str | None:
    """Why ``path`` is not an ``.npz`` we would load (None when it is fine), read from headers only.

    Every entry must be stored uncompressed inside the file (``np.savez`` stores), and each array's header
    (shape x itemsize) must fit in its entry; object arrays are refused. Raises OSError/BadZipFile.
    """
    size = path.stat().st_size
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            name = info.filename
            if info.compress_type != zipfile.ZIP_STORED or info.file_size != info.compress_size:
                return f"entry {name!r} is compressed (np.savez stores entries uncompressed)"
            if info.header_offset + info.file_size > size:
                return f"entry {name!r} claims {info.file_size} bytes, more than the file's {size}"
            with z.open(info) as f:
                version = np.lib.format.read_magic(f)
                if version == (1, 0):
                    shape, _, dtype = np.lib.format.read_array_header_1_0(f)
                elif version == (2, 0):
                    shape, _, dtype = np.lib.format.read_array_header_2_0(f)
                else:
                    return f"entry {name!r}: unsupported .npy version {version}"
            if dtype.hasobject:
                return f"entry {name!r} holds Python objects"
            nbytes = dtype.itemsize * int(np.prod(shape, dtype=object))
            if nbytes > info.file_size:
                return f"entry {name!r} claims an array of shape {shape} ({nbytes} bytes) in {info.file_size} bytes"
    return None


def _raised(limit: int | None, built: int | None) -> bool:
    """Whether pixel limit ``limit`` accepts more than ``built`` did (None: no limit)."""
    return built is not None and (limit is None or limit > built)


def load_cache(
    path: Path, key: str, max_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS
) -> tuple[list[ImageRecord], DataReport] | None:
    """Records and report from a valid cache file; None when missing, stale or unreadable, or when it
    refused images above a lower pixel limit than ``max_pixels`` (they are checked again).

    The records may include images above ``max_pixels`` (a cache built under a higher limit): the caller
    refuses them from their sizes."""
    if not path.is_file():
        return None
    try:
        problem = check_npz(path)
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        problem = f"{type(e).__name__}: {e}"
    if problem is not None:
        log.warning("ignoring label cache %s (it will be rebuilt): %s", path, problem)
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(z["meta"].tobytes().decode("utf-8"))
            if meta.get("version") != CACHE_VERSION:
                log.info(
                    "label cache %s has format %s, not %s: rebuilt", path, meta.get("version"), CACHE_VERSION
                )
                return None
            if meta.get("key") != key:
                return None
            built = meta.get("max_image_pixels") or None  # 0 or absent (older caches): no limit
            if meta["report"].get("num_too_large", 0) and _raised(pixel_limit(max_pixels), built):
                log.info(
                    "label cache %s refused images above %s pixels, a lower limit than now: rebuilt",
                    path,
                    built,
                )
                return None
            counts = z["counts"]
            deps = _unblob(z["deps"], int(meta["num_deps"]))
            if hash_files(deps).hexdigest() != meta["deps_hash"]:
                return None
            paths = _unblob(z["paths"], len(counts))
            sizes, classes, boxes = z["sizes"], z["classes"], z["boxes"]
            segment_sizes, segments = z["segment_sizes"], z["segments"]
        if (segment_sizes < 0).any() or not len(segment_sizes) == len(classes) == counts.sum():
            raise ValueError("polygon sizes do not match the instances")
        ends = np.cumsum(counts)
        starts = ends - counts
        point_at = np.concatenate([[0], np.cumsum(segment_sizes)])  # first vertex of instance i, and the end
        records = [
            ImageRecord(
                p,
                int(hw[0]),
                int(hw[1]),
                classes[s:e],
                boxes[s:e],
                segments[point_at[s] : point_at[e]],
                segment_sizes[s:e],
            )
            for p, hw, s, e in zip(paths, sizes, starts, ends)
        ]
    except (OSError, ValueError, KeyError, IndexError, zipfile.BadZipFile, UnicodeDecodeError) as e:
        log.debug("ignoring unreadable label cache %s: %s", path, e)
        return None
    report = DataReport.from_dict(meta["report"])
    report.cache_path, report.from_cache = str(path), True
    return records, report
