"""``PackedRecords``: a split's ``ImageRecord``s as a few flat numpy arrays (no per-record objects).

What every source hands on (``split.load_split``), what the label cache stores and loads array by array
(``cache``), and what the Dataset and its DataLoader workers index. A list of Python objects in a forked
DataLoader worker gets its memory pages copied as soon as the worker touches their reference counts, so each
worker slowly duplicates the whole list (per rank, per worker: gigabytes for COCO-sized datasets); flat arrays
have no per-record objects to touch, and a record is built only when indexed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import overload

import numpy as np

from yolo11_lightning.structures.records import ImageRecord

# The arrays, by name, as the label cache stores them (``arrays``, ``from_arrays``).
FIELDS = (
    "paths", "path_ends", "sizes", "label_ends", "classes", "boxes", "segment_sizes", "segments", "keypoints",
)  # fmt: skip


def _keypoint_rows(records: Sequence[ImageRecord]) -> np.ndarray:
    """(L, K, 3) float32: every record's keypoints one after the other (K: the records' that have rows)."""
    widths = {r.keypoints.shape[1] for r in records if len(r.classes)}  # type: ignore[union-attr]
    if len(widths) > 1:
        raise ValueError(f"records with different keypoint counts {sorted(widths)}")
    k = widths.pop() if widths else 0
    return np.concatenate(
        [r.keypoints for r in records if len(r.classes)] + [np.zeros((0, k, 3), np.float32)]  # type: ignore[misc]
    )


def _ends(lengths: Iterable[int]) -> np.ndarray:
    return np.cumsum(np.fromiter(lengths, np.int64), dtype=np.int64)


class PackedRecords(Sequence[ImageRecord]):
    """``ImageRecord``s stored in flat numpy arrays, indexable like the list they came from.

    Arrays (N records, L label rows, P polygon vertices):
        ``_paths`` uint8 UTF-8 of every path one after the other, ``_path_ends`` (N,) int64 end of each;
        ``_sizes`` (N, 2) int64 height, width; ``_label_ends`` (N,) int64 end of each record's rows;
        ``_classes`` (L,) int64; ``_boxes`` (L, 4) float32 cx, cy, w, h; ``_segment_sizes`` (L,) int64 vertex
        count of each row's polygon; ``_segments`` (P, 2) float32 vertices; ``_point_ends`` (N,) int64 end of
        each record's vertices (derived); ``_keypoints`` (L, K, 3) float32 each row's keypoints (K = 0 for a
        dataset without keypoints).

    ``flip_idx``: the dataset's keypoint flip permutation (K,) or None, handed to every record; not stored in the
    label cache (``split.load_split`` sets it from the dataset yaml).

    ``polygons=False`` leaves the polygons out (records come back without any): detection never reads
    them, and COCO's outlines are about 160 MB.
    """

    def __init__(self, records: Sequence[ImageRecord] = (), polygons: bool = True) -> None:
        encoded = [r.path.encode("utf-8") for r in records]
        kept = records if polygons else []
        self._set(
            np.frombuffer(b"".join(encoded), np.uint8).copy(),
            _ends(len(e) for e in encoded),
            np.array([(r.height, r.width) for r in records], np.int64).reshape(-1, 2),
            _ends(len(r.classes) for r in records),
            np.concatenate([r.classes for r in records] + [np.zeros(0, np.int64)]),
            np.concatenate([r.boxes for r in records] + [np.zeros((0, 4), np.float32)]),
            np.concatenate([r.segment_sizes for r in kept] + [np.zeros(0, np.int64)]),
            np.concatenate([r.segments for r in kept] + [np.zeros((0, 2), np.float32)]),
            _keypoint_rows(records),
            polygons,
        )

    def _set(
        self,
        paths: np.ndarray,
        path_ends: np.ndarray,
        sizes: np.ndarray,
        label_ends: np.ndarray,
        classes: np.ndarray,
        boxes: np.ndarray,
        segment_sizes: np.ndarray,
        segments: np.ndarray,
        keypoints: np.ndarray,
        polygons: bool,
    ) -> None:
        self.flip_idx: np.ndarray | None = None
        self._keypoints = keypoints
        self._paths, self._path_ends, self._sizes = paths, path_ends, sizes
        self._label_ends, self._classes, self._boxes = label_ends, classes, boxes
        self.has_polygons = polygons
        self._segment_sizes = segment_sizes if polygons else np.zeros(0, np.int64)
        self._segments = segments if polygons else np.zeros((0, 2), np.float32)
        if polygons and len(label_ends):
            # Per record the end of its vertices: the cumulative vertex count at its last label row.
            point_at = np.concatenate([[0], np.cumsum(self._segment_sizes, dtype=np.int64)])
            self._point_ends = point_at[label_ends]
        else:
            self._point_ends = np.zeros(len(label_ends), np.int64)

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], polygons: bool = True) -> PackedRecords:
        """Records from the arrays ``arrays()`` gave (a label cache's); ValueError when they do not fit together.

        Checked without building a record: dtypes and shapes, ends that never decrease and end at their
        array's length, vertex counts that sum to the vertices.
        """
        a = {name: np.asarray(arrays[name]) for name in FIELDS}
        n = len(a["path_ends"])
        expected = {
            "paths": (np.uint8, 1), "path_ends": (np.int64, 1), "sizes": (np.int64, 2),
            "label_ends": (np.int64, 1), "classes": (np.int64, 1), "boxes": (np.float32, 2),
            "segment_sizes": (np.int64, 1), "segments": (np.float32, 2), "keypoints": (np.float32, 3),
        }  # fmt: skip
        for name, (dtype, ndim) in expected.items():
            if a[name].dtype != dtype or a[name].ndim != ndim:
                raise ValueError(f"array {name!r} is {a[name].dtype} {a[name].shape}, not {np.dtype(dtype)}")
        if a["sizes"].shape != (n, 2) or len(a["label_ends"]) != n:
            raise ValueError("per-record arrays of different lengths")
        if a["boxes"].shape[1:] != (4,) or a["segments"].shape[1:] != (2,):
            raise ValueError("boxes or vertices of the wrong width")
        for ends, total in ((a["path_ends"], len(a["paths"])), (a["label_ends"], len(a["classes"]))):
            if (n and ((np.diff(ends, prepend=0) < 0).any() or ends[-1] != total)) or (not n and total):
                raise ValueError("record ends do not match their array")
        if len(a["boxes"]) != len(a["classes"]) or len(a["keypoints"]) != len(a["classes"]):
            raise ValueError("boxes or keypoints do not match the classes")
        if a["keypoints"].shape[2] != 3:
            raise ValueError("keypoints of the wrong width")
        sizes = a["segment_sizes"]
        if polygons and (
            len(sizes) != len(a["classes"]) or (sizes < 0).any() or sizes.sum() != len(a["segments"])
        ):
            raise ValueError("polygon sizes do not match the instances or the vertices")
        packed = cls.__new__(cls)
        packed._set(*(a[name] for name in FIELDS), polygons)
        return packed

    @classmethod
    def concatenate(cls, parts: Sequence[PackedRecords]) -> PackedRecords:
        """One ``PackedRecords`` of ``parts`` one after the other (every part keeps its polygons)."""
        arrays = {name: [p.arrays()[name] for p in parts] for name in FIELDS}
        offsets = {"path_ends": "paths", "label_ends": "classes"}
        out = {}
        for name, values in arrays.items():
            if name in offsets:
                shift = np.cumsum([0] + [len(p.arrays()[offsets[name]]) for p in parts[:-1]], dtype=np.int64)
                values = [v + s for v, s in zip(values, shift)]
            empty = cls().arrays()[name]
            if name == "keypoints":  # the parts' keypoint count (a part without rows has none)
                values = [v for v in values if len(v)] or values
                empty = empty.reshape(0, values[0].shape[1] if values else 0, 3)
            out[name] = np.concatenate([empty, *values])
        packed = cls.from_arrays(out)
        packed.flip_idx = parts[0].flip_idx if parts else None
        return packed

    def arrays(self) -> dict[str, np.ndarray]:
        """The flat arrays by name (``FIELDS``); polygons empty when left out."""
        return {
            "paths": self._paths, "path_ends": self._path_ends, "sizes": self._sizes,
            "label_ends": self._label_ends, "classes": self._classes, "boxes": self._boxes,
            "segment_sizes": self._segment_sizes if self.has_polygons else np.zeros(len(self._classes), np.int64),
            "segments": self._segments, "keypoints": self._keypoints,
        }  # fmt: skip

    def with_flip_idx(self, flip_idx: Sequence[int] | None) -> PackedRecords:
        """The same records (arrays shared) whose keypoints mirror by ``flip_idx`` (None: no permutation)."""
        packed = PackedRecords.__new__(PackedRecords)
        packed.__dict__.update(self.__dict__)
        packed.flip_idx = None if flip_idx is None else np.asarray(flip_idx, np.int64)
        return packed

    def select(self, keep: np.ndarray) -> PackedRecords:
        """The records where ``keep`` (N,) bool is True, in order (built from the arrays, no records)."""
        keep = np.asarray(keep, bool)
        path_starts = self._path_ends - np.diff(self._path_ends, prepend=0)
        label_starts = self._label_ends - np.diff(self._label_ends, prepend=0)
        point_starts = self._point_ends - np.diff(self._point_ends, prepend=0)

        def spans(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
            lengths = (ends - starts)[keep]
            first = np.repeat(starts[keep] - np.cumsum(lengths) + lengths, lengths)
            return first + np.arange(int(lengths.sum()), dtype=np.int64)

        rows = spans(label_starts, self._label_ends)
        arrays = {
            "paths": self._paths[spans(path_starts, self._path_ends)],
            "path_ends": np.cumsum((self._path_ends - path_starts)[keep], dtype=np.int64),
            "sizes": self._sizes[keep],
            "label_ends": np.cumsum((self._label_ends - label_starts)[keep], dtype=np.int64),
            "classes": self._classes[rows],
            "boxes": self._boxes[rows],
            "segment_sizes": self._segment_sizes[rows] if self.has_polygons else self._segment_sizes[:0],
            "segments": self._segments[spans(point_starts, self._point_ends)] if self.has_polygons
            else self._segments,
            "keypoints": self._keypoints[rows],
        }  # fmt: skip
        return PackedRecords.from_arrays(arrays, self.has_polygons).with_flip_idx(self.flip_idx)

    def without_polygons(self) -> PackedRecords:
        """The same records without their polygons (shares every other array)."""
        if not self.has_polygons:
            return self
        packed = PackedRecords.__new__(PackedRecords)
        a = self.arrays()
        packed._set(*(a[name] for name in FIELDS), polygons=False)
        packed.flip_idx = self.flip_idx
        return packed

    def path(self, index: int) -> str:
        """The image path of record ``index`` (without building the record)."""
        p0 = self._path_ends[index - 1] if index > 0 else 0
        return self._paths[p0 : self._path_ends[index]].tobytes().decode("utf-8")

    def num_labels(self) -> int:
        """Label rows (instances) of all records."""
        return len(self._classes)

    def num_polygons(self) -> int:
        """Label rows that have a polygon (0 without polygons)."""
        return int(np.count_nonzero(self._segment_sizes))

    def __len__(self) -> int:
        return len(self._sizes)

    def all_classes(self) -> np.ndarray:
        """(N,) int64: the class of every label row of every record, in record order (a view)."""
        return self._classes

    def all_boxes(self) -> np.ndarray:
        """(N, 4) float32: every label row's box, normalised cx, cy, w, h, in record order (a view)."""
        return self._boxes

    @overload
    def __getitem__(self, index: int) -> ImageRecord: ...
    @overload
    def __getitem__(self, index: slice) -> list[ImageRecord]: ...
    def __getitem__(self, index: int | slice) -> ImageRecord | list[ImageRecord]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self)
        index = int(index)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"record {index} of {n}")
        l0 = self._label_ends[index - 1] if index > 0 else 0
        l1 = self._label_ends[index]
        h, w = self._sizes[index]
        path = self.path(index)
        keypoints = self._keypoints[l0:l1]
        if not self.has_polygons:
            return ImageRecord(
                path, int(h), int(w), self._classes[l0:l1], self._boxes[l0:l1], keypoints=keypoints,
                flip_idx=self.flip_idx,
            )  # fmt: skip
        s0 = self._point_ends[index - 1] if index > 0 else 0
        return ImageRecord(
            path,
            int(h),
            int(w),
            self._classes[l0:l1],
            self._boxes[l0:l1],
            self._segments[s0 : self._point_ends[index]],
            self._segment_sizes[l0:l1],
            keypoints,
            self.flip_idx,
        )

    def __iter__(self) -> Iterator[ImageRecord]:
        return (self[i] for i in range(len(self)))
