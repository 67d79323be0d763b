"""Label-row validation shared by every source, and the report of what was skipped and why.

A source turns its rows (YOLO txt lines, COCO annotations) into raw class values and normalised
corner boxes; ``check_rows`` decides which rows are usable, with one reason per rejected row. One
bad row never costs the image its other rows, and one bad image never costs the split.

Polygons (``check_polygon``) are checked after their row: a row whose box is usable but whose polygon
is not (too few points, zero area, a COCO polygon out of range) keeps its box without a polygon and is
reported (``DataReport.drop_polygon``), so a detection dataset trains on the same boxes whatever its
polygons look like. Keypoints (``label_options.LabelOptions.check_points``) are checked before their row's box: a row with a bad
keypoint is refused whole, as a row whose box is bad. When the outlines are the labels a task learns (oriented
boxes: ``DatasetConfig.outline_labels``) a row whose outline fails its checks, or whose four corners are degenerate
(``degenerate_corners``: repeated, or on one line), is dropped whole (``DataReport.drop_outline``) instead of kept as
the axis-aligned box around it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

# Coordinates may overshoot [0, 1] by this much (rounding in exporters) and are clipped; beyond, rejected.
CLIP_TOLERANCE = 0.01
# Twice a normalised area at most this is none: points on one line up to float rounding.
AREA_EPS = 1e-12


@dataclass
class CheckedRows:
    """Usable rows of one image: ``classes`` (k,) int64, ``boxes`` (k, 4) float32 cx, cy, w, h in [0, 1]."""

    classes: np.ndarray
    boxes: np.ndarray
    rejected: list[tuple[int, str]]  # (input row index, reason)
    num_clipped: int
    kept: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))  # (k,) input rows


def check_rows(
    classes: np.ndarray,
    xyxy: np.ndarray,
    coord_min: np.ndarray,
    coord_max: np.ndarray,
    num_classes: int,
    row_names: Sequence[str],
) -> CheckedRows:
    """Validate n rows of one image.

    Args:
        classes: (n,) float64 class values as written.
        xyxy: (n, 4) float64 box corners normalised to the image (may lie outside it).
        coord_min, coord_max: (n,) float64 smallest/largest coordinate as written in the row (the
            values the [0, 1] rule applies to: cx, cy, w, h for YOLO boxes, points for polygons,
            corners for COCO).
        num_classes: classes must be integers in [0, num_classes).
        row_names: (n,) how a reason refers to another row, e.g. "line 3" (for duplicates).

    Rejects, in this order: non-finite values, non-integer or out-of-range class, zero or negative
    size (before the range check, so a negative width is reported as such), coordinates outside
    [-CLIP_TOLERANCE, 1 + CLIP_TOLERANCE], zero size after clipping to the image, exact
    duplicates of an earlier usable row. Kept rows are clipped to the image.
    """
    classes = np.asarray(classes, np.float64).reshape(-1)
    xyxy = np.asarray(xyxy, np.float64).reshape(-1, 4)
    lo, hi = np.asarray(coord_min, np.float64), np.asarray(coord_max, np.float64)
    n = len(classes)
    reasons: dict[int, str] = {}

    def reject(mask: np.ndarray, why) -> None:
        for i in np.flatnonzero(mask):
            reasons.setdefault(int(i), why(int(i)))

    with np.errstate(invalid="ignore"):
        finite = np.isfinite(classes) & np.isfinite(xyxy).all(1) & np.isfinite(lo) & np.isfinite(hi)
        reject(~finite, lambda i: "value is not a finite number (NaN or inf)")
        reject(finite & (classes != np.round(classes)), lambda i: f"class {classes[i]:g} is not an integer")
        reject(finite & (classes < 0), lambda i: f"negative class {classes[i]:g}")
        reject(
            finite & (classes >= num_classes),
            lambda i: (
                f"class {classes[i]:g} out of range: the dataset has {num_classes} classes (0-{num_classes - 1})"
            ),
        )
        size = xyxy[:, 2:] - xyxy[:, :2]
        reject(
            finite & (size <= 0).any(1),
            lambda i: f"zero or negative box size (w={size[i, 0]:.6g}, h={size[i, 1]:.6g})",
        )
        outside = finite & ((lo < -CLIP_TOLERANCE) | (hi > 1 + CLIP_TOLERANCE))
        reject(
            outside,
            lambda i: (
                f"coordinate {lo[i] if lo[i] < -CLIP_TOLERANCE else hi[i]:g} outside [0, 1] "
                f"(tolerance {CLIP_TOLERANCE:g})"
            ),
        )
        clipped = np.clip(np.nan_to_num(xyxy), 0.0, 1.0)
        reject(
            finite & ((clipped[:, 2:] - clipped[:, :2]) <= 0).any(1),
            lambda i: "zero box size after clipping to the image",
        )

    good = np.ones(n, bool)
    good[list(reasons)] = False
    idx = np.flatnonzero(good)
    if len(idx):
        rows = np.concatenate([classes[idx, None], clipped[idx]], 1)
        _, first, inverse = np.unique(rows, axis=0, return_index=True, return_inverse=True)
        first_of = idx[first[inverse.reshape(-1)]]
        for i, f in zip(idx, first_of):
            if i != f:
                reasons[int(i)] = f"duplicate of {row_names[f]}"
                good[i] = False
    idx = np.flatnonzero(good)
    boxes = clipped[idx]
    num_clipped = int((np.abs(boxes - xyxy[idx]) > 1e-6).any(1).sum())
    cxcywh = np.concatenate([(boxes[:, :2] + boxes[:, 2:]) / 2, boxes[:, 2:] - boxes[:, :2]], 1)
    return CheckedRows(
        classes=classes[idx].astype(np.int64),
        boxes=cxcywh.astype(np.float32).reshape(-1, 4),
        rejected=sorted(reasons.items()),
        num_clipped=num_clipped,
        kept=idx.astype(np.int64),
    )


def polygon_area(points: np.ndarray) -> float:
    """Absolute shoelace area of a closed polygon (k, 2), in the units of its coordinates squared."""
    pts = np.asarray(points, np.float64)
    x, y = pts[:, 0], pts[:, 1]
    twice = x[:-1] @ y[1:] - y[:-1] @ x[1:] + x[-1] * y[0] - y[-1] * x[0]
    return 0.5 * abs(float(twice))


def check_polygon(
    coords: Sequence[float] | np.ndarray, min_area: float | None = 0.0
) -> tuple[np.ndarray | None, str | None]:
    """Validate one polygon given as flat normalised ``x1, y1, x2, y2, ...``.

    Returns ``(points, None)`` with points (k, 2) float32 clipped to [0, 1], or ``(None, reason)``. Rejects,
    in this order: an odd number of coordinates, fewer than 3 points, non-finite values, a point outside
    [-CLIP_TOLERANCE, 1 + CLIP_TOLERANCE], zero area after clipping (all points on one line: twice the shoelace
    area at most ``min_area``; None: not checked).
    """
    values = np.asarray(coords, np.float64).reshape(-1)
    n = len(values)
    if n % 2:
        return None, f"polygon has an odd number of coordinates ({n})"
    if n < 6:
        return None, f"polygon needs at least 3 points, got {n // 2}"
    lo, hi = float(values.min()), float(values.max())  # NaN or inf shows in either
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return None, "polygon value is not a finite number (NaN or inf)"
    if lo < -CLIP_TOLERANCE or hi > 1 + CLIP_TOLERANCE:
        return None, (
            f"polygon coordinate {lo if lo < -CLIP_TOLERANCE else hi:g} outside [0, 1] "
            f"(tolerance {CLIP_TOLERANCE:g})"
        )
    if lo < 0 or hi > 1:
        values = np.clip(values, 0.0, 1.0)
    points = values.reshape(-1, 2)
    if min_area is not None and 2 * polygon_area(points) <= min_area:
        return None, "polygon has zero area (its points lie on one line)"
    return points.astype(np.float32), None


def _cross(o: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
    return float((a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0]))


def degenerate_corners(points: np.ndarray) -> str | None:
    """Why an oriented box's four corners (4, 2) enclose no box, or None: two corners are the same point, or all
    four lie on one line (every triangle of them has at most ``AREA_EPS`` twice-area)."""
    p = np.asarray(points, np.float64).reshape(4, 2)
    for i in range(4):
        for j in range(i + 1, 4):
            if np.array_equal(p[i], p[j]):
                return f"degenerate oriented box: corners {i + 1} and {j + 1} are the same point"
    if max(abs(_cross(p[0], p[i], p[j])) for i in range(1, 4) for j in range(i + 1, 4)) <= AREA_EPS:
        return "degenerate oriented box: zero area (its corners lie on one line)"
    return None


def check_outline(coords: Sequence[float] | np.ndarray) -> tuple[np.ndarray | None, str | None]:
    """``check_polygon`` for a row whose outline is its label (``DatasetConfig.outline_labels``): four corners must
    not be degenerate (``degenerate_corners``; their shoelace area is not asked: a bow tie's lobes cancel, and the
    rotated box around it is the box), another outline must have an area beyond float rounding (``AREA_EPS``)."""
    values = np.asarray(coords, np.float64).reshape(-1)
    if len(values) == 8 and np.isfinite(values).all():
        why = degenerate_corners(values)
        return (None, why) if why is not None else check_polygon(values, min_area=None)
    return check_polygon(values, min_area=AREA_EPS)


@dataclass
class DataReport:
    """What a split's loading kept, skipped and why.

    ``warnings`` holds one line per skipped image or row, ``"<file>[:<line>]: <reason>"``; the
    counts are over the split. ``num_images`` counts usable images (records), background included;
    ``num_too_large`` those of the skipped images that exceed the pixel limit (``images.io``).
    """

    split: str = ""
    warnings: list[str] = field(default_factory=list)
    num_images: int = 0
    num_skipped_images: int = 0
    num_skipped_rows: int = 0
    num_background: int = 0
    num_boxes: int = 0
    num_clipped_rows: int = 0
    num_crowd: int = 0
    num_polygons: int = 0
    num_bad_polygons: int = 0
    num_bad_outlines: int = 0
    num_too_large: int = 0
    cache_path: str | None = None
    from_cache: bool = False

    def skip_image(self, path: str, reason: str, too_large: bool = False) -> None:
        """An image left out; ``too_large``: because it exceeds the pixel limit."""
        self.num_skipped_images += 1
        self.num_too_large += too_large
        self.warnings.append(f"{path}: {reason}")

    def skip_row(self, location: str, reason: str) -> None:
        self.num_skipped_rows += 1
        self.warnings.append(f"{location}: {reason}")

    def drop_polygon(self, location: str, reason: str) -> None:
        """A polygon failed its checks but its box is usable: the box is kept without a polygon."""
        self.num_bad_polygons += 1
        self.warnings.append(f"{location}: {reason}; box kept without a polygon")

    def drop_outline(self, location: str, reason: str) -> None:
        """A row whose outline is its label (an oriented box) failed the outline's checks: the row is dropped."""
        self.num_bad_outlines += 1
        self.warnings.append(f"{location}: {reason}; row dropped")

    def note(self, message: str) -> None:
        """A warning about the split as a whole (not counted as a skipped image or row)."""
        self.warnings.append(message)

    def add_image(self, num_boxes: int, num_polygons: int = 0) -> None:
        self.num_images += 1
        self.num_boxes += num_boxes
        self.num_polygons += num_polygons
        self.num_background += num_boxes == 0

    def remove_image(self, num_boxes: int, num_polygons: int = 0) -> None:
        """Undo ``add_image`` (a cached record that the current pixel limit refuses)."""
        self.num_images -= 1
        self.num_boxes -= num_boxes
        self.num_polygons -= num_polygons
        self.num_background -= num_boxes == 0

    def merge(self, other: DataReport) -> None:
        """Add ``other``'s counts and warnings (a later run of the same split's images) to this report."""
        for f in dataclasses.fields(self):
            value = getattr(other, f.name)
            if f.name == "warnings":
                self.warnings += value
            elif f.type == "int" and value:
                setattr(self, f.name, getattr(self, f.name) + value)

    def summary(self, labels: str = "boxes", background: bool = True) -> str:
        """One line, e.g. ``train: 62 images (3 background), 180 boxes; skipped 2 images, 5 rows``; ``labels``: what
        the labels are called (a task's ``label_noun``), ``background``: whether images without one are counted
        (False for one label per image)."""
        head = f"{self.split}: " if self.split else ""
        empty = f" ({self.num_background} background)" if background else ""
        text = f"{head}{self.num_images} images{empty}, {self.num_boxes} {labels}"
        if self.num_polygons:
            text += f" ({self.num_polygons} with polygons)"
        extras = []
        if self.num_skipped_images or self.num_skipped_rows:
            extras.append(f"skipped {self.num_skipped_images} images and {self.num_skipped_rows} label rows")
        if self.num_too_large:
            extras.append(f"{self.num_too_large} of those images above the pixel limit")
        if self.num_clipped_rows:
            extras.append(f"{self.num_clipped_rows} boxes clipped to the image")
        if self.num_bad_polygons:
            extras.append(f"{self.num_bad_polygons} bad polygons dropped (boxes kept)")
        if self.num_bad_outlines:
            extras.append(f"{self.num_bad_outlines} degenerate oriented boxes dropped")
        if self.num_crowd:
            extras.append(f"{self.num_crowd} crowd annotations ignored")
        if extras:
            text += "; " + ", ".join(extras)
        if self.warnings:
            text += f" ({len(self.warnings)} warning{'' if len(self.warnings) == 1 else 's'})"
        return text + (" [from cache]" if self.from_cache else "")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> DataReport:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})
