"""YOLO txt datasets: image lists from folders or .txt files, one label file per image.

Label file of an image: its path with the last ``/images/`` replaced by ``/labels/`` and the
extension by ``.txt`` (beside the image when the path has no ``images`` folder). A missing label
file means a background image. Rows are ``class cx cy w h`` normalised to the image as displayed
(after EXIF rotation), or polygons ``class x1 y1 x2 y2 x3 y3 ...`` whose extent is the box.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from yolo11_lightning.data.image_io import IMAGE_EXTENSIONS, ImageReadError, probe_image
from yolo11_lightning.data.sources.cache import hash_files
from yolo11_lightning.data.sources.checks import CheckedRows, DataReport, check_rows
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


def parse_label_text(text: str, label_path: str, num_classes: int) -> CheckedRows:
    """Parse and check the rows of one YOLO label file; rejected rows carry their line number."""
    classes, boxes, lows, highs, names = [], [], [], [], []
    line_of: list[int] = []
    early: list[tuple[int, str]] = []  # (line, reason) found before the shared checks
    for line_no, line in enumerate(text.splitlines(), 1):
        tokens = line.split()
        n = len(tokens)
        if n == 0:
            continue
        if n != 5 and (n < 7 or n % 2 == 0):
            early.append(
                (
                    line_no,
                    f"expected 5 values (class cx cy w h) or a polygon (class x y x y x y ...), got {n}",
                )
            )
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
        else:
            xs, ys = coords[0::2], coords[1::2]
            boxes.append((min(xs), min(ys), max(xs), max(ys)))
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
    return checked


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
    row_problems: list[str] = field(default_factory=list)
    num_clipped: int = 0
    has_label_file: bool = False


def _load_one(image_path: str, num_classes: int) -> _ImageResult:
    try:
        height, width = probe_image(image_path)
    except ImageReadError as e:
        return _ImageResult(image_problem=e.reason)
    label_path = label_path_for(image_path)
    try:
        with open(label_path, encoding="utf-8-sig") as f:
            text = f.read()
    except FileNotFoundError:
        return _ImageResult(record=ImageRecord(image_path, height, width))  # background image
    except (OSError, UnicodeDecodeError) as e:
        # Training it as background would teach the detector that its objects are background.
        return _ImageResult(image_problem=f"label file {label_path} unreadable ({e})")
    checked = parse_label_text(text, label_path, num_classes)
    return _ImageResult(
        record=ImageRecord(image_path, height, width, checked.classes, checked.boxes),
        row_problems=[f"{label_path}:{line}: {why}" for line, why in checked.rejected],
        num_clipped=checked.num_clipped,
        has_label_file=True,
    )


def load_yolo_images(
    images: list[str],
    num_classes: int,
    report: DataReport,
    map_fn: Callable[[Callable, Iterable], Iterable] = map,
) -> list[ImageRecord]:
    """Check images and parse their labels; problems go to ``report``, records come back in order.

    ``map_fn`` runs the per-image work (``executor.map`` to use threads: OpenCV decodes and file
    reads release the GIL).
    """
    records: list[ImageRecord] = []
    any_label_file = False
    for image_path, result in zip(images, map_fn(lambda p: _load_one(p, num_classes), images)):
        if result.record is None:
            report.skip_image(image_path, result.image_problem or "unusable")
            continue
        for line in result.row_problems:
            report.num_skipped_rows += 1
            report.warnings.append(line)
        report.num_clipped_rows += result.num_clipped
        report.add_image(len(result.record.classes))
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
        # "False": the entry-kind tag of the cache key since its first version (COCO writes "True"), so
        # caches written before the formats became modules stay valid.
        h.update(f"{self.path}\0False\0{image_dir}\n".encode())
        for image in self.images:
            hash_files([image, label_path_for(image)], h)
        h.update("\0".join(self.repeated).encode())

    def cache_path(self, split: str) -> Path:
        labels = Path(label_path_for(self.images[0])).parent if self.images else Path(self.path)
        return labels.with_name(f"{labels.name}.{split}.cache.npz")

    def parse(
        self, config: DatasetConfig, split: str, report: DataReport, map_fn: MapFn
    ) -> tuple[list[ImageRecord], list[str]]:
        for image in self.repeated:
            report.note(f"{image}: listed more than once in split `{split}` (via {self.path}); used once")
        return load_yolo_images(self.images, config.num_classes, report, map_fn), []


def open_entry(path: str, seen: set[str]) -> YoloEntry:
    """Any entry that is not another format's: list its images (an image already in ``seen`` is used once)."""
    entry = YoloEntry(path)
    for image in list_images(path):
        (entry.repeated if image in seen else entry.images).append(image)
        seen.add(image)
    return entry
