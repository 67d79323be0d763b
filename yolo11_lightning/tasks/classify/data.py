"""Classification's data hooks for tasks.base.data: label fields, samples, collate, split checks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from yolo11_lightning.tasks.base.data import TaskData
from yolo11_lightning.tasks.classify.augment import ClassifyAugment, ClassifyTransform
from yolo11_lightning.tasks.classify.batch import collate_classification

__all__ = ["ClassifyData"]


class ClassifyData(TaskData):
    """Classification's data hooks, listed in the module docstring."""

    whole_image: ClassVar[bool] = True
    label_noun: ClassVar[str] = "class labels"

    def image_transform(self, augment: bool, size: int, options: dict[str, Any]) -> ClassifyTransform:
        """Returns the reference's classification pipeline, augment.ClassifyTransform.

        ``options`` holds ``aug`` (the data module's ``AugmentConfig``: ``scale``, flips, HSV gains),
        ``auto_augment`` and ``erasing``.
        """
        if not augment:
            return ClassifyTransform(size)
        aug = options.get("aug")
        settings = {
            "auto_augment": options.get("auto_augment", "randaugment"),
            "erasing": options.get("erasing", 0.4),
        }
        if aug is not None:
            settings.update(
                scale_jitter=aug.scale, fliplr=aug.fliplr, flipud=aug.flipud, hsv_h=aug.hsv_h, hsv_s=aug.hsv_s,
                hsv_v=aug.hsv_v,
            )  # fmt: skip
        return ClassifyTransform(size, ClassifyAugment(**settings))

    def collate(self, samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        return collate_classification(samples)

    def check_split(self, records: Any, names: Sequence[str], evaluated: bool) -> str | None:
        """Refuses a split unless every image has exactly one label and there are at least two classes.

        One label per image is what ImageFolder records have: a box dataset named for the classify task is
        refused, naming its first such image. The classes must be two at least, two with images in training: a
        classifier of one class learns nothing and scores top-1 1.0 whatever it predicts.
        """
        arrays = records.arrays()
        counts = np.diff(arrays["label_ends"], prepend=0)
        wrong = np.flatnonzero(counts != 1)
        if len(wrong):
            return (
                f"{len(wrong)} of {len(counts)} images have {counts[wrong[0]]} labels, not one class (e.g. "
                f"{records.path(int(wrong[0]))}); classification reads an ImageFolder root: "
                "<root>/train/<class>/<images>"
            )
        if len(names) < 2:
            return (
                f"one class folder ({', '.join(names) or 'none'}): a classifier needs two classes at least (with one "
                "it learns nothing and scores top-1 1.0); add a folder of images per class"
            )
        present = np.unique(arrays["classes"])
        if not evaluated and len(present) < 2:
            return (
                f"only class `{names[int(present[0])]}` of {len(names)} has images: a classifier needs images of two "
                "classes at least (with one it learns nothing and scores top-1 1.0)"
            )
        return None
