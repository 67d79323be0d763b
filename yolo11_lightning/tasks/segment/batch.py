"""The segmentation batch: ``DetectionBatch`` plus the instance masks at 1/4 of the image side
(``tasks.segment.masks``)::

    masks        uint8   (B, H/4, W/4)     overlap encoding (default): one index map per image, 0 background,
                                           k >= 1 the k-th row (1-based) of that image's rows in ``targets``;
                                           int32 when an image has more than 255 instances. The rows of an
                                           image are in decreasing mask area, smaller instances drawn over
                                           larger ones where they overlap
                 uint8   (N, H/4, W/4)     per-instance encoding: a 0/1 mask per row of ``targets``, same order
    mask_overlap bool                      which of the two ``masks`` holds

A segmentation sample carries ``masks`` as (H/4, W/4) (overlap) or (n, H/4, W/4) (per instance), its
``labels`` rows already in the order the masks refer to (``tasks.segment.masks.rasterize`` returns that order).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from yolo11_lightning.structures.batch import DetectionBatch, collate_detection

__all__ = ["SegmentationBatch", "collate_segmentation"]


class SegmentationBatch(DetectionBatch):
    """A detection batch plus instance masks at 1/4 resolution and their encoding, as the module tells."""

    masks: torch.Tensor
    mask_overlap: bool


def collate_segmentation(samples: Sequence[dict[str, Any]]) -> SegmentationBatch:
    """Stacks segmentation samples into a SegmentationBatch: collate_detection plus the masks.

    Every sample's ``masks`` is 2-D (overlap index map) or every one 3-D (one mask per label row); the
    samples left out of the detection batch (unreadable evaluation images) are left out here too. A batch
    without images has (0, 8, 8) masks (its images are (0, 3, 32, 32)).
    """
    batch = collate_detection(samples)
    kept = [torch.as_tensor(s["masks"]) for s in samples if not s.get("missing", False)]
    dims = {m.dim() for m in kept}
    if len(dims) > 1 or not dims <= {2, 3}:
        raise ValueError(
            f"sample masks must all be (h, w) or all (n, h, w), got shapes {[tuple(m.shape) for m in kept]}"
        )
    overlap = dims != {3}
    if not kept:
        masks = torch.zeros(0, 8, 8, dtype=torch.uint8)
    else:
        dtype = torch.uint8 if all(m.dtype == torch.uint8 for m in kept) else torch.int32
        kept = [m.to(dtype) for m in kept]
        masks = torch.stack(kept) if overlap else torch.cat(kept)
        if not overlap and len(masks) != len(batch["targets"]):
            raise ValueError(f"{len(masks)} instance masks for {len(batch['targets'])} label rows")
    return {**batch, "masks": masks, "mask_overlap": overlap}
