"""What the data pipeline asks of a task beyond the Dataset's samples, with detection's answers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from yolo11_lightning.data.sources.packed_records import PackedRecords
from yolo11_lightning.data.task_samples import TaskSamples
from yolo11_lightning.structures.batch import collate_detection
from yolo11_lightning.structures.records import ImageRecord

__all__ = ["TaskData"]


class TaskData(TaskSamples):
    """The data pipeline beyond the Dataset's samples: the task's hooks, listed in the module docstring."""

    # one label per image: the DataModule's samples are ``image_transform``'s, not the box pipeline's
    whole_image: ClassVar[bool] = False
    # what ``check-data`` calls the labels it counts: "180 boxes", "boxes per class"
    label_noun: ClassVar[str] = "boxes"
    # the rows' outlines are the labels (oriented boxes): a row of a degenerate outline is dropped when the split is
    # read instead of kept as the box around it (``data.sources.config.DatasetConfig.outline_labels``)
    outline_labels: ClassVar[bool] = False

    def image_transform(self, augment: bool, size: int, options: dict[str, Any]) -> Any:
        """Returns a whole_image task's sample pipeline for data.image_dataset.ImageDataset.

        The pipeline is an object with ``load_shape(h, w)``, ``fit(image)`` (what the loader keeps) and
        ``__call__(image, seed)`` (the sample, (size, size, 3) uint8); ``options`` holds the data module's
        augmentation settings.
        """
        raise NotImplementedError(f"the {self.name} task augments boxes, not whole images")

    def collate(self, samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        return collate_detection(samples)

    def check_records(self, records: PackedRecords, where: str) -> None:
        """Reports what this task needs and a split's records lack; ``where`` names the split.

        ``records`` is a ``PackedRecords``: read its arrays' counts, not record by record.
        """

    def check_split(self, records: PackedRecords, names: Sequence[str], evaluated: bool) -> str | None:
        """Tells why the task cannot use a split's records, or returns None.

        The words follow ``<dataset>: split `<split>` (<its entries>): ``. ``records`` is a ``PackedRecords``,
        ``names`` the dataset's classes, ``evaluated`` validation or test (else training or prediction). Every
        rank asks with the same records, so every rank refuses alike.

        Detection's answer: an evaluated split without any label is refused (every mAP would be COCO's -1, "no
        data"). A training split without labels trains on background, as the reference's (its load says so)."""
        if evaluated and not len(records.arrays()["classes"]):
            return (
                f"no labels: none of its {len(records)} images has one, and without labels every mAP is -1 (COCO's "
                "'no data'); label the images, or point the split at labelled ones"
            )
        return None

    def label_problems(self, records: Sequence[ImageRecord]) -> list[str]:
        """Lists check-data's lines for label rows the split's parse kept but this task cannot use.

        Each line reads ``<file>:<line>: <reason>``; ``records`` are the split's ``ImageRecord``s.
        """
        return []
