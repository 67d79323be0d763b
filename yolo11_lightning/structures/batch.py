"""The batch contract in code: what a DataLoader step hands to the model, with shapes and units.

``ImageBatch`` is what every batch of letterboxed images carries (training, evaluation and prediction):

    images      uint8   (B, 3, H, W)  RGB, channels-last memory; the model converts to float/255 on the device
    orig_sizes  int64   (B, 2)        original (h, w) in pixels
    scales      float32 (B,)          letterbox scale r (NaN for augmented training images); (B, 2) (x, y) for
                                      evaluation with ``eval_box_gain="per_axis"``
    pads        float32 (B, 2)        letterbox (left, top) padding in pixels (NaN for augmented training images)
    paths       list[str]             image files

so a box in the batch image maps back to original pixels as ``(xy - pad) / scale``
(``ops.letterbox.letterbox_to_original``). ``DetectionBatch`` (``collate_detection``, training and
evaluation) adds the labels and the data-fault account:

    targets     float32 (N, 6)        rows [image_index_in_batch, class, cx, cy, w, h], box normalised to H, W
    targets_per_image list[int]       rows of ``targets`` per image (B ints), on the host: a loss sizes its
                                      per-image work from it without reading the device
    indices     int64   (B,)          dataset indices
    substitutes int64   (B,)          index of the image that stood in for a sample's own unreadable image
                                      (training; -2: none readable, a blank image), else -1
    substituted int                   samples of the batch with a substitute (``substitutes != -1``), as a
                                      plain int: read on the host without a device sync
    unreadable  list[(path, reason)]  every image of the batch that could not be read: training images
                                      replaced by a substitute (own or mosaic partner) and evaluation
                                      images left out of the batch
    missing     int                   evaluation images left out of this batch because they cannot be read

``PredictionBatch`` (``predict.sources.collate_prediction``) adds what the prediction writer needs instead. A
task extends ``DetectionBatch`` with its own keys in its own files (``tasks.segment.batch.SegmentationBatch``:
instance masks) and a collate that calls ``collate_detection`` and adds them; detection code reads only the keys
above.

``images`` is stored channels-last ((B, H, W, 3) memory seen as (B, 3, H, W), ``image_tensor`` and
``stack_images``): that is OpenCV's layout, so no sample is transposed, and it is the layout the detector
trains in by default (``YOLO11Module(channels_last=True)``), so the batch needs no reordering either.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypedDict

import numpy as np
import torch

__all__ = [
    "DetectionBatch",
    "ImageBatch",
    "PredictionBatch",
    "collate_detection",
    "empty_detection_batch",
    "image_tensor",
    "stack_images",
]


class ImageBatch(TypedDict):
    """Letterboxed images and the geometry that maps them back to original pixels (see the module)."""

    images: torch.Tensor
    orig_sizes: torch.Tensor
    scales: torch.Tensor
    pads: torch.Tensor
    paths: list[str]


class DetectionBatch(ImageBatch):
    """A training or evaluation batch: images, labels and the unreadable-image account."""

    targets: torch.Tensor
    targets_per_image: list[int]
    indices: torch.Tensor
    substitutes: torch.Tensor
    substituted: int
    unreadable: list[tuple[str, str]]
    missing: int


class PredictionBatch(ImageBatch):
    """A prediction batch: images plus frame index (-1 for an image), frame rate, originals and problems."""

    frames: list[int]
    fps: list[float]
    originals: list[np.ndarray | None]
    problems: list[tuple[str, str]]


def image_tensor(image: np.ndarray) -> torch.Tensor:
    """Wraps an (H, W, 3) uint8 array as a (3, H, W) tensor over the same memory, without a copy.

    The tensor has channels-last strides.
    """
    return torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)


def stack_images(images: Sequence[torch.Tensor]) -> torch.Tensor:
    """Stacks (3, H, W) images into a (B, 3, H, W) batch in channels-last memory.

    One copy, the stack itself; for ``image_tensor`` outputs each image is a contiguous (H, W, 3) block.
    """
    return torch.stack([image.permute(1, 2, 0) for image in images]).permute(0, 3, 1, 2)


def collate_detection(samples: Sequence[dict[str, Any]]) -> DetectionBatch:
    """Stacks BoxDataset samples into a DetectionBatch.

    Evaluation samples whose image could not be read are left out (``missing`` counts them); a batch
    of only such samples has B = 0 images.
    """
    unreadable = [item for s in samples for item in s.get("unreadable", ())]
    kept = [s for s in samples if not s.get("missing", False)]
    missing = len(samples) - len(kept)
    samples = kept
    if not samples:
        return empty_detection_batch(unreadable, missing)
    labels = [s["labels"] for s in samples]
    image_index = torch.cat([torch.full((len(lab), 1), float(i)) for i, lab in enumerate(labels)])
    return {
        "images": stack_images([s["image"] for s in samples]),
        "targets": torch.cat([image_index, torch.cat(labels)], dim=1),
        "targets_per_image": [len(lab) for lab in labels],
        "indices": torch.tensor([s["index"] for s in samples], dtype=torch.int64),
        "orig_sizes": torch.tensor([s["orig_size"] for s in samples], dtype=torch.int64).reshape(-1, 2),
        "scales": torch.tensor([s["scale"] for s in samples], dtype=torch.float32),
        "pads": torch.tensor([s["pad"] for s in samples], dtype=torch.float32).reshape(-1, 2),
        "paths": [s["path"] for s in samples],
        "substitutes": torch.tensor([s.get("substitute", -1) for s in samples], dtype=torch.int64),
        "substituted": sum(s.get("substitute", -1) != -1 for s in samples),
        "unreadable": unreadable,
        "missing": missing,
    }


def empty_detection_batch(unreadable: list[tuple[str, str]], missing: int) -> DetectionBatch:
    """Returns a batch without images, every one of them unreadable: the same keys, B = 0."""
    return {
        "images": torch.zeros(0, 3, 32, 32, dtype=torch.uint8),
        "targets": torch.zeros(0, 6),
        "targets_per_image": [],
        "indices": torch.zeros(0, dtype=torch.int64),
        "orig_sizes": torch.zeros(0, 2, dtype=torch.int64),
        "scales": torch.zeros(0),
        "pads": torch.zeros(0, 2),
        "paths": [],
        "substitutes": torch.zeros(0, dtype=torch.int64),
        "substituted": 0,
        "unreadable": unreadable,
        "missing": missing,
    }
