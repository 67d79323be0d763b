"""The classification batch: the detection batch's keys plus ``labels`` (B,) int64, one class per image.

``collate_classification`` stacks ``data.image_dataset.ImageDataset`` samples (each with one ``[class, 0.5, 0.5, 1,
1]`` row: the whole image is its box, so ``targets`` is (B, 6)) with ``collate_detection`` and adds the classes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from yolo11_lightning.structures.batch import DetectionBatch, collate_detection

__all__ = ["ClassificationBatch", "collate_classification"]


class ClassificationBatch(DetectionBatch):
    """DetectionBatch plus labels, the int64 (B,) class of each image that ClassificationLoss reads."""

    labels: torch.Tensor


def collate_classification(samples: Sequence[dict[str, Any]]) -> ClassificationBatch:
    batch: dict[str, Any] = dict(collate_detection(samples))
    batch["labels"] = batch["targets"][:, 1].long()  # one row per kept image, in image order
    return batch  # type: ignore[return-value]
