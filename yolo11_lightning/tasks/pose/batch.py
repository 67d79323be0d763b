"""The pose batch: ``DetectionBatch`` plus the instances' keypoints::

    keypoints  float32  (N, K, 3)  one row per row of ``targets``, same order: per keypoint x, y normalised to
                                   (W, H) of the batch image and a visibility (0: not labelled or out of the
                                   image, 1 or 2: labelled). A D = 2 dataset's visibility is 0 where a keypoint
                                   was written negative or left the image, else 1 (the reference's batch).

A pose sample carries ``keypoints`` (n, K, 3) beside its ``labels`` rows (``PoseTask.sample_targets``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from yolo11_lightning.structures.batch import DetectionBatch, collate_detection

__all__ = ["PoseBatch", "collate_pose"]


class PoseBatch(DetectionBatch):
    """A detection batch plus the keypoints of its targets; see the module docstring."""

    keypoints: torch.Tensor


def collate_pose(samples: Sequence[dict[str, Any]]) -> PoseBatch:
    """Stacks pose samples like collate_detection, adding the (N, K, 3) keypoints of the samples it keeps."""
    batch = collate_detection(samples)
    kept = [torch.as_tensor(s["keypoints"]) for s in samples if not s.get("missing", False)]
    # Samples without instances may not know K (a blank substitute's (0, 0, 3)): the widest stands for them.
    kept = [k for k in kept if len(k)] or sorted(kept, key=lambda k: -k.shape[1])[:1]
    keypoints = torch.cat(kept) if kept else torch.zeros(0, 0, 3)
    if len(keypoints) != len(batch["targets"]):
        raise ValueError(f"{len(keypoints)} keypoint rows for {len(batch['targets'])} label rows")
    return {**batch, "keypoints": keypoints.float()}
