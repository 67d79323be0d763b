"""Pose mAP: ``DetectionMAP``'s box mAP plus keypoint mAP by OKS, scored as the reference's pose validator does.

Keypoint similarity of a truth (K keypoints x, y, visibility) and a detection (K predicted x, y), both in
letterboxed-input pixels, unclipped (where the reference's validator matches them; OKS does not change under the
letterbox's one gain and shift)::

    OKS = Σ_k labelled_k · exp(−d_k² / (2 · (2σ_k)² · (area + 1e-7))) / (Σ_k labelled_k + 1e-7)

with ``area`` = 0.53 × the truth box's area (input pixels), σ the COCO keypoint sigmas for (17, 3) else 1/K each
(``loss.keypoint_sigmas``), labelled = visibility != 0. Detections are matched to truths of their class at each
OKS threshold 0.50:0.05:0.95 and the AP per class interpolated as the reference validator does
(``metrics.reference_ap``: ``match_by_iou``, ``interpolated_ap``), averaged over the classes of the
ground truth: ``pose_mAP50-95``, ``pose_mAP50``. ``fitness`` is the reference's pose model-selection score,
``fitness(box) + fitness(pose)`` with ``fitness = 0.1 · mAP50 + 0.9 · mAP50-95``.

The OKS of each batch is computed and its detections matched in ``update`` (``DetectionMAP``'s scheme): only
the match flags are kept and gathered, and the value on any number of ranks equals the single-process one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor

from yolo11_lightning.metrics.detection import DetectionMAP, Kind, image_ordered
from yolo11_lightning.tasks.pose.loss import keypoint_sigmas

__all__ = ["PoseMAP", "keypoint_oks"]

AREA_FACTOR = 0.53  # the reference's keypoint area: 0.53 × the box area


def keypoint_oks(truths: Tensor, detections: Tensor, area: Tensor, sigmas: Sequence[float]) -> Tensor:
    """Returns the OKS of broadcastable truth and detected keypoints in pixels.

    Takes (..., K, 3) truth keypoints, (..., K, ≥2) detected ones and (...) truth areas; returns (...) OKS:
    pairs give one value each, ``truths[:, None]`` against ``detections[None]`` an (m, n) matrix.
    """
    d = (truths[..., 0] - detections[..., 0]).square() + (truths[..., 1] - detections[..., 1]).square()
    sigma = torch.as_tensor(sigmas, dtype=d.dtype)
    labelled = truths[..., 2] != 0
    e = d / ((2 * sigma).square() * (area[..., None] + 1e-7) * 2)
    return ((-e).exp() * labelled).sum(-1) / (labelled.sum(-1) + 1e-7)


class PoseMAP(DetectionMAP):
    """Box mAP (``DetectionMAP``, COCO, original pixels) and keypoint mAP by OKS; see the module docstring.

    ``update(detections, batch, keypoints)``: ``keypoints`` per image the (n, K, D) keypoints of its
    detections, in letterboxed-input pixels; the truths' are the batch's ``keypoints`` (N, K, 3) normalised.
    Each batch's OKS is computed in ``update``: no keypoint is kept or gathered.
    """

    KINDS: ClassVar[dict[str, Kind]] = {"box": Kind("coco", ""), "pose": Kind("reference", "pose_")}

    def update(  # type: ignore[override]
        self, detections: list[Tensor], batch: dict[str, Any], keypoints: list[Tensor]
    ) -> None:
        for i, points in enumerate(keypoints):
            if len(points) != len(detections[i]):
                raise ValueError(f"image {i}: keypoints of {len(points)} detections for {len(detections[i])}")
        scored = self._score_boxes(detections, batch)
        height, width = batch["images"].shape[-2:]
        targets = batch["targets"].detach().cpu()
        order = (
            torch.argsort(targets[:, 0], stable=True) if len(targets) else torch.zeros(0, dtype=torch.long)
        )
        truth = batch["keypoints"].detach().cpu().to(torch.float64)[order].clone()
        truth[..., 0] *= width
        truth[..., 1] *= height
        areas = (image_ordered(targets)[:, 4:6].double() * truth.new_tensor([width, height])).prod(
            1
        ) * AREA_FACTOR
        k = truth.shape[1] if truth.ndim == 3 else 0
        if keypoints and keypoints[0].ndim == 3:
            k = keypoints[0].shape[1]
        det = torch.cat(
            [p.detach().cpu()[..., :2].to(torch.float64).reshape(len(p), k, 2) for p in keypoints]
        )
        det = torch.cat((det, torch.ones_like(det[..., :1])), -1)  # x, y (the visibility is not scored)
        sigmas = keypoint_sigmas((k, 3)) if k else ()
        scored.pair_iou["pose"] = lambda d, t: keypoint_oks(
            truth[torch.from_numpy(t)], det[torch.from_numpy(d)], areas[torch.from_numpy(t)], sigmas
        ).numpy()
        self._add(batch, scored)

    def _evaluate(self) -> dict[str, Tensor]:
        """Returns DetectionMAP's keys for boxes and keypoints, and the reference's selection score fitness.

        The keys are ``pose_mAP50-95``, ``pose_AP/<class>`` and the like; ``fitness`` is ``fitness(box) +
        fitness(pose)`` with ``fitness = 0.1 · mAP50 + 0.9 · mAP50-95``.
        """
        out = super()._evaluate()
        out["fitness"] = sum(0.1 * out[f"{p}mAP50"] + 0.9 * out[f"{p}mAP50-95"] for p in ("", "pose_"))
        return out
