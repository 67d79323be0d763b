"""YOLO11-obb loss: BCE classes, a probiou box term and DFL on the distances, with rotated assignment.

The contract::

    loss, items = ObbLoss(num_classes)(preds, targets)

* ``preds``: the train-mode output of ``create_model(scale, nc, task="obb")``, ``(maps, angles)``: the three level maps
  (B, 4·reg_max + nc, H/s, W/s) and the angles (B, 1, A) in radians.
* ``targets``: float (N, 7) rows ``[image_index, class, cx, cy, w, h, r]``: the rotated box's centre and size
  normalised to the input image (x and w by its width, y and h by its height), r in radians. Boxes under 2 pixels
  wide or high are left out, as the reference does: they stay in the rows but the assigner treats them as absent
  (no data-dependent shape, so no host sync on an accelerator).
* ``items``: detached (3,) gained terms ``(box, cls, dfl)``; ``loss`` their sum. ``items == reference_items`` and
  ``loss == reference_loss.sum() / batch_size`` for the reference ``v8OBBLoss`` (8.3.x).

Per foreground anchor, in grid units of its level: the box term is 1 − probiou(predicted, assigned rotated box),
the predicted box being the anchor's distances read in the rotated frame of its predicted angle; the DFL term
compares the predicted distances with those from the anchor to the sides of the assigned box's *axis-aligned*
rectangle of the same centre and size (the reference's target: the angle is left out of it). Both are weighted by
the anchor's target score; every term is divided by max(Σ target scores, 1).

World-size invariance: as ``DetectionLoss`` (summary ``[Σ target scores, Σ box, Σ cls, Σ dfl]``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from yolo11_lightning.loss.detection import DetectionLoss, Prepared
from yolo11_lightning.ops.boxes import cxcywh_to_xyxy
from yolo11_lightning.tasks.obb.assigner import RotatedTaskAlignedAssigner
from yolo11_lightning.tasks.obb.rotated import dist_to_rotated_box, probiou

__all__ = ["MIN_SIZE", "ObbLoss"]

MIN_SIZE = 2.0  # pixels: rotated boxes narrower or lower than this are left out of the loss


class ObbLoss(DetectionLoss):
    """Loss of the YOLO11-obb train-mode output against rotated-box targets; see the module docstring.

    Args: as ``DetectionLoss``; the default assigner is ``RotatedTaskAlignedAssigner`` (top 10, alpha 0.5, beta 6).
    """

    default_assigner = RotatedTaskAlignedAssigner

    def forward(self, preds: Sequence, targets: Tensor) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        maps, angles = self._check_preds(preds)
        if targets.ndim != 2 or targets.shape[1] != 7:
            raise ValueError(
                f"ObbLoss: targets has shape {tuple(targets.shape)}, expected (N, 7) rows "
                "[image_index, class, cx, cy, w, h, r] (an oriented-box batch)"
            )
        self._check(maps, targets[:, :6])
        with torch.autocast(maps[0].device.type, enabled=False):
            prep = self._assign_rotated(maps, angles, targets)
            sums = self._box_cls_dfl_sums(prep)
            return self._normalise(sums, prep.assign.target_scores.sum()[None], (0, 0, 0))

    def _assign_rotated(self, feats: Sequence[Tensor], angles: Tensor, targets: Tensor) -> Prepared:
        """Decodes the maps to (B, A, 5) xywhr boxes in grid units and assigns the targets to anchors."""
        dtype = torch.promote_types(feats[0].dtype, torch.float32)
        device, nd = feats[0].device, 4 * self.reg_max
        shapes = [tuple(f.shape[-2:]) for f in feats]
        preds = torch.cat([f.to(dtype).flatten(2) for f in feats], 2).transpose(1, 2).contiguous()
        pred_dist, pred_logits = preds.split((nd, self.num_classes), -1)
        anchors, stride, bins = self._anchor_grid(shapes, dtype, device)
        distances = pred_dist.unflatten(-1, (4, self.reg_max)).softmax(-1) @ bins
        angle = angles.to(dtype).transpose(1, 2)  # (B, A, 1)
        pred_boxes = torch.cat((dist_to_rotated_box(distances, angle, anchors), angle), -1)

        height, width = shapes[0][0] * self.strides[0], shapes[0][1] * self.strides[0]
        targets = targets.to(device=device, dtype=dtype)
        # Scaled by Python numbers: a tensor made from a list would be a host-to-device copy.
        pixels = torch.stack(
            (targets[:, 2] * width, targets[:, 3] * height, targets[:, 4] * width, targets[:, 5] * height), 1
        )
        keep = (pixels[:, 2] >= MIN_SIZE) & (pixels[:, 3] >= MIN_SIZE)
        scaled = pred_boxes.detach().clone()
        scaled[..., :4] *= stride
        assign = self.assigner(
            pred_logits.detach().sigmoid(),
            scaled,
            anchors * stride,
            torch.cat((pixels, targets[:, 6:7]), 1),
            targets[:, 1].long(),
            targets[:, 0].long(),
            keep,
        )
        return Prepared(pred_dist, pred_logits, pred_boxes, anchors, stride, targets, assign, (height, width))

    def _box_term(
        self, prep: Prepared, rows: Tensor, row_valid: Tensor, weight: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Returns 1 − probiou with the assigned box summed over the foreground rows, and the DFL's boxes.

        The DFL's boxes are the assigned boxes' axis-aligned rectangles of the same centre and size, (R, 4)
        xyxy in grid units.
        """
        target = prep.assign.target_boxes.flatten(0, 1)[rows]  # (R, 5) xywhr pixels
        scale = prep.stride[rows % prep.assign.fg_mask.shape[1]]
        target = torch.cat((target[:, :4] / scale, target[:, 4:]), 1)  # grid units, radians
        predicted = prep.pred_boxes.flatten(0, 1)[rows]
        # Padding rows weigh 0; a zero-size target would make probiou's square root send 0 · inf = NaN back, so
        # they are scored against their own prediction (a clamped, zero-gradient distance).
        iou = probiou(predicted, torch.where(row_valid[:, None], target, predicted.detach()))
        # The angles (in pred_boxes) stay in the graph when no anchor is foreground (DDP), with zero gradient.
        loss_box = ((1.0 - iou) * weight).sum() + prep.pred_boxes.flatten()[:0].sum()
        return loss_box, cxcywh_to_xyxy(target[:, :4])

    def _check_preds(self, preds: Sequence) -> tuple[Sequence[Tensor], Tensor]:
        if not isinstance(preds, (tuple, list)) or len(preds) != 2 or not isinstance(preds[1], Tensor):
            raise ValueError(
                "ObbLoss: preds must be the train-mode output (maps, angles) of create_model(task='obb'), got a "
                f"{type(preds).__name__}"
            )
        maps, angles = preds
        bs = maps[0].shape[0]
        anchors = sum(int(m.shape[-2] * m.shape[-1]) for m in maps)
        if tuple(angles.shape) != (bs, 1, anchors):
            raise ValueError(
                f"ObbLoss: angles have shape {tuple(angles.shape)}, expected (B, 1, A) = ({bs}, 1, {anchors})"
            )
        return maps, angles
