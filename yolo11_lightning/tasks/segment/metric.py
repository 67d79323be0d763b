"""Instance-segmentation mAP: ``DetectionMAP``'s box mAP plus COCO mask mAP, exact across ranks."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from yolo11_lightning.metrics.detection import DetectionMAP, Kind, pair_iou_from_matrices

__all__ = ["SegmentationMAP", "mask_iou"]


def mask_iou(truths: Tensor, detections: Tensor) -> np.ndarray:
    """Returns the (m, n) float64 IoU of (m, h, w) and (n, h, w) bool masks, COCO's rleIou.

    As ``maskApi.c``: intersection over union of the pixel counts, 0 where the union is empty. The counts are
    exact (float32 sums of 0 and 1 up to 2**24 pixels, autocast off), the division float64.
    """
    if not len(truths) or not len(detections):  # an image without truths or detections: no (h, w) to rely on
        return np.zeros((len(truths), len(detections)))
    with torch.autocast(truths.device.type, enabled=False):
        a = truths.reshape(len(truths), -1).float()
        b = detections.reshape(len(detections), -1).float()
        inter = (a @ b.T).double()
        union = a.sum(1).double()[:, None] + b.sum(1).double()[None, :] - inter
    iou = torch.where(union > 0, inter / union.clamp(min=1), torch.zeros_like(inter))
    return iou.cpu().numpy()


def _same_class_mask_iou(
    detections: Tensor, masks: Tensor, truth_masks: Tensor, batch: dict[str, Any], image: int
) -> np.ndarray:
    """Returns image ``image``'s (m, n) mask IoU, computed only between detections and truths of one class.

    The others are never paired: 0.
    """
    targets = batch["targets"]
    truth_classes = targets[targets[:, 0] == image, 1].to(detections.device)
    wanted = torch.isin(detections[:, 5], truth_classes)
    iou = np.zeros((len(truth_masks), len(masks)))
    if bool(wanted.any()):
        iou[:, wanted.cpu().numpy()] = mask_iou(truth_masks, masks[wanted.to(masks.device)])
    return iou


class SegmentationMAP(DetectionMAP):
    """Box mAP (``DetectionMAP``, original pixels) and mask mAP (``mask_mAP50-95``, ``mask_mAP50``, ...).

    Masks are scored as the reference validator scores them: the predicted masks at proto resolution
    (``tasks.segment.mask_ops.masks_at_protos``, 1/4 of the letterboxed input) against the batch's ground-truth
    masks at the same resolution (``tasks.segment.mask_ops.image_target_masks``), by COCO's rules
    (``metrics.coco``). Each batch's mask IoUs are computed where its masks are (``update``, on the device), so
    no mask is kept or gathered.
    """

    KINDS: ClassVar[dict[str, Kind]] = {"box": Kind("coco", ""), "mask": Kind("coco", "mask_")}

    def update(  # type: ignore[override]
        self, detections: list[Tensor], batch: dict[str, Any], masks: list[Tensor], truth_masks: list[Tensor]
    ) -> None:
        """Matches one batch: per image (n, 6) detections in letterboxed-input pixels and their masks.

        The detections' masks are (n, h, w) bool, the ground-truth masks (m, h, w) bool, one per target row of
        the image, in order.
        """
        truth_counts = torch.bincount(batch["targets"][:, 0].long(), minlength=len(detections)).tolist()
        for i, (det, mask, truth) in enumerate(zip(detections, masks, truth_masks)):
            if len(mask) != len(det) or len(truth) != truth_counts[i]:
                raise ValueError(
                    f"image {i}: {len(mask)} masks for {len(det)} detections, {len(truth)} ground-truth masks "
                    f"for {truth_counts[i]} targets"
                )
        scored = self._score_boxes(detections, batch)
        matrices = [_same_class_mask_iou(det, mask, truth, batch, i) for i, (det, mask, truth) in
                    enumerate(zip(detections, masks, truth_masks))]  # fmt: skip
        det_counts = np.array([len(d) for d in detections], np.int64)
        scored.pair_iou["mask"] = pair_iou_from_matrices(
            matrices, det_counts, np.array(truth_counts, np.int64)
        )
        self._add(batch, scored)

    def _evaluate(self) -> dict[str, Tensor]:
        """Returns DetectionMAP's keys for boxes and masks, and the reference's selection score fitness.

        The keys are ``mask_mAP50-95``, ``mask_AP/<class>`` and the like; ``fitness`` is ``fitness(box) +
        fitness(mask)`` with ``fitness = 0.1 * mAP50 + 0.9 * mAP50-95``, what ``best.ckpt`` follows for this
        task.
        """
        out = super()._evaluate()
        out["fitness"] = sum(0.1 * out[f"{p}mAP50"] + 0.9 * out[f"{p}mAP50-95"] for p in ("", "mask_"))
        return out
