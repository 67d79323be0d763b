"""YOLO11 detection loss: BCE classification, CIoU box and distribution focal (DFL) terms."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from yolo11_lightning.loss.assigner import Assignment, TaskAlignedAssigner
from yolo11_lightning.ops.anchors import box_to_dist, dist_to_box, make_anchors
from yolo11_lightning.ops.boxes import complete_iou, cxcywh_to_xyxy


class Prepared(NamedTuple):
    """Decoded predictions and the assignment of one batch (``DetectionLoss._assign``).

    pred_dist (B, A, 4·reg_max) box-distribution logits; pred_logits (B, A, nc); pred_boxes (B, A, 4) xyxy
    in grid units of each anchor's level; anchors (A, 2) grid units; stride (A, 1); targets (N, 6) in the
    loss dtype; assign the assigner's result (boxes in input pixels); image_size (H, W) input pixels.
    """

    pred_dist: Tensor
    pred_logits: Tensor
    pred_boxes: Tensor
    anchors: Tensor
    stride: Tensor
    targets: Tensor
    assign: Assignment
    image_size: tuple[int, int]


class DetectionLoss(nn.Module):
    """Loss of the YOLO11 detector's train-mode output against a batch of targets.

    ``loss, items = DetectionLoss(nc)(feats, targets)``:

    - ``feats``: the three level maps (B, 4·reg_max + nc, H/s, W/s) for ``strides``, box-distribution
      channels first, then class logits. The input image is ``feats[0].shape[-2:] * strides[0]`` pixels.
    - ``targets``: (N, 6) rows ``[image_index, class, cx, cy, w, h]``, box normalised to that image.
    - ``items``: detached (3,) tensor of the gained (box, cls, dfl) terms; ``loss``: their sum (scalar).

    Each term is summed over the batch and divided by N = max(Σ target scores, 1). Relation to the
    reference ``v8DetectionLoss`` (8.3.x), which returns ``(l * batch_size, l.detach())``:
    ``items == l`` and ``loss == l.sum() == reference_loss.sum() / batch_size`` (checked in the tests).
    Scaling for the optimiser recipe (batch size, world size, accumulation) is the caller's job: the
    reference's gradient for a global batch B is that of ``loss * B`` in a single process.

    World-size invariance: ``sum_over_ranks`` (a constructor argument or attribute, set it once the process
    group exists) maps this rank's summary, a detached 1-D tensor ``[normalisers..., gained term sums...]``
    (detection: ``[Σ target scores, Σ box, Σ cls, Σ dfl]``), to its sum over all ranks, in one call per forward
    (empty batches included, so every rank joins the collective). Each term is then divided by its normaliser
    summed over ranks: each rank's loss is its share of the global-batch loss, and the ranks' gradients
    *summed* equal the gradient of one process holding the whole batch. (DDP *averages* gradients over R
    ranks, so the caller multiplies by R to get that sum. The reference normalises per rank, which is not
    invariant.) ``items`` come from the summed term sums: they are the global batch's, the same on every rank.
    The caller may append its own values to the summary inside ``sum_over_ranks`` (``training.step_exchange``
    does: one all-reduce per training step for everything the ranks must agree on); it returns the loss part.

    Computed in float32 at least, with autocast off: the assigner's ranking needs the precision.
    """

    # The assigner made when none is given (a subclass for other box kinds: the rotated boxes' assigner).
    default_assigner: ClassVar[type[TaskAlignedAssigner]] = TaskAlignedAssigner

    def __init__(
        self,
        num_classes: int,
        strides: Sequence[int] = (8, 16, 32),
        reg_max: int = 16,
        box: float = 7.5,
        cls: float = 0.5,
        dfl: float = 1.5,
        sum_over_ranks: Callable[[Tensor], Tensor] | None = None,
        assigner: TaskAlignedAssigner | None = None,
    ) -> None:
        super().__init__()
        if num_classes < 1 or reg_max < 2:
            raise ValueError(
                f"DetectionLoss: num_classes ({num_classes}) must be >= 1, reg_max ({reg_max}) >= 2"
            )
        self.num_classes, self.reg_max = num_classes, reg_max
        self.strides = tuple(int(s) for s in strides)
        self.gains = (float(box), float(cls), float(dfl))
        self.sum_over_ranks = sum_over_ranks
        self.assigner = assigner if assigner is not None else self.default_assigner()
        self._grid: tuple[tuple, Tensor, Tensor, Tensor] | None = None

    def _anchor_grid(
        self, shapes: list[tuple[int, int]], dtype: torch.dtype, device: torch.device
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Builds the anchor grid once per input shape.

        Returns anchors (A, 2) in grid units, strides (A, 1) and the DFL bins (reg_max,).

        The training shape rarely changes: keeping them saves a dozen small allocations (kernel launches
        on an accelerator) per step. Nothing downstream writes into them.
        """
        key = (tuple(shapes), dtype, device)
        if self._grid is None or self._grid[0] != key:
            anchors, stride = make_anchors(shapes, self.strides, dtype=dtype, device=device)
            bins = torch.arange(self.reg_max, dtype=dtype, device=device)
            self._grid = (key, anchors, stride, bins)
        return self._grid[1], self._grid[2], self._grid[3]

    def forward(self, feats: Sequence[Tensor], targets: Tensor) -> tuple[Tensor, Tensor]:
        self._check(feats, targets)
        device = feats[0].device
        with torch.autocast(device.type, enabled=False):
            return self._loss(feats, targets)

    def _loss(self, feats: Sequence[Tensor], targets: Tensor) -> tuple[Tensor, Tensor]:
        prep = self._assign(feats, targets)
        sums = self._box_cls_dfl_sums(prep)
        return self._normalise(sums, prep.assign.target_scores.sum()[None], (0, 0, 0))

    def _normalise(
        self, sums: Tensor, normalisers: Tensor, divisor_of: Sequence[int]
    ) -> tuple[Tensor, Tensor]:
        """Returns (loss, items) from the gained term sums (m,) and the local normalisers (k,).

        Term j is divided by ``max(normalisers[divisor_of[j]] summed over ranks, 1)``; ``sums`` and
        ``normalisers`` are summed over ranks together, in the one call of ``sum_over_ranks``.
        """
        local = torch.cat((normalisers.to(sums.dtype), sums.detach()))
        total = self.sum_over_ranks(local) if self.sum_over_ranks is not None else local
        k = normalisers.numel()
        clamped = total[:k].clamp(min=1)
        # Picked by Python ints (views): an index tensor built from a list would be a host-to-device copy.
        divisors = torch.stack([clamped[j] for j in divisor_of])
        return (sums / divisors).sum(), total[k:] / divisors

    def _assign(self, feats: Sequence[Tensor], targets: Tensor) -> Prepared:
        """Decodes the level maps and assigns the targets to anchors; the segmentation loss shares it."""
        dtype = torch.promote_types(feats[0].dtype, torch.float32)
        device, nd = feats[0].device, 4 * self.reg_max
        shapes = [tuple(f.shape[-2:]) for f in feats]
        # (B, A, 4·reg_max + nc), anchors of all levels in a row
        preds = torch.cat([f.to(dtype).flatten(2) for f in feats], 2).transpose(1, 2).contiguous()
        pred_dist, pred_logits = preds.split((nd, self.num_classes), -1)

        # Anchor centres (A, 2) in grid units of their level, strides (A, 1); boxes decoded in grid units.
        anchors, stride, bins = self._anchor_grid(shapes, dtype, device)
        distances = pred_dist.unflatten(-1, (4, self.reg_max)).softmax(-1) @ bins  # expected bin, per side
        pred_boxes = dist_to_box(distances, anchors, xywh=False)

        height, width = shapes[0][0] * self.strides[0], shapes[0][1] * self.strides[0]
        targets = targets.to(device=device, dtype=dtype)
        assign = self.assigner(
            pred_logits.detach().sigmoid(),
            pred_boxes.detach() * stride,
            anchors * stride,
            cxcywh_to_xyxy(_scale_xywh(targets[:, 2:6], width, height)),
            targets[:, 1].long(),
            targets[:, 0].long(),
        )
        return Prepared(pred_dist, pred_logits, pred_boxes, anchors, stride, targets, assign, (height, width))

    def _box_cls_dfl_sums(self, prep: Prepared) -> Tensor:
        """Returns the gained box, cls and dfl terms (3,), each summed over the batch, not yet normalised."""
        assign, anchors = prep.assign, prep.anchors
        bs, na = assign.fg_mask.shape
        target_scores = assign.target_scores
        loss_cls = F.binary_cross_entropy_with_logits(prep.pred_logits, target_scores, reduction="sum")

        # Box and DFL terms on the foreground anchors only, gathered into a list whose length is known
        # from shapes (each box has at most topk anchors), so no host sync; padding rows weigh 0.
        bound = min(prep.targets.shape[0] * self.assigner.topk, bs * na)
        rows, row_valid = compact_rows(assign.fg_mask.flatten(), bound)
        weight = target_scores.sum(-1).flatten()[rows] * row_valid
        loss_box, dfl_box = self._box_term(prep, rows, row_valid, weight)

        target_dist = box_to_dist(anchors[rows % na], dfl_box, self.reg_max - 1 - 0.01)
        log_probs = prep.pred_dist.flatten(0, 1)[rows].unflatten(-1, (4, self.reg_max)).log_softmax(-1)
        loss_dfl = (distribution_focal_loss(log_probs, target_dist) * weight).sum()
        # Gains as Python floats: a tensor built from a list would be a host-to-device copy (a stream sync).
        return torch.stack([term * gain for term, gain in zip((loss_box, loss_cls, loss_dfl), self.gains)])

    def _box_term(
        self, prep: Prepared, rows: Tensor, row_valid: Tensor, weight: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Returns the box term summed over the foreground rows, and those rows' assigned boxes.

        The term is 1 − CIoU with the assigned box. ``rows`` is (R,); ``row_valid`` (R,) is false on padding
        rows and ``weight`` (R,) holds their target scores. The (R, 4) xyxy boxes are in grid units; the DFL
        term reads its target distances from them.
        """
        target_box = (prep.assign.target_boxes / prep.stride).flatten(0, 1)[rows]  # grid units
        ciou = complete_iou(prep.pred_boxes.flatten(0, 1)[rows], target_box)
        return ((1.0 - ciou) * weight).sum(), target_box

    def _check(self, feats: Sequence[Tensor], targets: Tensor) -> None:
        channels = 4 * self.reg_max + self.num_classes
        if len(feats) != len(self.strides):
            raise ValueError(
                f"{type(self).__name__}: got {len(feats)} feature maps for strides {self.strides}"
            )
        for i, f in enumerate(feats):
            if f.ndim != 4 or f.shape[1] != channels or f.shape[0] != feats[0].shape[0]:
                raise ValueError(
                    f"{type(self).__name__}: feats[{i}] has shape {tuple(f.shape)}, expected (B, {channels}, H, W): "
                    f"4*reg_max={4 * self.reg_max} box-distribution channels then {self.num_classes} class logits"
                )
        if targets.ndim != 2 or targets.shape[1] != 6:
            raise ValueError(
                f"{type(self).__name__}: targets has shape {tuple(targets.shape)}, expected (N, 6) rows "
                "[image_index, class, cx, cy, w, h]"
            )
        # Value checks read the data: only where that costs no device sync (out-of-range indices on an
        # accelerator end in a device-side assert instead).
        if targets.device.type == "cpu" and targets.shape[0]:
            for column, name, limit in (
                (0, "image_index", feats[0].shape[0]),
                (1, "class", self.num_classes),
            ):
                values = targets[:, column]
                bad = (values < 0) | (values >= limit) | (values != values.floor())
                if bad.any():
                    row = int(bad.nonzero()[0, 0])
                    raise ValueError(
                        f"{type(self).__name__}: targets[{row}, {column}] ({name}) is {values[row].item()}, "
                        f"expected an integer in [0, {limit})"
                    )


def _scale_xywh(xywh: Tensor, width: int, height: int) -> Tensor:
    """Scales normalised (N, 4) xywh to pixels with Python scalars, so without a host-to-device copy."""
    return torch.stack((xywh[:, 0] * width, xywh[:, 1] * height, xywh[:, 2] * width, xywh[:, 3] * height), 1)


def compact_rows(mask: Tensor, size: int) -> tuple[Tensor, Tensor]:
    """Returns the indices of the True entries of a 1-D mask, in order, in a list of fixed ``size``.

    ``size`` must be at least mask.sum().

    Returns (indices (size,) long, valid (size,) bool); padding rows point at entry 0. Sync-free,
    unlike ``nonzero``.
    """
    slot = torch.where(mask, mask.long().cumsum(0) - 1, size)  # True entries to 0, 1, ...; others to a spare
    positions = torch.arange(mask.numel(), device=mask.device)
    rows = torch.zeros(size + 1, dtype=torch.long, device=mask.device).scatter_(0, slot, positions)[:size]
    valid = torch.arange(size, device=mask.device) < mask.sum()
    return rows.masked_fill(~valid, 0), valid


def distribution_focal_loss(log_probs: Tensor, target: Tensor) -> Tensor:
    """Returns the distribution focal loss, mean over the 4 sides.

    log_probs: (R, 4, reg_max) log-softmax over the bins; target: (R, 4) distances in bins, < reg_max - 1.
    Cross entropy against the two bins around the target, weighted by proximity.
    """
    left = target.long()
    weight_left = left + 1 - target
    ce_left = -log_probs.gather(-1, left[..., None]).squeeze(-1)
    ce_right = -log_probs.gather(-1, (left + 1)[..., None]).squeeze(-1)
    return (ce_left * weight_left + ce_right * (1 - weight_left)).mean(-1)
