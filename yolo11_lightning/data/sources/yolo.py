"""YOLO txt datasets: image lists from folders or .txt files, one label file per image.

Label file of an image: its path with the last ``/images/`` replaced by ``/labels/`` and the
extension by ``.txt`` (beside the image when the path has no ``images`` folder). A missing label
file means a background image. Rows are ``class cx cy w h`` normalised to the image as displayed
(after EXIF rotation), or polygons ``class x1 y1 x2 y2 x3 y3 ...`` (YOLO-seg) whose extent is the box
and which the record keeps as the instance's polygon (``ImageRecord.segments``). A file may mix both:
box rows have no polygon. In a keypoint dataset (its yaml declares K keypoints of D values:
``label_options.LabelOptions``) every row is ``class cx cy w h`` then K keypoints of D values ``x y [visibility]``
(x, y normalised; visibility 0, 1 or 2), kept as ``ImageRecord.keypoints``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from yolo11_lightning.data.images.io import probe_image
from yolo11_lightning.data.images.limits import DEFAULT_MAX_IMAGE_PIXELS, ImageReadError, ImageTooLargeError
from yolo11_lightning.data.sources._processes import ordered_map
from yolo11_lightning.data.sources.cache import hash_files
from yolo11_lightning.data.sources.checks import (
    CLIP_TOLERANCE,
    CheckedRows,
    DataReport,
    check_outline,
    check_polygon,
    check_rows,
)
from yolo11_lightning.data.sources.config import DatasetConfig
from yolo11_lightning.data.sources.label_options import LabelOptions
from yolo11_lightning.data.sources.listing import ImageListing, list_images
from yolo11_lightning.data.sources.packed_records import PackedRecords

# Images one process checks per task: at least 4 runs per process, so a slow run does not leave the others
# idle (photo-sized JPEGs take about 1 ms each), between these bounds (each run's result travels back once).
RUN_IMAGES = (128, 2000)


def label_path_for(image_path: str) -> str:
    """``.../images/a/b.jpg`` -> ``.../labels/a/b.txt`` (the last ``images`` folder only)."""
    sep_images, sep_labels = f"{os.sep}images{os.sep}", f"{os.sep}labels{os.sep}"
    head, found, tail = image_path.rpartition(sep_images)
    path = head + sep_labels + tail if found else image_path
    return os.path.splitext(path)[0] + ".txt"


def has_label_rows(image_path: str) -> bool:
    """Whether the image has a YOLO label file whose first row is numbers (a caption or other text in its place,
    or an empty file, is not evidence of a YOLO layout)."""
    try:
        with open(label_path_for(image_path), encoding="utf-8-sig", errors="replace") as f:
            for line in f:
                tokens = line.split()
                if tokens:
                    return len(tokens) >= 5 and all(map(_is_float, tokens))
    except OSError:
        return False
    return False


@dataclass
class LabelRows:
    """Checked rows of one label file: boxes (``checked``) and the polygons of the kept rows.

    ``segments`` (P, 2) float32 and ``segment_sizes`` (k,) int64 follow ``ImageRecord``; ``dropped`` lists
    (line, reason) of polygon rows kept as boxes without their polygon (dropped whole with ``outlines``).
    """

    checked: CheckedRows
    segments: np.ndarray
    segment_sizes: np.ndarray
    dropped: list[tuple[int, str]]
    keypoints: np.ndarray | None = None  # (k, K, 3) of the kept rows in a keypoint dataset (``ImageRecord``)


def parse_label_text(text: str, label_path: str, num_classes: int) -> CheckedRows:
    """Parse and check the rows of one YOLO label file; rejected rows carry their line number."""
    return parse_label_rows(text, label_path, num_classes).checked


def parse_label_rows(
    text: str,
    label_path: str,
    num_classes: int,
    options: LabelOptions | None = None,
    outlines: bool = False,
) -> LabelRows:
    """``parse_label_text`` plus the polygons of the kept polygon rows (box rows have none); when the ``options``
    have keypoints every row is a box and K keypoints (module docstring) and the result has their ``keypoints``. With
    ``outlines`` (the polygons are the labels: oriented boxes) a polygon row whose outline fails its checks
    (``checks.check_outline``: four degenerate corners, zero area) is dropped whole and listed in ``dropped``."""
    classes, boxes, lows, highs, names = [], [], [], [], []
    line_of: list[int] = []
    polygons: list[list[float] | None] = []
    points_of: list[np.ndarray] = []
    early: list[tuple[int, str]] = []  # (line, reason) found before the shared checks
    options = options or LabelOptions()
    keypoints = options.num_keypoints  # K per row; 0: box and polygon rows
    for line_no, line in enumerate(text.splitlines(), 1):
        tokens = line.split()
        n = len(tokens)
        if n == 0:
            continue
        if keypoints:
            problem = options.row_problem(n)
            if problem is not None:
                early.append((line_no, problem))
                continue
        if not keypoints and n != 5 and (n < 7 or n % 2 == 0):
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
        if keypoints:
            points, why = options.check_points(coords[4:])
            if why is not None:
                early.append((line_no, why))
                continue
            points_of.append(points)
            coords = coords[:4]
        if len(coords) == 4:
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
    kept_polygons, dropped, usable = [], [], []
    for i in checked.kept:
        coords = polygons[i]
        points, why = (
            (None, None) if coords is None else (check_outline if outlines else check_polygon)(coords)
        )
        if why is not None:  # its box passed the row checks: kept without the polygon, or dropped (outlines)
            dropped.append((line_of[i], why))
            if outlines:
                continue
        usable.append(i)
        kept_polygons.append(np.zeros((0, 2), np.float32) if points is None else points)
    if len(usable) < len(checked.kept):  # rows dropped whole: ``checked`` keeps the others
        keep = np.isin(checked.kept, usable)
        checked.classes, checked.boxes, checked.kept = (
            checked.classes[keep],
            checked.boxes[keep],
            checked.kept[keep],
        )
    kept_points = None
    if keypoints:
        kept_points = np.zeros((len(checked.kept), keypoints, 3), np.float32)
        for j, i in enumerate(checked.kept):
            kept_points[j] = points_of[i]
    return LabelRows(
        checked,
        np.concatenate([*kept_polygons, np.zeros((0, 2), np.float32)]),
        np.array([len(p) for p in kept_polygons], np.int64),
        dropped,
        kept_points,
    )


def _is_float(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def _read_label(image_path: str) -> tuple[str | None, str | None]:
    """(text, None), (None, None) when there is no label file (a background image), or (None, problem)."""
    label_path = label_path_for(image_path)
    try:
        with open(label_path, encoding="utf-8-sig") as f:
            return f.read(), None
    except FileNotFoundError:
        return None, None
    except (OSError, UnicodeDecodeError) as e:
        # Training it as background would teach the detector that its objects are background.
        return None, f"label file {label_path} unreadable ({e})"


def _box_values(text: str) -> list[float] | None:
    """The values of a file of box rows only (5 numbers a line, blank lines skipped); None for anything else."""
    values: list[float] = []
    for line in text.splitlines():
        tokens = line.split()
        if not tokens:
            continue
        if len(tokens) != 5:
            return None
        try:
            values += map(float, tokens)
        except ValueError:
            return None
    return values


def _clean_rows(values: np.ndarray, image_of: np.ndarray, num_classes: int) -> np.ndarray:
    """(R,) bool: the box rows ``check_rows`` keeps exactly as written (nothing rejected, clipped or duplicate).

    ``values`` (R, 5) float64 ``class cx cy w h``, ``image_of`` (R,) int64 the image of each row (rows of an
    image together). A row outside this answer is not necessarily bad: its image is checked row by row.
    """
    cls, cx, cy, w, h = values.T
    xyxy = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1)
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(values).all(1) & (cls == np.round(cls)) & (cls >= 0) & (cls < num_classes)
        ok &= (xyxy[:, 2:] > xyxy[:, :2]).all(1) & (xyxy >= 0).all(1) & (xyxy <= 1).all(1)
        ok &= (values[:, 1:] >= -CLIP_TOLERANCE).all(1) & (values[:, 1:] <= 1 + CLIP_TOLERANCE).all(1)
    if len(values) > 1:  # exact duplicates of (class, corners) within an image
        keys = np.concatenate([image_of[:, None].astype(np.float64), cls[:, None], xyxy], 1)
        order = np.lexsort(keys.T[::-1])
        same = (keys[order[1:]] == keys[order[:-1]]).all(1)
        ok[order[1:][same]] = False
        ok[order[:-1][same]] = False
    return ok


def check_images(
    images: list[str],
    num_classes: int,
    max_pixels: int | None,
    options: LabelOptions | None = None,
    outlines: bool = False,
) -> tuple[PackedRecords, DataReport, bool]:
    """Check a run of images and parse their labels: (records in order, what was skipped, any label file).

    Each image's header is read and its data decoded at a reduced scale (``probe_image``); each label row is
    checked. Files of plain box rows are checked together, vectorised; a file with anything else (a polygon,
    a bad or clipped or duplicate row) and every file of a keypoint dataset (``options`` with keypoints) go through
    ``parse_label_rows``, whose reasons name file and line.
    """
    report = DataReport()
    found: list[tuple[int, int, str | None]] = []  # per usable image: height, width, label text
    kept_images: list[str] = []
    problems: list[tuple[str, str, bool] | None] = []  # per image: (path, reason, too large), None: usable
    any_label_file = False
    k = options.num_keypoints if options is not None else 0
    for image_path in images:
        try:
            height, width = probe_image(image_path, max_pixels)
        except ImageReadError as e:
            problems.append((image_path, e.reason, isinstance(e, ImageTooLargeError)))
            continue
        text, problem = _read_label(image_path)
        if problem is not None:
            problems.append((image_path, problem, False))
            continue
        any_label_file |= text is not None
        found.append((height, width, text))
        kept_images.append(image_path)
        problems.append(None)
    parsed = [None if text is None or k else _box_values(text) for _, _, text in found]
    counts = np.array([len(v) // 5 if v is not None else 0 for v in parsed], np.int64)
    flat = np.fromiter(
        (x for v in parsed if v is not None for x in v), np.float64, count=int(counts.sum()) * 5
    ).reshape(-1, 5)
    image_of = np.repeat(np.arange(len(found), dtype=np.int64), counts)
    clean = _clean_rows(flat, image_of, num_classes)
    fast = np.array([v is not None or text is None for v, (_, _, text) in zip(parsed, found)], bool)
    fast &= np.bincount(image_of[~clean], minlength=len(found))[: len(found)] == 0
    cls, cx, cy, w, h = flat.T
    x0, y0, x1, y1 = cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2  # as ``parse_label_rows`` computes them
    fast_classes = cls.astype(np.int64)
    fast_boxes = np.stack([(x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0], 1).astype(np.float32)
    starts = np.cumsum(counts) - counts
    classes, boxes, segment_sizes, segments, keypoints = [], [], [], [], []
    label_counts = np.zeros(len(found), np.int64)
    usable = iter(enumerate(zip(kept_images, found)))
    for skipped in problems:  # in the images' order, so the report's lines are too
        if skipped is not None:
            report.skip_image(*skipped)
            continue
        i, (path, (_, _, text)) = next(usable)
        if fast[i]:
            s, e = starts[i], starts[i] + counts[i]
            classes.append(fast_classes[s:e])
            boxes.append(fast_boxes[s:e])
            segment_sizes.append(np.zeros(e - s, np.int64))
            keypoints.append(np.zeros((e - s, k, 3), np.float32))
            label_counts[i] = e - s
            report.add_image(int(e - s))
            continue
        label_path = label_path_for(path)
        rows = parse_label_rows(text, label_path, num_classes, options, outlines)
        checked = rows.checked
        for line, why in checked.rejected:
            report.skip_row(f"{label_path}:{line}", why)
        for line, why in rows.dropped:
            (report.drop_outline if outlines else report.drop_polygon)(f"{label_path}:{line}", why)
        report.num_clipped_rows += checked.num_clipped
        classes.append(checked.classes)
        boxes.append(checked.boxes)
        segment_sizes.append(rows.segment_sizes)
        segments.append(rows.segments)
        keypoints.append(np.zeros((len(checked.classes), 0, 3), np.float32) if rows.keypoints is None
                         else rows.keypoints)  # fmt: skip
        label_counts[i] = len(checked.classes)
        report.add_image(len(checked.classes), int((rows.segment_sizes > 0).sum()))
    encoded = [p.encode("utf-8") for p in kept_images]
    packed = PackedRecords.from_arrays(
        {
            "paths": np.frombuffer(b"".join(encoded), np.uint8).copy(),
            "path_ends": np.cumsum([len(e) for e in encoded], dtype=np.int64),
            "sizes": np.array([(h, w) for h, w, _ in found], np.int64).reshape(-1, 2),
            "label_ends": np.cumsum(label_counts, dtype=np.int64),
            "classes": np.concatenate([np.zeros(0, np.int64), *classes]),
            "boxes": np.concatenate([np.zeros((0, 4), np.float32), *boxes]),
            "segment_sizes": np.concatenate([np.zeros(0, np.int64), *segment_sizes]),
            "segments": np.concatenate([np.zeros((0, 2), np.float32), *segments]),
            "keypoints": np.concatenate([np.zeros((0, k, 3), np.float32), *keypoints]),
        }
    )
    return packed, report, any_label_file


def _check_run(
    args: tuple[list[str], int, int | None, LabelOptions | None, bool],
) -> tuple[PackedRecords, DataReport, bool]:
    return check_images(*args)


def load_yolo_images(
    images: list[str],
    num_classes: int,
    report: DataReport,
    workers: int = 1,
    max_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS,
    options: LabelOptions | None = None,
    outlines: bool = False,
) -> PackedRecords:
    """Check images and parse their labels; problems go to ``report``, records come back in order.

    ``workers`` > 1: runs of ``RUN_IMAGES`` images are checked in as many processes (``_processes.ordered_map``:
    parsing holds the GIL, so threads would not help). An image above ``max_pixels`` (None or 0: no limit) is
    skipped from its header, undecoded. ``options``: the dataset's label options (keypoint rows); ``outlines``: a
    row of a bad outline is dropped (``parse_label_rows``).
    """
    size = min(RUN_IMAGES[1], max(RUN_IMAGES[0], -(-len(images) // (4 * workers))))
    runs = [
        (images[i : i + size], num_classes, max_pixels, options, outlines)
        for i in range(0, len(images), size)
    ]
    parts, any_label_file = [], False
    for packed, part, labelled in ordered_map(_check_run, runs, workers):
        report.merge(part)
        parts.append(packed)
        any_label_file |= labelled
    records = PackedRecords.concatenate(parts)
    if len(records) and not any_label_file:
        report.note(
            f"no label file found for any of {len(records)} images (expected e.g. "
            f"{label_path_for(records.path(0))}): all are treated as background"
        )
    return records


@dataclass
class YoloEntry:
    """An image folder or ``.txt`` image list of a split, and the images it lists (``SplitEntry``)."""

    path: str
    images: list[str] = field(default_factory=list)  # listed images, first listing only
    repeated: list[str] = field(default_factory=list)  # images already listed earlier in the split
    problems: list[str] = field(default_factory=list)  # links not followed, files reached twice

    def has_images(self) -> bool:
        return bool(self.images)

    def fingerprint(self, h, image_dir: str) -> None:
        # "False": this entry kind's tag in the cache key (COCO writes "True").
        h.update(f"{self.path}\0False\0{image_dir}\n".encode())
        hash_files([path for image in self.images for path in (image, label_path_for(image))], h)
        h.update("\0".join(self.repeated + self.problems).encode())

    def cache_path(self, split: str) -> Path:
        labels = Path(label_path_for(self.images[0])).parent if self.images else Path(self.path)
        return labels.with_name(f"{labels.name}.{split}.cache.npz")

    def parse(
        self, config: DatasetConfig, split: str, report: DataReport, workers: int, max_pixels: int | None
    ) -> tuple[PackedRecords, list[str]]:
        for line in self.problems:
            report.note(line)
        for image in self.repeated:
            report.note(f"{image}: listed more than once in split `{split}` (via {self.path}); used once")
        records = load_yolo_images(
            self.images,
            config.num_classes,
            report,
            workers,
            max_pixels,
            config.options,
            config.outline_labels,
        )
        return records, []


def open_entry(path: str, seen: set[str]) -> YoloEntry:
    """Any entry that is not another format's: list its images (an image already in ``seen`` is used once)."""
    entry, listing = YoloEntry(path), ImageListing()
    for image in list_images(path, listing):
        (entry.repeated if image in seen else entry.images).append(image)
        seen.add(image)
    entry.problems = listing.problems
    return entry
