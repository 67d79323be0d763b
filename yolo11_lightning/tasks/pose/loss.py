"""YOLO11-pose loss: the detection terms plus an OKS-shaped keypoint term and a keypoint-visibility BCE.

The contract::

    loss, items = PoseLoss(num_classes, kpt_shape)(preds, targets, keypoints)

* ``preds``: the train-mode output of ``create_model(scale, nc, task="pose", kpt_shape=(K, D))``, ``(maps, keypoints)``:
  the three detection level maps (B, 4·reg_max + nc, H/s, W/s) and the raw keypoint channels (B, K·D, A).
* ``targets``: float (N, 6) rows ``[image_index, class, cx, cy, w, h]``, box normalised to the input image.
* ``keypoints``: float (N, K, D) or (N, K, 3), one row per targets row: x, y normalised to the input image[,
  visibility]; a keypoint with visibility 0 is not labelled (it adds nothing to the keypoint term and is a
  negative of the visibility BCE). A D = 2 model has no visibility term; its keypoints are all labelled when
  given (N, K, 2), and those of visibility != 0 when given (N, K, 3) (the batch's ``keypoints``, as the
  reference's data gives them).
* ``items``: detached (5,) gained terms in the reference's order ``(box, pose, kobj, cls, dfl)``; ``loss`` their
  sum. ``items == reference_items`` and ``loss == reference_loss.sum() / batch_size`` for the reference
  ``v8PoseLoss`` (8.3.x).

The keypoint terms, per foreground anchor (one the task-aligned assigner gave a box) with the keypoints of its
box, all in grid units of the anchor's level: predicted keypoint (2·raw + cell), d = squared distance to the
labelled one, e = d / (8·σ_k²·(box area + 1e-9)), term = K / (labelled keypoints + 1e-9) · Σ_k labelled_k ·
(1 − exp(−e)); the visibility term is Σ_k BCE(raw visibility_k, labelled_k). Each is summed over the foreground
anchors and divided by K times their count (the reference's means). σ: the COCO keypoint sigmas for
``kpt_shape == (17, 3)`` (``COCO_SIGMAS``), 1/K each otherwise, as the reference. Gains: pose 12.0, kobj 1.0.

World-size invariance: as ``DetectionLoss``; the summary handed to ``sum_over_ranks`` is ``[Σ target scores,
foreground anchors, Σ box, Σ pose, Σ kobj, Σ cls, Σ dfl]``: box/cls/dfl are divided by max(global Σ, 1), the
keypoint terms by max(global count, 1). Foreground anchors are gathered into a list of a size known from shapes
(``compact_rows``), so nothing waits for the device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from yolo11_lightning.loss.assigner import TaskAlignedAssigner
from yolo11_lightning.loss.detection import DetectionLoss, Prepared, compact_rows

__all__ = ["COCO_SIGMAS", "PoseLoss", "keypoint_sigmas"]

# COCO's per-keypoint standard deviations (nose, eyes, ears, shoulders, elbows, wrists, hips, knees, ankles).
COCO_SIGMAS = (
    0.026, 0.025, 0.025, 0.035, 0.035, 0.079, 0.079, 0.072, 0.072, 0.062, 0.062, 0.107, 0.107, 0.087, 0.087,
    0.089, 0.089,
)  # fmt: skip


def keypoint_sigmas(kpt_shape: tuple[int, int]) -> tuple[float, ...]:
    """Returns per-keypoint sigmas: COCO's for (17, 3), else 1/K each, the reference's rule."""
    k, d = kpt_shape
    return COCO_SIGMAS if (k, d) == (17, 3) else (1.0 / k,) * k


class PoseLoss(DetectionLoss):
    """Loss of the YOLO11-pose train-mode output against targets and keypoints; see the module docstring.

    Args:
        num_classes, strides, reg_max, box, cls, dfl, sum_over_ranks, assigner: as ``DetectionLoss``.
        kpt_shape: (K, D), keypoints per instance and values per keypoint (2: x, y; 3: x, y, visibility).
        pose, kobj: gains of the keypoint term and of the visibility term.
    """

    def __init__(
        self,
        num_classes: int,
        kpt_shape: tuple[int, int] = (17, 3),
        strides: Sequence[int] = (8, 16, 32),
        reg_max: int = 16,
        box: float = 7.5,
        cls: float = 0.5,
        dfl: float = 1.5,
        pose: float = 12.0,
        kobj: float = 1.0,
        sum_over_ranks: Callable[[Tensor], Tensor] | None = None,
        assigner: TaskAlignedAssigner | None = None,
    ) -> None:
        super().__init__(num_classes, strides, reg_max, box, cls, dfl, sum_over_ranks, assigner)
        k, d = int(kpt_shape[0]), int(kpt_shape[1])
        if k < 1 or d not in (2, 3):
            raise ValueError(f"PoseLoss: kpt_shape must be (K >= 1, D in (2, 3)), got {tuple(kpt_shape)}")
        self.kpt_shape = (k, d)
        self.pose_gain, self.kobj_gain = float(pose), float(kobj)
        self.register_buffer("sigmas", torch.tensor(keypoint_sigmas(self.kpt_shape)), persistent=False)

    def forward(  # type: ignore[override]
        self, preds: Sequence, targets: Tensor, keypoints: Tensor
    ) -> tuple[Tensor, Tensor]:
        maps, raw = self._check_preds(preds)
        self._check(maps, targets)
        k, d = self.kpt_shape
        if targets.shape[0] == 0 and keypoints.numel() == 0:  # no instance: whatever K an empty batch says
            keypoints = keypoints.new_zeros(0, k, d)
        if (
            keypoints.ndim != 3
            or tuple(keypoints.shape[:2]) != (targets.shape[0], k)
            or (keypoints.shape[2] not in (d, 3))
        ):
            raise ValueError(
                f"PoseLoss: keypoints have shape {tuple(keypoints.shape)}, expected (N, K, D) = "
                f"({targets.shape[0]}, {k}, {d}), one row per targets row"
            )
        with torch.autocast(maps[0].device.type, enabled=False):
            prep = self._assign(maps, targets)
            dtype = prep.pred_logits.dtype
            box, cls, dfl = self._box_cls_dfl_sums(prep).unbind()
            pose, kobj = self._keypoint_sums(prep, raw.to(dtype), keypoints.to(raw.device, dtype))
            sums = torch.stack((box, pose * self.pose_gain, kobj * self.kobj_gain, cls, dfl))
            normalisers = torch.stack((prep.assign.target_scores.sum(), prep.assign.fg_mask.sum().to(dtype)))
            return self._normalise(sums, normalisers, (0, 1, 1, 0, 0))

    def _keypoint_sums(self, prep: Prepared, raw: Tensor, keypoints: Tensor) -> tuple[Tensor, Tensor]:
        """Sums the keypoint term and the visibility BCE over the foreground anchors, each divided by K.

        Not yet divided by the foreground count.
        """
        k, d = self.kpt_shape
        assign = prep.assign
        bs, na = assign.fg_mask.shape
        bound = min(prep.targets.shape[0] * self.assigner.topk, bs * na)
        rows, valid = compact_rows(assign.fg_mask.flatten(), bound)
        anchor, stride = prep.anchors[rows % na], prep.stride[rows % na]  # (R, 2) grid units, (R, 1)
        # Predicted keypoints at those anchors, in grid units: 2·raw + the anchor's cell (its centre - 0.5).
        pred = raw.transpose(1, 2).flatten(0, 1)[rows].unflatten(-1, (k, d))  # (R, K, D)
        pred_xy = pred[..., :2] * 2.0 + (anchor - 0.5)[:, None]
        # Labelled keypoints of each anchor's box: normalised -> pixels -> grid units of the anchor's level.
        height, width = prep.image_size
        gt = keypoints[assign.gt_index.flatten()[rows]]  # (R, K, D)
        gt_xy = torch.stack((gt[..., 0] * width, gt[..., 1] * height), -1) / stride[:, None]
        labelled = gt[..., 2] != 0 if gt.shape[-1] == 3 else torch.ones_like(gt[..., 0], dtype=torch.bool)
        box = (assign.target_boxes.flatten(0, 1)[rows]) / stride  # (R, 4) xyxy grid units
        # Padding rows weigh 0; their area is 1 so that no 0/0 reaches the gradient.
        area = torch.where(valid, (box[:, 2] - box[:, 0]) * (box[:, 3] - box[:, 1]), 1.0)

        dist = (pred_xy - gt_xy).square().sum(-1)  # (R, K)
        e = dist / ((2 * self.sigmas.to(dist.dtype)).square() * (area[:, None] + 1e-9) * 2)
        factor = k / (labelled.sum(1) + 1e-9)
        weight = valid.to(dist.dtype)
        pose = (factor * ((1 - torch.exp(-e)) * labelled).sum(1) * weight).sum() / k
        if d == 3:
            bce = F.binary_cross_entropy_with_logits(pred[..., 2], labelled.to(pred.dtype), reduction="none")
            kobj = (bce.sum(1) * weight).sum() / k
        else:
            kobj = raw.flatten()[:0].sum()  # no visibility channel: a zero in the graph
        # An empty batch keeps the keypoint branch in the graph (DDP), with exactly zero gradient.
        return pose + raw.flatten()[:0].sum(), kobj

    def _check_preds(self, preds: Sequence) -> tuple[Sequence[Tensor], Tensor]:
        if not isinstance(preds, (tuple, list)) or len(preds) != 2 or not isinstance(preds[1], Tensor):
            raise ValueError(
                "PoseLoss: preds must be the train-mode output (maps, keypoints) of create_model(task='pose'), got a "
                f"{type(preds).__name__}"
            )
        maps, raw = preds
        bs = maps[0].shape[0]
        anchors = sum(int(m.shape[-2] * m.shape[-1]) for m in maps)
        nk = self.kpt_shape[0] * self.kpt_shape[1]
        if tuple(raw.shape) != (bs, nk, anchors):
            raise ValueError(
                f"PoseLoss: keypoints have shape {tuple(raw.shape)}, expected (B, K·D, A) = ({bs}, {nk}, {anchors})"
            )
        return maps, raw
