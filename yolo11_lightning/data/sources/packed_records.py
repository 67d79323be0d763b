"""``PackedRecords``: a dataset's ``ImageRecord``s as a few flat numpy arrays (no per-record objects)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from yolo11_lightning.data.sources.records import ImageRecord


class PackedRecords:
    """``ImageRecord``s stored in a few flat numpy arrays, indexable like the list they came from.

    A list of Python objects in a forked DataLoader worker gets its memory pages copied as soon as the
    worker touches their reference counts, so each worker slowly duplicates the whole list (per rank, per
    worker: gigabytes for COCO-sized datasets). Flat arrays have no per-record objects to touch.

    ``polygons=False`` leaves the polygons out (records come back without any): detection never reads
    them, and COCO's outlines are about 160 MB.
    """

    def __init__(self, records: Sequence[ImageRecord], polygons: bool = True) -> None:
        encoded = [r.path.encode("utf-8") for r in records]
        self._paths = np.frombuffer(b"".join(encoded), np.uint8) if encoded else np.zeros(0, np.uint8)
        self._path_ends = np.cumsum([len(e) for e in encoded], dtype=np.int64)
        self._sizes = np.array([(r.height, r.width) for r in records], np.int64).reshape(-1, 2)
        self._label_ends = np.cumsum([len(r.classes) for r in records], dtype=np.int64)
        self._classes = np.concatenate([r.classes for r in records] + [np.zeros(0, np.int64)])
        self._boxes = np.concatenate([r.boxes for r in records] + [np.zeros((0, 4), np.float32)])
        self.has_polygons = polygons
        kept = records if polygons else []
        # Per label row its vertex count (as the label cache stores it), per record the end of its vertices.
        self._segment_sizes = np.concatenate([r.segment_sizes for r in kept] + [np.zeros(0, np.int64)])
        self._segments = np.concatenate([r.segments for r in kept] + [np.zeros((0, 2), np.float32)])
        self._point_ends = np.cumsum([len(r.segments) for r in kept], dtype=np.int64)

    def __len__(self) -> int:
        return len(self._sizes)

    def all_classes(self) -> np.ndarray:
        """(N,) int64: the class of every label row of every record, in record order (a view)."""
        return self._classes

    def all_boxes(self) -> np.ndarray:
        """(N, 4) float32: every label row's box, normalised cx, cy, w, h, in record order (a view)."""
        return self._boxes

    def __getitem__(self, index: int) -> ImageRecord:
        p0 = self._path_ends[index - 1] if index > 0 else 0
        l0 = self._label_ends[index - 1] if index > 0 else 0
        l1 = self._label_ends[index]
        h, w = self._sizes[index]
        path = self._paths[p0 : self._path_ends[index]].tobytes().decode("utf-8")
        if not self.has_polygons:
            return ImageRecord(path, int(h), int(w), self._classes[l0:l1], self._boxes[l0:l1])
        s0 = self._point_ends[index - 1] if index > 0 else 0
        return ImageRecord(
            path,
            int(h),
            int(w),
            self._classes[l0:l1],
            self._boxes[l0:l1],
            self._segments[s0 : self._point_ends[index]],
            self._segment_sizes[l0:l1],
        )
