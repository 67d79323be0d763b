"""Oriented-box mAP: the reference OBB validator's numbers, exact across ranks.

Detections and ground truth are matched in letterboxed-input pixels by probiou (the reference's rotated IoU),
per image and IoU threshold 0.50:0.05:0.95, each pair of the same class taken by decreasing IoU
(``reference_ap.match_by_iou``); the AP per class is the reference's (101-point interpolation of the envelope,
trapezoid rule, ``reference_ap.interpolated_ap``), averaged over the classes present in the ground truth. There is
no COCO evaluation of rotated boxes to follow instead. The rows are kept in flat ``cat`` states keyed by dataset
index (``DetectionMAP``'s scheme), gathered and evaluated in index order: the value on any number of ranks
equals the single-process one.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from yolo11_lightning.metrics.detection import DetectionMAP, Kind, ScoredBatch, image_ordered
from yolo11_lightning.tasks.obb.rotated import probiou

__all__ = ["ObbMAP", "targets_in_input"]


def targets_in_input(batch: dict[str, Any]) -> Tensor:
    """Returns the batch's ground truth image by image as (m, 7) [image, cx, cy, w, h, r, class].

    The pixels are the letterboxed input's.
    """
    targets, images = image_ordered(batch["targets"]), batch["images"]
    height, width = images.shape[-2:]
    scale = targets.new_tensor([width, height, width, height])
    return torch.cat((targets[:, :1], targets[:, 2:6] * scale, targets[:, 6:7], targets[:, 1:2]), 1)


class ObbMAP(DetectionMAP):
    """``mAP50-95``, ``mAP50``, ``mAP75`` and ``AP/<class>`` of rotated boxes by the reference validator's rules
    (module docstring); ``update`` takes per image (n, 7) ``[cx, cy, w, h, score, class, r]`` detections in
    letterboxed-input pixels (``nms.rotated_nms``) and the batch's (N, 7) rotated targets. The confusion matrix
    matches by probiou too."""

    KINDS: ClassVar[dict[str, Kind]] = {"box": Kind("reference", "")}

    def __init__(
        self, class_names: list[str] | None = None, max_detections: int = 300, **kwargs: Any
    ) -> None:
        kwargs.pop("reference_style", None)  # its numbers are the reference's already
        super().__init__(class_names, max_detections, **kwargs)

    def update(self, detections: list[Tensor], batch: dict[str, Any]) -> None:  # type: ignore[override]
        counts = torch.tensor([len(d) for d in detections])
        flat = (
            torch.cat([d.detach()[:, :7] for d in detections]).cpu().float()
            if detections
            else torch.zeros(0, 7)
        )
        det_boxes = torch.cat((flat[:, :4], flat[:, 6:7]), 1)  # [cx, cy, w, h, r]
        truths = targets_in_input(batch).detach().cpu().float()
        self._add(
            batch,
            ScoredBatch(
                det_images=torch.repeat_interleave(torch.arange(len(detections)), counts).numpy(),
                scores=flat[:, 4].double().numpy(),
                classes=flat[:, 5].long().numpy(),
                truth_images=truths[:, 0].long().numpy(),
                truth_classes=truths[:, 6].long().numpy(),
                pair_iou={
                    "box": lambda d, t: (
                        probiou(truths[torch.from_numpy(t), 1:6], det_boxes[torch.from_numpy(d)])
                        .double()
                        .numpy()
                    )
                },
            ),
        )
