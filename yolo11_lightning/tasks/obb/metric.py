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

from typing import Any

import numpy as np
import torch
from torch import Tensor

from yolo11_lightning.tasks.obb.nms import pairwise_probiou
from yolo11_lightning.training.metrics.detection import DetectionMAP
from yolo11_lightning.training.metrics.reference_ap import (
    IOU_THRESHOLDS,
    class_average_precisions,
    match_by_iou,
)

__all__ = ["ObbMAP", "obb_average_precision", "targets_in_input"]

# Row layouts: detections [image, cx, cy, w, h, r, score, class], truths [image, cx, cy, w, h, r, class].
_OBB_STATE_WIDTHS = {"detections": 8, "truths": 7, "images": 1}


def targets_in_input(batch: dict[str, Any]) -> list[Tensor]:
    """Each image's ground truth as (m, 6) ``[cx, cy, w, h, r, class]`` in letterboxed-input pixels."""
    targets, images = batch["targets"], batch["images"]
    height, width = images.shape[-2:]
    scale = targets.new_tensor([width, height, width, height])
    boxes = torch.cat((targets[:, 2:6] * scale, targets[:, 6:7], targets[:, 1:2]), 1)
    return [boxes[targets[:, 0] == i] for i in range(images.shape[0])]


def obb_average_precision(detections: list[Tensor], truths: list[Tensor]) -> tuple[np.ndarray, np.ndarray]:
    """Per-image (n, 7) ``[cx, cy, w, h, r, score, class]`` detections and (m, 6) ``[cx, cy, w, h, r, class]``
    truths (same pixels) -> (classes present in the truths, their AP (k, 10) at IoU 0.50:0.05:0.95)."""
    correct, scores, classes, truth_classes = [], [], [], []
    for det, truth in zip(detections, truths):
        det, truth = det.float().cpu(), truth.float().cpu()
        truth_classes.append(truth[:, 5].numpy())
        if not len(det):
            continue
        if len(truth):
            iou = pairwise_probiou(truth[:, :5], det[:, :5]).numpy()
            correct.append(match_by_iou(iou, (truth[:, 5:6] == det[None, :, 6]).numpy()))
        else:
            correct.append(np.zeros((len(det), len(IOU_THRESHOLDS)), bool))
        scores.append(det[:, 5].numpy())
        classes.append(det[:, 6].numpy())
    return class_average_precisions(correct, scores, classes, truth_classes)


class ObbMAP(DetectionMAP):
    """``mAP50-95``, ``mAP50``, ``mAP75`` and ``AP/<class>`` of rotated boxes by the reference validator's rules
    (module docstring); ``update`` takes per image (n, 7) ``[cx, cy, w, h, score, class, r]`` detections in
    letterboxed-input pixels (``nms.rotated_nms``) and the batch's (N, 7) rotated targets. Keeps no per-class
    ``evaluation`` for the result pictures (``evaluation`` stays None)."""

    def __init__(
        self, class_names: list[str] | None = None, max_detections: int = 300, **kwargs: Any
    ) -> None:
        kwargs.pop("reference_style", None)  # its numbers are the reference's already
        super().__init__(class_names, max_detections, **kwargs)
        self._widths = dict(_OBB_STATE_WIDTHS)

    def update(self, detections: list[Tensor], batch: dict[str, Any]) -> None:  # type: ignore[override]
        ids = batch["indices"].to(self.device, torch.float64)
        for i, (det, truth) in enumerate(zip(detections, targets_in_input(batch))):
            det = torch.cat((det[:, :4], det[:, 6:7], det[:, 4:6]), 1).double().to(self.device)
            self.detections.append(torch.cat((ids[i].expand(len(det), 1), det), 1))
            self.truths.append(torch.cat((ids[i].expand(len(truth), 1), truth.double().to(self.device)), 1))
        self.images.append(ids[:, None])

    def _evaluate(self) -> dict[str, Tensor]:
        cat = self._host_states()
        image_ids = torch.unique(cat["images"].reshape(-1))  # sorted: the same order on any world size
        detections, truths = self._per_image(cat["detections"], cat["truths"], image_ids)
        present, aps = obb_average_precision(detections, truths)
        mean = aps.mean(0) if len(present) else np.zeros(len(IOU_THRESHOLDS))
        out = {
            "mAP50-95": torch.tensor(float(mean.mean()), dtype=torch.float64),
            "mAP50": torch.tensor(float(mean[0]), dtype=torch.float64),
            "mAP75": torch.tensor(float(mean[5]), dtype=torch.float64),
        }
        for c, ap in zip(present.astype(int).tolist(), aps):
            name = self.class_names[c] if self.class_names and c < len(self.class_names) else str(c)
            out[f"AP/{name}"] = torch.tensor(float(ap.mean()), dtype=torch.float64)
        return out
