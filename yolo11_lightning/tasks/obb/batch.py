"""The oriented-box batch: ``DetectionBatch`` whose ``targets`` rows are rotated boxes::

    targets   float32 (N, 7)   rows ``[image index in batch, class, cx, cy, w, h, r]``: the box's centre and size
                               normalised to (W, H) of the batch image (x and w by W, y and h by H), r in radians
                               (``labels.rotated_boxes``: OpenCV's ``minAreaRect`` range)

A sample carries its rotated boxes as ``rboxes`` (n, 5), one per ``labels`` row, in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from yolo11_lightning.structures.batch import DetectionBatch, collate_detection

__all__ = ["ObbBatch", "collate_obb"]


class ObbBatch(DetectionBatch):
    """A detection batch whose ``targets`` are (N, 7) rotated-box rows; see the module docstring."""


def collate_obb(samples: Sequence[dict[str, Any]]) -> ObbBatch:
    """Collates like collate_detection, then replaces each row's box by the sample's rotated box, rboxes.

    Samples left out of the detection batch (unreadable evaluation images) are left out here too.
    """
    batch = collate_detection(samples)
    kept = [
        torch.as_tensor(s["rboxes"], dtype=torch.float32).reshape(-1, 5)
        for s in samples
        if not s.get("missing")
    ]
    rboxes = torch.cat(kept) if kept else torch.zeros(0, 5)
    if len(rboxes) != len(batch["targets"]):
        raise ValueError(f"{len(rboxes)} rotated boxes for {len(batch['targets'])} label rows")
    return {**batch, "targets": torch.cat((batch["targets"][:, :2], rboxes), 1)}  # type: ignore[typeddict-item]
