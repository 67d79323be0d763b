"""Label cache: a split's checked records and report, saved once so the next start skips the checks.

Format: one ``.npz`` (``np.savez``, read with ``allow_pickle=False``: a cache file can never run
code; before that, ``check_npz`` checks that no entry claims more bytes than the file holds, so a
crafted cache cannot make ``np.load`` allocate either) holding the flat arrays of ``PackedRecords``
(``packed_records.FIELDS``: the image paths as one UTF-8 blob and their ends, sizes, per-image row ends, all
classes and boxes, every instance's polygon vertex count and all vertices, every instance's keypoints), the dependency paths as one blob,
and a small json header (format version, key, report, dependency hash). Loading hands the arrays to
``PackedRecords.from_arrays`` after vectorised consistency checks: no per-record Python object is built.

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
import time
import zipfile
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from yolo11_lightning.data.images.limits import DEFAULT_MAX_IMAGE_PIXELS, pixel_limit
from yolo11_lightning.data.sources.checks import DataReport
from yolo11_lightning.data.sources.packed_records import FIELDS, PackedRecords

# 4: the arrays of ``PackedRecords`` as they are (path ends, label ends, keypoints). A cache of another version
# is rebuilt: the key hashes the version too, and ``load_cache`` refuses any other one.
CACHE_VERSION = 4
log = logging.getLogger("yolo11_lightning.data.cache")


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/yolo11_lightning`` (``~/.cache/yolo11_lightning``): used when the dataset is read-only."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "yolo11_lightning"


STAT_CHUNK = 8192  # paths one thread stats in turn
# A stat that takes longer than this on average waits on a server (a network filesystem), not on the CPU: from the
# first chunk that slow on, the rest are stat'ed in threads, whose waits overlap (stat releases the GIL). A local or
# cached stat takes a few microseconds, all of it CPU, and there threads only fight over the GIL: 200,000 paths on
# 2 cores take 0.8 CPU s in one thread and 3.4 CPU s (2.2 s wall) in 8.
SLOW_STAT_S = 50e-6
STAT_THREADS = 8


def _stat_lines(paths: Sequence[str]) -> str:
    """``"<path>\0<size>:<mtime ns>\n"`` per path (``missing`` for one that cannot be stat'ed)."""
    lines, stat = [], os.stat
    for p in paths:
        try:
            st = stat(p)
        except OSError:
            lines.append(f"{p}\0missing\n")
            continue
        lines.append(f"{p}\0{st.st_size}:{st.st_mtime_ns}\n")
    return "".join(lines)


def hash_files(paths: Iterable[str], h=None):
    """Update (or start) a sha1 with each path and its size and mtime, in order; returns the hash object.

    One ``stat`` per path, chunk by chunk in this thread; once a chunk averages more than ``SLOW_STAT_S`` per path,
    the remaining chunks go to ``STAT_THREADS`` threads. The hash is the same either way.
    """
    h = h or hashlib.sha1()
    paths = paths if isinstance(paths, list) else list(paths)
    chunks = [paths[i : i + STAT_CHUNK] for i in range(0, len(paths), STAT_CHUNK)]
    done = 0
    for chunk in chunks:
        started = time.perf_counter()
        h.update(_stat_lines(chunk).encode())
        done += 1
        if time.perf_counter() - started > SLOW_STAT_S * len(chunk):
            break
    if done < len(chunks):
        with ThreadPoolExecutor(min(STAT_THREADS, len(chunks) - done), thread_name_prefix="stat") as pool:
            for text in pool.map(_stat_lines, chunks[done:]):
                h.update(text.encode())
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
    records: PackedRecords,
    report: DataReport,
    deps: list[str],
    max_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
) -> None:
    """Write atomically; raises OSError when the folder is not writable. ``max_pixels``: the pixel limit
    the records were checked under (None or 0: none)."""
    meta = {
        "version": CACHE_VERSION,
        "key": key,
        "max_image_pixels": pixel_limit(max_pixels) or 0,
        "deps_hash": hash_files(deps).hexdigest(),
        "num_deps": len(deps),
        "polygons": records.has_polygons,
        "report": {**report.to_dict(), "cache_path": None, "from_cache": False},
    }
    arrays = {
        "meta": np.frombuffer(json.dumps(meta).encode("utf-8"), np.uint8),
        "deps": _blob(deps),
        **records.arrays(),
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
) -> tuple[PackedRecords, DataReport] | None:
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
            deps = _unblob(z["deps"], int(meta["num_deps"]))
            if hash_files(deps).hexdigest() != meta["deps_hash"]:
                return None
            arrays = {name: z[name] for name in FIELDS}
        arrays["paths"].tobytes().decode("utf-8")  # every path is text (a crafted file fails here, not later)
        records = PackedRecords.from_arrays(arrays, polygons=bool(meta.get("polygons", True)))
    except (OSError, ValueError, KeyError, IndexError, zipfile.BadZipFile, UnicodeDecodeError) as e:
        log.debug("ignoring unreadable label cache %s: %s", path, e)
        return None
    report = DataReport.from_dict(meta["report"])
    report.cache_path, report.from_cache = str(path), True
    return records, report
