"""YOLO txt datasets: image lists from folders or .txt files, one label file per image.

Label file of an image: its path with the last ``/images/`` replaced by ``/labels/`` and the
extension by ``.txt`` (beside the image when the path has no ``images`` folder). A missing label
file means a background image. Rows are ``class cx cy w h`` normalised to the image as displayed
(after EXIF rotation), or polygons ``class x1 y1 x2 y2 x3 y3 ...`` (YOLO-seg) whose extent is the box
and which the record keeps as the instance's polygon (``ImageRecord.segments``). A file may mix both:
box rows have no polygon.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from yolo11_lightning.data.images.io import (
    DEFAULT_MAX_IMAGE_PIXELS,
    IMAGE_EXTENSIONS,
    ImageReadError,
    ImageTooLargeError,
    probe_image,
)
from yolo11_lightning.data.sources.cache import hash_files
from yolo11_lightning.data.sources.checks import CheckedRows, DataReport, check_polygon, check_rows
from yolo11_lightning.data.sources.config import DatasetConfig, DatasetError
from yolo11_lightning.data.sources.records import ImageRecord, MapFn


def label_path_for(image_path: str) -> str:
    """``.../images/a/b.jpg`` -> ``.../labels/a/b.txt`` (the last ``images`` folder only)."""
    sep_images, sep_labels = f"{os.sep}images{os.sep}", f"{os.sep}labels{os.sep}"
    head, found, tail = image_path.rpartition(sep_images)
    path = head + sep_labels + tail if found else image_path
    return os.path.splitext(path)[0] + ".txt"


def _is_image_name(name: str) -> bool:
    return not name.startswith(".") and name.rpartition(".")[2].lower() in IMAGE_EXTENSIONS


def list_images(entry: str) -> list[str]:
    """Absolute image paths of a split entry, in a stable order.

    A folder is walked recursively (sorted; hidden files and folders skipped; symlinks followed);
    a .txt file lists one image per line, relative lines resolved against the list's own folder
    (blank lines and ``#`` comments skipped, order kept); any other file is a single image.
    """
    if os.path.isdir(entry):
        found = []
        for folder, dirs, files in os.walk(entry, followlinks=True):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            found += [os.path.join(folder, f) for f in sorted(files) if _is_image_name(f)]
        return found
    if entry.lower().endswith(".txt"):
        base = os.path.dirname(entry)
        try:
            with open(entry, encoding="utf-8-sig") as f:
                lines = [s.strip() for s in f.read().splitlines()]
        except (OSError, UnicodeDecodeError) as e:
            raise DatasetError(f"{entry}: cannot read image list ({e})") from e
        out = []
        for line in lines:
            if line and not line.startswith("#"):
                p = os.path.expanduser(line)
                out.append(os.path.normpath(p if os.path.isabs(p) else os.path.join(base, p)))
        return out
    return [entry]


@dataclass
class LabelRows:
    """Checked rows of one label file: boxes (``checked``) and the polygons of the kept rows.

    ``segments`` (P, 2) float32 and ``segment_sizes`` (k,) int64 follow ``ImageRecord``; ``dropped`` lists
    (line, reason) of polygon rows kept as boxes without their polygon.
    """

    checked: CheckedRows
    segments: np.ndarray
    segment_sizes: np.ndarray
    dropped: list[tuple[int, str]]


def parse_label_text(text: str, label_path: str, num_classes: int) -> CheckedRows:
    """Parse and check the rows of one YOLO label file; rejected rows carry their line number."""
    return parse_label_rows(text, label_path, num_classes).checked


def parse_label_rows(text: str, label_path: str, num_classes: int) -> LabelRows:
    """``parse_label_text`` plus the polygons of the kept polygon rows (box rows have none)."""
    classes, boxes, lows, highs, names = [], [], [], [], []
    line_of: list[int] = []
    polygons: list[list[float] | None] = []
    early: list[tuple[int, str]] = []  # (line, reason) found before the shared checks
    for line_no, line in enumerate(text.splitlines(), 1):
        tokens = line.split()
        n = len(tokens)
        if n == 0:
            continue
        if n != 5 and (n < 7 or n % 2 == 0):
            why = f"expected 5 values (class cx cy w h) or a polygon (class x y x y x y ...), got {n}"
            if n >= 6:
                why += f": polygon has an odd number of coordinates ({n - 1})"
            elif n in (3, 4):
                why += f": a polygon needs at least 3 points, got {(n - 1) // 2}"
            early.append((line_no, why))
            continue
        try:
            values = [float(t) for t in tokens]
        except ValueError:
            bad = next(t for t in tokens if not _is_float(t))
            early.append((line_no, f"not a number: {bad!r}"))
            continue
        if not all(map(math.isfinite, values)):
            early.append((line_no, "value is not a finite number (NaN or inf)"))
            continue
        coords = values[1:]
        if n == 5:
            cx, cy, w, h = coords
            boxes.append((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2))
            polygons.append(None)
        else:
            xs, ys = coords[0::2], coords[1::2]
            boxes.append((min(xs), min(ys), max(xs), max(ys)))
            polygons.append(coords)
        classes.append(values[0])
        lows.append(min(coords))
        highs.append(max(coords))
        names.append(f"line {line_no}")
        line_of.append(line_no)
    checked = check_rows(
        np.asarray(classes, np.float64),
        np.asarray(boxes, np.float64).reshape(-1, 4),
        np.asarray(lows, np.float64),
        np.asarray(highs, np.float64),
        num_classes,
        names,
    )
    rejected = [(line_of[i], why) for i, why in checked.rejected] + early
    checked.rejected = sorted(rejected)  # by line number
    kept_polygons, dropped = [], []
    for i in checked.kept:
        coords = polygons[i]
        points, why = (None, None) if coords is None else check_polygon(coords)
        if why is not None:  # its box passed the row checks: kept without the polygon
            dropped.append((line_of[i], why))
        kept_polygons.append(np.zeros((0, 2), np.float32) if points is None else points)
    return LabelRows(
        checked,
        np.concatenate([*kept_polygons, np.zeros((0, 2), np.float32)]),
        np.array([len(p) for p in kept_polygons], np.int64),
        dropped,
    )


def _is_float(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


@dataclass
class _ImageResult:
    """What one worker found for one image; merged into the report in dataset order."""

    record: ImageRecord | None = None
    image_problem: str | None = None
    too_large: bool = False  # the image problem: above the pixel limit
    row_problems: list[str] = field(default_factory=list)
    polygon_problems: list[tuple[str, str]] = field(default_factory=list)  # (where, why): box kept
    num_clipped: int = 0
    has_label_file: bool = False


def _load_one(image_path: str, num_classes: int, max_pixels: int | None) -> _ImageResult:
    try:
        height, width = probe_image(image_path, max_pixels)
    except ImageReadError as e:
        return _ImageResult(image_problem=e.reason, too_large=isinstance(e, ImageTooLargeError))
    label_path = label_path_for(image_path)
    try:
        with open(label_path, encoding="utf-8-sig") as f:
            text = f.read()
    except FileNotFoundError:
        return _ImageResult(record=ImageRecord(image_path, height, width))  # background image
    except (OSError, UnicodeDecodeError) as e:
        # Training it as background would teach the detector that its objects are background.
        return _ImageResult(image_problem=f"label file {label_path} unreadable ({e})")
    rows = parse_label_rows(text, label_path, num_classes)
    checked = rows.checked
    record = ImageRecord(
        image_path, height, width, checked.classes, checked.boxes, rows.segments, rows.segment_sizes
    )
    return _ImageResult(
        record=record,
        row_problems=[f"{label_path}:{line}: {why}" for line, why in checked.rejected],
        polygon_problems=[(f"{label_path}:{line}", why) for line, why in rows.dropped],
        num_clipped=checked.num_clipped,
        has_label_file=True,
    )


def load_yolo_images(
    images: list[str],
    num_classes: int,
    report: DataReport,
    map_fn: Callable[[Callable, Iterable], Iterable] = map,
    max_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
) -> list[ImageRecord]:
    """Check images and parse their labels; problems go to ``report``, records come back in order.

    ``map_fn`` runs the per-image work (``executor.map`` to use threads: OpenCV decodes and file
    reads release the GIL). An image above ``max_pixels`` (None or 0: no limit) is skipped from its
    header, undecoded.
    """
    records: list[ImageRecord] = []
    any_label_file = False
    for image_path, result in zip(images, map_fn(lambda p: _load_one(p, num_classes, max_pixels), images)):
        if result.record is None:
            report.skip_image(image_path, result.image_problem or "unusable", result.too_large)
            continue
        for line in result.row_problems:
            report.num_skipped_rows += 1
            report.warnings.append(line)
        for location, why in result.polygon_problems:
            report.drop_polygon(location, why)
        report.num_clipped_rows += result.num_clipped
        report.add_image(len(result.record.classes), result.record.num_polygons)
        records.append(result.record)
        any_label_file |= result.has_label_file
    if records and not any_label_file:
        report.note(
            f"no label file found for any of {len(records)} images (expected e.g. "
            f"{label_path_for(records[0].path)}): all are treated as background"
        )
    return records


@dataclass
class YoloEntry:
    """An image folder or ``.txt`` image list of a split, and the images it lists (``SplitEntry``)."""

    path: str
    images: list[str] = field(default_factory=list)  # listed images, first listing only
    repeated: list[str] = field(default_factory=list)  # images already listed earlier in the split

    def has_images(self) -> bool:
        return bool(self.images)

    def fingerprint(self, h, image_dir: str) -> None:
        # "False": this entry kind's tag in the cache key (COCO writes "True").
        h.update(f"{self.path}\0False\0{image_dir}\n".encode())
        for image in self.images:
            hash_files([image, label_path_for(image)], h)
        h.update("\0".join(self.repeated).encode())

    def cache_path(self, split: str) -> Path:
        labels = Path(label_path_for(self.images[0])).parent if self.images else Path(self.path)
        return labels.with_name(f"{labels.name}.{split}.cache.npz")

    def parse(
        self, config: DatasetConfig, split: str, report: DataReport, map_fn: MapFn, max_pixels: int | None
    ) -> tuple[list[ImageRecord], list[str]]:
        for image in self.repeated:
            report.note(f"{image}: listed more than once in split `{split}` (via {self.path}); used once")
        return load_yolo_images(self.images, config.num_classes, report, map_fn, max_pixels), []


def open_entry(path: str, seen: set[str]) -> YoloEntry:
    """Any entry that is not another format's: list its images (an image already in ``seen`` is used once)."""
    entry = YoloEntry(path)
    for image in list_images(path):
        (entry.repeated if image in seen else entry.images).append(image)
        seen.add(image)
    return entry
