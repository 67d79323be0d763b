"""Task-aligned assignment of ground-truth boxes to anchors (TOOD, as trained in YOLO11).

Ground truths are a flat list over the whole batch (one row per box, with its image index), not a
(B, max boxes) padded block: one image with hundreds of boxes costs its own boxes x anchors work, not
batch x hundreds x anchors. The boxes x anchors scores are built in chunks of at most ``max_pairs``
elements and reduced on the fly to (box, top-k) and (image, anchor) tensors, so memory stays bounded.
On accelerators nothing syncs with the host (see ``sparse``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from yolo11_lightning.ops.boxes import complete_iou

# An anchor centre is a candidate only when it lies inside the box by more than this (pixels).
INSIDE_EPS = 1e-9


class Assignment(NamedTuple):
    """What the assigner decided for every anchor of every image.

    fg_mask: (B, A) bool, anchors that learn a box.
    gt_index: (B, A) long, row of the assigned box in the flat ground-truth list (0 where not fg_mask).
    target_scores: (B, A, C) soft class targets: zero but for the assigned class of foreground anchors.
    target_boxes: (B, A, 4) xyxy assigned box, ground-truth units (zeros where not fg_mask); the ground truth's
        own format for a subclass (rotated: (B, A, 5) xywhr).
    """

    fg_mask: Tensor
    gt_index: Tensor
    target_scores: Tensor
    target_boxes: Tensor


class TaskAlignedAssigner(nn.Module):
    """Assigns each ground truth its ``topk`` best-aligned anchors among those inside it.

    Alignment of (box, anchor) = score^alpha · CIoU(box, predicted box).clamp(0)^beta, with score the
    predicted probability of the box's class at that anchor. An anchor picked by several boxes goes to
    the box it overlaps most (over all boxes of its image that contain it). The target score of a
    foreground anchor is alignment / (best alignment of its box + eps) · (best CIoU of its box).

    Args:
        topk: anchors per ground truth (capped at the number of anchors).
        alpha, beta: exponents of the score and the CIoU in the alignment.
        eps: keeps the normalisation finite for boxes whose alignment is zero everywhere.
        max_pairs: bound on boxes x anchors elements processed at once (memory knob only).
        sparse: evaluate CIoU only on the anchors inside each box (one host sync per chunk) instead of on
            all pairs; same results. None picks sparse on CPU, dense (sync-free) elsewhere.
    """

    def __init__(
        self,
        topk: int = 10,
        alpha: float = 0.5,
        beta: float = 6.0,
        eps: float = 1e-9,
        max_pairs: int = 1 << 21,
        sparse: bool | None = None,
    ) -> None:
        super().__init__()
        if topk < 1 or max_pairs < 1:
            raise ValueError(f"TaskAlignedAssigner: topk ({topk}) and max_pairs ({max_pairs}) must be >= 1")
        self.topk, self.alpha, self.beta, self.eps, self.max_pairs = topk, alpha, beta, eps, max_pairs
        self.sparse = sparse

    @torch.no_grad()
    def forward(
        self,
        pd_scores: Tensor,
        pd_boxes: Tensor,
        anchor_points: Tensor,
        gt_boxes: Tensor,
        gt_labels: Tensor,
        gt_image: Tensor,
        gt_valid: Tensor | None = None,
    ) -> Assignment:
        """Assign a batch.

        Args:
            pd_scores: (B, A, C) predicted class probabilities (after sigmoid).
            pd_boxes: (B, A, 4) predicted xyxy boxes, pixels.
            anchor_points: (A, 2) anchor centres (x, y), pixels.
            gt_boxes: (N, 4) xyxy ground-truth boxes of the whole batch, pixels.
            gt_labels: (N,) integer class of each box, in [0, C).
            gt_image: (N,) integer image index of each box, in [0, B); rows of one image keep their order
                (it breaks ties, as in the reference).
            gt_valid: (N,) bool or None (all valid): rows to treat as absent (picked by no anchor, no image's
                first box), as if filtered out beforehand but without a data-dependent shape (no host sync).
        """
        bs, na, nc = pd_scores.shape
        n = gt_boxes.shape[0]
        device = pd_scores.device
        if n == 0:  # shape-based exit: nothing to assign
            return Assignment(
                torch.zeros(bs, na, dtype=torch.bool, device=device),
                torch.zeros(bs, na, dtype=torch.long, device=device),
                pd_scores.new_zeros(pd_scores.shape),
                pd_boxes.new_zeros(bs, na, gt_boxes.shape[-1]),
            )
        gt_labels, gt_image = gt_labels.long(), gt_image.long()
        k = min(self.topk, na)
        top_idx, top_valid, top_ov, top_align, best_ov, best_gt = self._scan(
            pd_scores, pd_boxes, anchor_points, gt_boxes, gt_labels, gt_image, k, gt_valid
        )

        # How many boxes picked each (image, anchor) cell; flat cell = image * A + anchor.
        cells = (gt_image[:, None] * na + top_idx).flatten()
        valid = top_valid.flatten()
        rows = torch.arange(n, device=device)[:, None].expand(-1, k).flatten()
        count = torch.zeros(bs * na, dtype=torch.long, device=device).scatter_add_(0, cells, valid.long())
        fg = count > 0
        multi = count > 1

        # Unique claims are read off the (box, top-k) lists; -1 marks "no claim" and loses every amax.
        def claimed(values: Tensor, fill: float) -> Tensor:
            out = values.new_full((bs * na,), fill)
            return out.scatter_reduce_(0, cells, torch.where(valid, values.flatten(), fill), "amax")

        claimer = claimed(rows, -1)
        ov_claim = claimed(top_ov, -1.0)
        align_claim = claimed(top_align, -1.0)

        # Contested anchors go to the box of highest overlap among all boxes of the image, as in the
        # reference: possibly one that did not pick the anchor, or the image's first box if none overlaps.
        gt_index = torch.where(multi, best_gt, claimer).clamp(min=0)  # 0 for background cells
        contested_score = pd_scores.flatten(0, 1).gather(1, gt_labels[gt_index][:, None]).squeeze(1)
        align_multi = contested_score.pow(self.alpha) * best_ov.pow(self.beta)
        ov_a = torch.where(multi, best_ov, ov_claim).masked_fill(~fg, 0)
        align_a = torch.where(multi, align_multi, align_claim).masked_fill(~fg, 0)

        # Per-box maxima over its final anchors, then the normalised alignment of each anchor.
        pos_align = align_a.new_zeros(n).scatter_reduce_(0, gt_index, align_a, "amax")
        pos_ov = ov_a.new_zeros(n).scatter_reduce_(0, gt_index, ov_a, "amax")
        norm = align_a * pos_ov[gt_index] / (pos_align[gt_index] + self.eps)

        target_scores = pd_scores.new_zeros(bs * na, nc)
        target_scores.scatter_(1, gt_labels[gt_index][:, None], norm[:, None].to(pd_scores.dtype))
        target_boxes = torch.where(fg[:, None], gt_boxes[gt_index], 0).to(pd_boxes.dtype)
        return Assignment(
            fg.view(bs, na),
            gt_index.masked_fill(~fg, 0).view(bs, na),
            target_scores.view(bs, na, nc),
            target_boxes.view(bs, na, gt_boxes.shape[-1]),
        )

    def _scan(
        self,
        pd_scores: Tensor,
        pd_boxes: Tensor,
        anchor_points: Tensor,
        gt_boxes: Tensor,
        gt_labels: Tensor,
        gt_image: Tensor,
        k: int,
        gt_valid: Tensor | None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Runs the boxes x anchors pass, chunk by chunk of boxes.

        Returns the top-k anchors of each box (N, k): index, inside-the-box flag, CIoU, alignment; and per
        flat (image, anchor) cell (B·A,): the highest CIoU over the image's boxes and the first box row
        reaching it, as the reference's argmax over its padded box axis would pick it. Rows not in ``gt_valid``
        contain no anchor.
        """
        bs, na, _ = pd_scores.shape
        n = gt_boxes.shape[0]
        device = pd_scores.device
        best_ov = pd_boxes.new_full((bs * na,), -1.0)
        best_gt = torch.full((bs * na,), n, dtype=torch.long, device=device)
        tops: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []
        sparse = self.sparse if self.sparse is not None else device.type == "cpu"
        chunk = max(1, self.max_pairs // na)
        for start in range(0, n, chunk):
            img = gt_image[start : start + chunk]
            box, cls = gt_boxes[start : start + chunk], gt_labels[start : start + chunk]
            valid = gt_valid[start : start + chunk] if gt_valid is not None else None
            ov, align, inside, pairs = self._pair_metrics(
                pd_scores, pd_boxes, anchor_points, box, cls, img, sparse, valid
            )
            top_align, idx = align.topk(k, dim=-1)
            tops.append((idx, inside.gather(1, idx), ov.gather(1, idx), top_align))

            # Running first-argmax of the CIoU per cell over the pairs: the chunk's max, then its first row.
            gi, ai, pair_ov = pairs
            cell = img[gi] * na + ai
            chunk_max = best_ov.new_full((bs * na,), -1.0).scatter_reduce_(0, cell, pair_ov, "amax")
            first = torch.where(pair_ov == chunk_max[cell], gi + start, n)
            chunk_gt = torch.full_like(best_gt, n).scatter_reduce_(0, cell, first, "amin")
            best_gt = torch.where(chunk_max > best_ov, chunk_gt, best_gt)  # ties keep the earlier row
            best_ov = torch.maximum(best_ov, chunk_max)

        # Where no box overlaps a cell (pairs outside boxes count as 0), the argmax is the image's first box.
        rows = torch.arange(n, device=device)
        if gt_valid is not None:
            rows = rows.masked_fill(~gt_valid, n)
        first_row = torch.full((bs,), n, dtype=torch.long, device=device)
        first_row.scatter_reduce_(0, gt_image, rows, "amin")
        best_gt = torch.where(best_ov > 0, best_gt, first_row.repeat_interleave(na))
        top_idx, top_valid, top_ov, top_align = (torch.cat(t) for t in zip(*tops))
        return top_idx, top_valid, top_ov, top_align, best_ov.clamp(min=0), best_gt

    @staticmethod
    def inside(anchor_points: Tensor, boxes: Tensor) -> Tensor:
        """Tells which anchor centres (A, 2) lie inside each xyxy box of (c, 4), as a (c, A) bool.

        Inside means strictly, by ``INSIDE_EPS``.
        """
        ax, ay = anchor_points[:, 0], anchor_points[:, 1]
        x1, y1, x2, y2 = (v[:, None] for v in boxes.unbind(-1))
        return (
            (ax - x1 > INSIDE_EPS) & (ay - y1 > INSIDE_EPS) & (x2 - ax > INSIDE_EPS) & (y2 - ay > INSIDE_EPS)
        )

    @staticmethod
    def overlap(gt_boxes: Tensor, pd_boxes: Tensor) -> Tensor:
        """Returns the elementwise CIoU of broadcastable ground-truth and predicted xyxy boxes."""
        return complete_iou(gt_boxes, pd_boxes)

    def _pair_metrics(
        self,
        pd_scores: Tensor,
        pd_boxes: Tensor,
        anchor_points: Tensor,
        box: Tensor,
        cls: Tensor,
        img: Tensor,
        sparse: bool,
        valid: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor, tuple[Tensor, Tensor, Tensor]]:
        """Returns the CIoU, clamped at 0, and the alignment of c boxes with all A anchors.

        Both are zero unless the anchor is inside the box.

        Returns ov (c, A), align (c, A), inside (c, A) bool and the evaluated pairs (box row in the chunk,
        anchor, CIoU), each (P,). ``sparse`` evaluates only the inside pairs (found with ``nonzero``, a host
        sync that costs nothing on CPU); dense evaluates all c·A pairs and masks them (no sync: the choice
        for accelerators, where the extra arithmetic is cheap). Rows outside ``valid`` (c,) contain no anchor.
        """
        inside = self.inside(anchor_points, box)
        if valid is not None:
            inside &= valid[:, None]
        if not sparse:
            ov = self.overlap(box[:, None], pd_boxes[img]).clamp_(min=0).masked_fill_(~inside, 0)
            score = pd_scores[img, :, cls].masked_fill_(~inside, 0)
            c, na = inside.shape
            gi = torch.arange(c, device=box.device).repeat_interleave(na)
            ai = torch.arange(na, device=box.device).repeat(c)
            return ov, score.pow(self.alpha) * ov.pow(self.beta), inside, (gi, ai, ov.flatten())
        gi, ai = inside.nonzero(as_tuple=True)
        bi = img[gi]
        pair_ov = self.overlap(box[gi], pd_boxes[bi, ai]).clamp_(min=0)
        pair_align = pd_scores[bi, ai, cls[gi]].pow(self.alpha) * pair_ov.pow(self.beta)
        ov = pd_boxes.new_zeros(inside.shape).index_put_((gi, ai), pair_ov)
        align = pair_align.new_zeros(inside.shape).index_put_((gi, ai), pair_align)
        return ov, align, inside, (gi, ai, pair_ov)
