"""Pose mAP: ``DetectionMAP``'s box mAP plus keypoint mAP by OKS, scored as the reference's pose validator does.

Keypoint similarity of a truth (K keypoints x, y, visibility) and a detection (K predicted x, y), both in
letterboxed-input pixels, unclipped (where the reference's validator matches them; OKS does not change under the
letterbox's one gain and shift)::

    OKS = Σ_k labelled_k · exp(−d_k² / (2 · (2σ_k)² · (area + 1e-7))) / (Σ_k labelled_k + 1e-7)

with ``area`` = 0.53 × the truth box's area (input pixels), σ the COCO keypoint sigmas for (17, 3) else 1/K each
(``loss.keypoint_sigmas``), labelled = visibility != 0. Detections are matched to truths of their class at each
OKS threshold 0.50:0.05:0.95 and the AP per class interpolated as the reference validator does
(``training.metrics.reference_ap``: ``match_by_iou``, ``interpolated_ap``), averaged over the classes of the
ground truth: ``pose_mAP50-95``, ``pose_mAP50``. ``fitness`` is the reference's pose model-selection score,
``fitness(box) + fitness(pose)`` with ``fitness = 0.1 · mAP50 + 0.9 · mAP50-95``.

Keypoints are kept in flat float64 ``cat`` states beside the box rows, in the same order, and evaluated in
dataset-index order: the distributed value equals the single-process value exactly (unpadded shards).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from yolo11_lightning.tasks.pose.loss import keypoint_sigmas
from yolo11_lightning.training.metrics.detection import DetectionMAP
from yolo11_lightning.training.metrics.reference_ap import (
    IOU_THRESHOLDS,
    class_average_precisions,
    match_by_iou,
)

__all__ = ["PoseMAP", "keypoint_oks"]

AREA_FACTOR = 0.53  # the reference's keypoint area: 0.53 × the box area
# Flat float64 states: every detection's and truth's K × (x, y, visibility), every truth's keypoint area.
_KEYPOINT_STATES = ("det_keypoints", "truth_keypoints", "truth_areas")


def keypoint_oks(truths: Tensor, detections: Tensor, area: Tensor, sigmas: Sequence[float]) -> Tensor:
    """(m, K, 3) truth keypoints, (n, K, ≥2) detected ones (pixels) and (m,) areas -> (m, n) OKS."""
    d = (truths[:, None, :, 0] - detections[None, :, :, 0]).square() + (
        truths[:, None, :, 1] - detections[None, :, :, 1]
    ).square()
    sigma = torch.as_tensor(sigmas, dtype=d.dtype)
    labelled = truths[..., 2] != 0
    e = d / ((2 * sigma).square() * (area[:, None, None] + 1e-7) * 2)
    return ((-e).exp() * labelled[:, None]).sum(-1) / (labelled.sum(-1)[:, None] + 1e-7)


class PoseMAP(DetectionMAP):
    """Box mAP (``DetectionMAP``, COCO, original pixels) and keypoint mAP by OKS (module docstring).

    ``update(detections, batch, keypoints)``: ``keypoints`` per image the (n, K, D) keypoints of its
    detections, in letterboxed-input pixels; the truths' are the batch's ``keypoints`` (N, K, 3) normalised.
    """

    def __init__(
        self, class_names: list[str] | None = None, max_detections: int = 300, **kwargs: Any
    ) -> None:
        super().__init__(class_names, max_detections, **kwargs)
        for name in _KEYPOINT_STATES:
            self.add_state(name, default=[], dist_reduce_fx="cat")

    def update(  # type: ignore[override]
        self, detections: list[Tensor], batch: dict[str, Any], keypoints: list[Tensor]
    ) -> None:
        super().update(detections, batch)
        height, width = batch["images"].shape[-2:]
        truth = batch["keypoints"].to(self.device, torch.float64).clone()
        truth[..., 0] *= width
        truth[..., 1] *= height
        boxes = batch["targets"][:, 4:6].to(self.device, torch.float64) * truth.new_tensor([width, height])
        image_of = batch["targets"][:, 0].long().to(self.device)
        for i, points in enumerate(keypoints):
            if len(points) != len(detections[i]):
                raise ValueError(f"image {i}: keypoints of {len(points)} detections for {len(detections[i])}")
            det = points[..., :2].to(self.device, torch.float64)
            det = torch.cat((det, torch.ones_like(det[..., :1])), -1)  # x, y (the visibility is not scored)
            own = image_of == i
            self.det_keypoints.append(det.reshape(-1))
            self.truth_keypoints.append(truth[own].reshape(-1))
            self.truth_areas.append(boxes[own].prod(1) * AREA_FACTOR)

    def _sync_dist(self, dist_sync_fn: Any = None, process_group: Any = None) -> None:
        for name in _KEYPOINT_STATES:  # a rank that saw no batch sends an empty float64 state
            if not getattr(self, name):
                setattr(self, name, [torch.zeros(0, dtype=torch.float64, device=self.device)])
        super()._sync_dist(dist_sync_fn, process_group)

    def _evaluate(self) -> dict[str, Tensor]:
        out = super()._evaluate()
        cat = self._host_states()
        flat = {}
        for name in _KEYPOINT_STATES:  # a list of tensors before a sync, one tensor after it
            value = getattr(self, name)
            if isinstance(value, list):
                value = torch.cat(value) if value else torch.zeros(0, dtype=torch.float64)
            flat[name] = value.cpu()
        rows = len(cat["detections"]) + len(cat["truths"])
        points = len(flat["det_keypoints"]) + len(flat["truth_keypoints"])
        areas = flat["truth_areas"]
        k = points // 3 // rows if rows else 0
        image_ids = torch.unique(cat["images"].reshape(-1))
        # Each row's position among the gathered rows (same order as the keypoints) rides along the grouping.
        indexed = [
            torch.cat((cat[name], torch.arange(len(cat[name]), dtype=torch.float64)[:, None]), 1)
            for name in ("detections", "truths")
        ]
        dets, truths = self._per_image(indexed[0], indexed[1], image_ids)
        det_points = flat["det_keypoints"].reshape(-1, k, 3) if k else torch.zeros(0, 0, 3)
        truth_points = flat["truth_keypoints"].reshape(-1, k, 3) if k else torch.zeros(0, 0, 3)
        sigmas = keypoint_sigmas((k, 3)) if k else ()
        correct, scores, classes, truth_classes = [], [], [], []
        for d, t in zip(dets, truths):
            truth_classes.append(t[:, 4].numpy())
            if not len(d):
                continue
            if len(t):
                rows_t = t[:, -1].long()
                oks = keypoint_oks(truth_points[rows_t], det_points[d[:, -1].long()], areas[rows_t], sigmas)
                correct.append(match_by_iou(oks.numpy(), (t[:, 4:5] == d[None, :, 5]).numpy()))
            else:
                correct.append(np.zeros((len(d), len(IOU_THRESHOLDS)), bool))
            scores.append(d[:, 4].numpy())
            classes.append(d[:, 5].numpy())
        present, aps = class_average_precisions(correct, scores, classes, truth_classes)
        map50, map50_95 = (float(aps[:, 0].mean()), float(aps.mean())) if len(present) else (0.0, 0.0)
        out["pose_mAP50-95"] = torch.tensor(map50_95, dtype=torch.float64)
        out["pose_mAP50"] = torch.tensor(map50, dtype=torch.float64)
        out["fitness"] = sum(0.1 * out[f"{p}mAP50"] + 0.9 * out[f"{p}mAP50-95"] for p in ("", "pose_"))
        return out
