"""Segmentation's data hooks for tasks.base.data: label fields, samples, collate, split checks."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from yolo11_lightning.structures.polygons import Polygons
from yolo11_lightning.tasks.base.data import TaskData
from yolo11_lightning.tasks.segment.batch import collate_segmentation
from yolo11_lightning.tasks.segment.masks import rasterize

if TYPE_CHECKING:
    from yolo11_lightning.structures.instances import InstanceField, Instances

__all__ = ["SegmentData"]

log = logging.getLogger(__name__)


class SegmentData(TaskData):
    """Segmentation's data hooks, listed in the module docstring."""

    label_fields: ClassVar[tuple[type[InstanceField], ...]] = (Polygons,)

    def sample_targets(
        self, image_shape: tuple[int, int], instances: Instances, options: dict[str, Any]
    ) -> tuple[np.ndarray | None, dict[str, Any]]:
        """Returns the sample's masks from its outlines and the row order they imply.

        With overlap, larger instances come first.
        """
        outlines = instances.fields[Polygons.name].points  # type: ignore[attr-defined]
        masks, order = rasterize(
            outlines, image_shape[0], image_shape[1], overlap=options.get("mask_overlap", True)
        )
        return order, {"masks": torch.from_numpy(masks)}

    def missing_targets(self, options: dict[str, Any]) -> dict[str, Any]:
        return {"masks": torch.zeros(0, 0, dtype=torch.uint8)}

    def collate(self, samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        return collate_segmentation(samples)

    def check_records(self, records: Any, where: str) -> None:
        """Logs how many instances have no polygon; their masks are their boxes' rectangles."""
        instances, missing = records.num_labels(), records.num_labels() - records.num_polygons()
        if missing:
            log.warning(
                "%s: %d of %d instances have no polygon (box rows, annotations without segmentation, or "
                "polygons dropped by the checks): their masks are their boxes' rectangles",
                where, missing, instances,
            )  # fmt: skip
