"""What the Dataset asks of a task, with detection's answers: the instance fields its labels carry, and what a
sample adds to its labels. ``tasks.base.Task`` is one; the Dataset receives the run's task and reads only these."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

if TYPE_CHECKING:
    from yolo11_lightning.structures.instances import InstanceField, Instances

__all__ = ["TaskSamples"]


class TaskSamples:
    """A task's side of a sample (detection's: boxes and classes only, nothing added)."""

    # instance fields of the labels (``structures``): what the records carry and augmentation moves
    label_fields: ClassVar[tuple[type[InstanceField], ...]] = ()

    def sample_targets(
        self, image_shape: tuple[int, int], instances: Instances, options: dict[str, Any]
    ) -> tuple[np.ndarray | None, dict[str, Any]]:
        """What a sample of ``image_shape`` (h, w) adds to its labels: (row order or None, extra sample keys).

        ``options``: the data module's task options (``mask_overlap``)."""
        return None, {}

    def missing_targets(self, options: dict[str, Any]) -> dict[str, Any]:
        """The extra keys of an evaluation sample whose image could not be read."""
        return {}
