"""Oriented-box detection's data hooks for tasks.base.data: label fields, samples, collate, split checks."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from yolo11_lightning.data.sources.checks import check_outline
from yolo11_lightning.data.sources.yolo import label_path_for
from yolo11_lightning.tasks.base.data import TaskData
from yolo11_lightning.tasks.obb.batch import collate_obb
from yolo11_lightning.tasks.obb.labels import ObbCorners, corner_problem, rotated_boxes

if TYPE_CHECKING:
    from yolo11_lightning.structures.instances import InstanceField, Instances

__all__ = ["ObbData"]


def _dropped(coords: np.ndarray) -> bool:
    """Tells whether the split's reading drops an OBB row of these coordinates.

    ``outline_labels`` drops a polygon row whose outline fails ``checks.check_outline``.
    """
    return len(coords) >= 6 and len(coords) % 2 == 0 and check_outline(coords)[1] is not None


log = logging.getLogger(__name__)


class ObbData(TaskData):
    """Oriented-box detection's data hooks, listed in the module docstring."""

    label_fields: ClassVar[tuple[type[InstanceField], ...]] = (ObbCorners,)
    outline_labels: ClassVar[bool] = True  # rows of repeated or collinear corners: dropped, not kept as boxes

    def sample_targets(
        self, image_shape: tuple[int, int], instances: Instances, options: dict[str, Any]
    ) -> tuple[np.ndarray | None, dict[str, Any]]:
        """Returns the rotated box around each instance's moved corners, as the reference's Format does.

        ``rboxes`` (n, 5) hold the centre and size normalised to the image and the angle in radians; the
        reference's ``Format`` turns its segments into boxes the same way.
        """
        height, width = image_shape
        boxes = rotated_boxes(instances.fields[ObbCorners.name].points)  # type: ignore[attr-defined]
        boxes[:, :4] /= np.array([width, height, width, height], np.float32)
        return None, {"rboxes": torch.from_numpy(boxes)}

    def missing_targets(self, options: dict[str, Any]) -> dict[str, Any]:
        return {"rboxes": torch.zeros(0, 5)}

    def collate(self, samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        return collate_obb(samples)  # type: ignore[return-value]

    def check_records(self, records: Any, where: str) -> None:
        """Logs how many instances are not labelled by four corners; check-data --task obb names their rows.

        Box rows become axis-aligned boxes, other polygons the smallest rotated rectangle around them. Rows of
        degenerate corners are not among them: the split's reading dropped them (``outline_labels``).
        """
        sizes = records.arrays()["segment_sizes"]
        other = int(np.count_nonzero(sizes != 4))
        if other:
            log.warning(
                "%s: %d of %d instances are not oriented boxes of 4 corners (box rows or other polygons); "
                "`yolo11-lightning check-data --task obb` names them",
                where, other, len(sizes),
            )  # fmt: skip

    def label_problems(self, records: Sequence[Any]) -> list[str]:
        """Lists every row of the split's YOLO label files that is kept but is not an oriented box.

        Each names its value count or crossing sides (``labels.corner_problem``); rows of repeated or
        collinear corners were dropped and named by the split's reading. COCO json has no oriented-box field.
        """
        lines = []
        for record in records:
            label = label_path_for(record.path)
            try:
                with open(label, encoding="utf-8") as f:
                    rows = f.read().splitlines()
            except OSError:
                continue
            for number, row in enumerate(rows, 1):
                values = row.split()
                if not values:
                    continue
                try:
                    coords = np.array(values[1:], np.float64)
                except ValueError:
                    continue  # not a number: the parse reported the row already
                if _dropped(coords):
                    continue  # the split's reading dropped the row and named it
                why = corner_problem(coords)
                if why is not None:
                    lines.append(f"{label}:{number}: {why}")
        return lines
