"""``ImageDataset``: one label per image (classification); samples from the task's whole-image transform.

For a task with ``Task.whole_image`` (classification) the DataModule builds this instead of ``BoxDataset``:
the same records (each with one whole-image box, ``data.sources.imagefolder``), loading, unreadable-image
substitutes, image cache and samplers, but each sample is the task's image transform of the image
(``Task.image_transform``: ``fit`` is what the loader and the image cache keep, the call makes the sample with a
per-sample seed drawn from ``sample_rng(seed, epoch, index)``). A sample has the detection sample's keys, its
``labels`` the one row ``[class, 0.5, 0.5, 1, 1]`` (the task's collate adds the batch's ``labels`` (B,) from
them); ``scale`` and ``pad`` are NaN (no box maps back through a crop).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from yolo11_lightning.data.dataset import BoxDataset
from yolo11_lightning.data.images.limits import ImageReadError
from yolo11_lightning.data.sampling.seeds import sample_rng
from yolo11_lightning.structures.batch import image_tensor

__all__ = ["ImageDataset"]


class ImageDataset(BoxDataset):
    """Whole-image samples (module docstring). ``task_options``: the task's augmentation settings
    (``Task.image_transform``); the other arguments are ``BoxDataset``'s (mosaic and partners unused)."""

    def __init__(self, *args: Any, task_options: dict[str, Any] | None = None, **kwargs: Any) -> None:
        kwargs["reduced_decode"] = False  # the transform resizes the shortest side: decode fully
        super().__init__(*args, **kwargs)
        self.decode_cache_size = 0  # no mosaic partners to keep decoded
        self.transform = self.task.image_transform(self.augment, self.image_size, task_options or {})

    def set_rect_batches(self, batch_size: int) -> None:
        """Every sample is an ``image_size`` square: no aspect-ratio groups (evaluation in dataset order)."""
        return None

    def resized_shapes(self) -> np.ndarray:
        sizes = self.records._sizes
        return np.array([self.transform.load_shape(int(h), int(w)) for h, w in sizes], np.int64).reshape(
            -1, 2
        )

    def fit_decoded(self, image: np.ndarray, height: int, width: int, f: int) -> tuple[np.ndarray, float]:
        fitted = self.transform.fit(image)
        return fitted, fitted.shape[0] / height

    def __getitem__(self, item: int | tuple[int, int]) -> dict[str, Any]:
        epoch, index = item if isinstance(item, tuple) else (0, item)
        index = int(index)
        if epoch != self._unreadable_epoch:  # what this process remembers is valid for one epoch
            self._unreadable, self._unreadable_epoch = {}, epoch
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for a dataset of {len(self)} images")
        rec = self.records[index]
        substitutes: dict[int, int] = {}
        unreadable: list[tuple[str, str]] = []
        cls = int(rec.classes[0])
        if self.augment:
            seed = int(sample_rng(self.seed, epoch, index).integers(2**63))
            image, instances = self._substituting_loader(epoch, substitutes, unreadable)(index)
            if len(instances.classes):  # a substitute's class; a blank stand-in keeps the sample's own
                cls = int(instances.classes[0])
            image = self.transform(image, seed)
        else:
            try:
                resized, _ = self.load_resized(index)
            except ImageReadError as e:
                return self._missing(index, e)
            image = self.transform(resized)
        return {
            "image": image_tensor(image),
            "labels": torch.tensor([[cls, 0.5, 0.5, 1.0, 1.0]], dtype=torch.float32),
            "index": index,
            "path": rec.path,
            "orig_size": (rec.height, rec.width),
            "scale": math.nan,
            "pad": (math.nan, math.nan),
            "substitute": substitutes.get(index, -1),
            "unreadable": unreadable,
            "missing": False,
        }
