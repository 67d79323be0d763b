"""Instances: one image's boxes, classes and per-instance fields, and the geometry that moves them.

Every geometric step of the data pipeline (placing an image in a letterbox or a mosaic tile, clipping to the
mosaic canvas, the random warp, mixup's concatenation, the flips) is one method here, applied to the boxes and,
with the same numbers, to every instance field. A field is an ``InstanceField`` subclass: one row per instance
(``polygons.Polygons``: one outline per box; keypoints or angles next), that knows how to read itself from an
``ImageRecord`` and how each step moves it. A task names the fields its labels carry (``Task.label_fields``);
the pipeline never branches on them.

Coordinates are pixels ``x, y`` of the image the instances belong to. Every method returns new arrays and never
changes its inputs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from yolo11_lightning.structures.boxes import (
    box_candidates,
    clip_boxes,
    flip_boxes_lr,
    flip_boxes_ud,
    transform_boxes,
    xywhn_to_xyxy,
)
from yolo11_lightning.structures.records import ImageRecord

__all__ = ["InstanceField", "Instances"]


class InstanceField:
    """The base class of a field with one row per instance, moved with its box by every geometric step.

    ``derives_boxes``: after a warp the boxes are the extent of this field (an outline's box is tighter than a
    warped box's corners), filtered by ``min_area_ratio`` of their zoomed area before the warp; otherwise the
    boxes are warped themselves and the field follows them.
    """

    name: ClassVar[str]  # the key of the field in ``Instances.fields``
    reads_polygons: ClassVar[bool] = False  # needs the records' polygons (``PackedRecords(polygons=...)``)
    derives_boxes: ClassVar[bool] = False
    min_area_ratio: ClassVar[float]  # with ``derives_boxes``: the box filter after a warp

    def __len__(self) -> int:
        raise NotImplementedError

    @classmethod
    def from_record(cls, record: ImageRecord, width: float, height: float) -> InstanceField:
        """Builds the record's field in pixels of a width x height image, the original resized."""
        raise NotImplementedError

    @classmethod
    def empty(cls) -> InstanceField:
        """Returns the field of an image without instances."""
        raise NotImplementedError

    @classmethod
    def concat(cls, parts: Sequence[InstanceField]) -> InstanceField:
        """Joins the fields of several images' instances, one after the other, as mosaic and mixup do."""
        raise NotImplementedError

    def select(self, keep: np.ndarray) -> InstanceField:
        """Returns the rows where the (n,) bool ``keep`` is True."""
        raise NotImplementedError

    def placed(self, scale: float, offset: tuple[float, float]) -> InstanceField:
        """Moves the field as its image is scaled and put at the (x, y) pixel offset: xy * scale + offset."""
        raise NotImplementedError

    def clipped(self, width: float, height: float) -> InstanceField:
        """Clips the field to a width x height canvas."""
        raise NotImplementedError

    def warped(self, matrix: np.ndarray, out_wh: tuple[int, int]) -> tuple[InstanceField, np.ndarray | None]:
        """Warps the field through a (3, 3) pixel matrix into an ``out_wh`` image.

        Returns the field, and its (n, 4) xyxy boxes when it ``derives_boxes`` (else None).
        """
        raise NotImplementedError

    def flipped_lr(self, width: float) -> InstanceField:
        """Mirrors the field left-right in an image ``width`` pixels wide."""
        raise NotImplementedError

    def flipped_ud(self, height: float) -> InstanceField:
        """Mirrors the field top-bottom in an image ``height`` pixels high."""
        raise NotImplementedError


def _offset_boxes(boxes: np.ndarray, scale: float, offset: tuple[float, float]) -> np.ndarray:
    ox, oy = offset
    scaled = boxes if scale == 1 else boxes * np.float32(scale)
    return scaled + np.array([ox, oy, ox, oy], dtype=np.float32)


@dataclass(frozen=True)
class Instances:
    """The labelled instances of one image.

    Attributes:
        boxes: (n, 4) float32 ``x1, y1, x2, y2`` in pixels of the image.
        classes: (n,) int64.
        fields: per-instance fields by name (``InstanceField.name``), n rows each, aligned with the boxes.
    """

    boxes: np.ndarray
    classes: np.ndarray
    fields: Mapping[str, InstanceField] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.boxes)

    @classmethod
    def from_record(
        cls, record: ImageRecord, width: float, height: float, field_types: Sequence[type[InstanceField]] = ()
    ) -> Instances:
        """Builds the record's instances in pixels of a width x height image, with the given field types."""
        fields = {f.name: f.from_record(record, width, height) for f in field_types}
        return cls(xywhn_to_xyxy(record.boxes, width, height), record.classes, fields)

    @classmethod
    def empty(cls, field_types: Sequence[type[InstanceField]] = ()) -> Instances:
        """Returns no instances, with an empty field of each of ``field_types``."""
        fields = {f.name: f.empty() for f in field_types}
        return cls(np.zeros((0, 4), np.float32), np.zeros(0, np.int64), fields)

    @classmethod
    def concat(cls, parts: Sequence[Instances]) -> Instances:
        """Joins the instances of ``parts`` one after the other; the parts carry the same fields."""
        names = parts[0].fields
        return cls(
            np.concatenate([p.boxes for p in parts]),
            np.concatenate([p.classes for p in parts]),
            {name: type(f).concat([p.fields[name] for p in parts]) for name, f in names.items()},
        )

    def select(self, keep: np.ndarray) -> Instances:
        """Returns the instances where the (n,) bool ``keep`` is True."""
        return Instances(
            self.boxes[keep], self.classes[keep], {k: f.select(keep) for k, f in self.fields.items()}
        )

    def placed(self, scale: float, offset: tuple[float, float]) -> Instances:
        """Moves the instances as their image is scaled and put at the (x, y) pixel offset of a larger one."""
        return Instances(
            _offset_boxes(self.boxes, scale, offset),
            self.classes,
            {k: f.placed(scale, offset) for k, f in self.fields.items()},
        )

    @classmethod
    def tiled(
        cls, parts: Sequence[Instances], offsets: Sequence[tuple[int, int]], canvas_wh: tuple[int, int]
    ) -> Instances:
        """Moves mosaic tiles' instances to the canvas ``offsets`` and clips them to the canvas.

        Zero-area boxes are dropped.
        """
        moved = cls.concat([p.placed(1, o) for p, o in zip(parts, offsets)])
        boxes = clip_boxes(moved.boxes, *canvas_wh)
        keep = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
        fields = {k: f.clipped(*canvas_wh).select(keep) for k, f in moved.fields.items()}
        return cls(boxes[keep], moved.classes[keep], fields)

    def warped(self, matrix: np.ndarray, zoom: float, out_wh: tuple[int, int]) -> Instances:
        """Warps the instances through the random warp ``matrix`` at zoom ``zoom`` into an ``out_wh`` image.

        Boxes are clipped to the image and kept when they stay large and keep enough of their zoomed area
        (``structures.boxes.box_candidates``); a field that ``derives_boxes`` gives the boxes instead.
        """
        fields, derived = {}, []
        for name, f in self.fields.items():
            fields[name], boxes = f.warped(matrix, out_wh)
            if boxes is not None:
                derived.append((boxes, f.min_area_ratio))
        if len(derived) > 1:
            raise ValueError(f"more than one field derives the boxes: {sorted(self.fields)}")
        if derived:
            boxes, min_area_ratio = derived[0]
            keep = box_candidates(self.boxes * zoom, boxes, min_area_ratio=min_area_ratio)
        else:
            boxes = clip_boxes(transform_boxes(self.boxes, matrix), *out_wh)
            keep = box_candidates(self.boxes * zoom, boxes)
        return Instances(boxes[keep], self.classes[keep], {k: f.select(keep) for k, f in fields.items()})

    def flipped_lr(self, width: float) -> Instances:
        """Mirrors the instances left-right in an image ``width`` pixels wide."""
        fields = {k: f.flipped_lr(width) for k, f in self.fields.items()}
        return Instances(flip_boxes_lr(self.boxes, width), self.classes, fields)

    def flipped_ud(self, height: float) -> Instances:
        """Mirrors the instances top-bottom in an image ``height`` pixels high."""
        fields = {k: f.flipped_ud(height) for k, f in self.fields.items()}
        return Instances(flip_boxes_ud(self.boxes, height), self.classes, fields)
