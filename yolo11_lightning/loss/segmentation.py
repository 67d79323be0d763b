"""YOLO11 instance-segmentation loss: the detection terms plus a per-instance mask BCE.

The contract (what the data side and the model hand to the loss)::

    loss, items = SegmentationLoss(num_classes, overlap=True)(preds, targets, masks)

* ``preds``: the train-mode output of ``YOLO11(scale, nc, task="segment")``, a tuple
  ``(maps, coefficients, protos)``:

  - ``maps``: the three detection level maps (B, 4·reg_max + nc, H/s, W/s), s = 8, 16, 32 (as detection);
  - ``coefficients``: (B, 32, A) mask coefficients, anchors in the maps' order (P3, P4, P5, each row-major);
  - ``protos``: (B, 32, H/4, W/4) prototype masks.

* ``targets``: float (N, 6) rows ``[image_index, class, cx, cy, w, h]``, box normalised to the input image (the
  detection format, ``DetectionBatch["targets"]``). Rows of one image keep their order: it is what the masks
  refer to.

* ``masks`` (``SegmentationBatch["masks"]``), at 1/4 of the input size (H/4, W/4); another size is resized
  to the protos' size with nearest-neighbour sampling, as the reference does. Any integer, bool or float dtype.

  - ``overlap=True`` (the default, the reference's ``overlap_mask``): (B, H/4, W/4), one index map per image.
    0 is background; value k >= 1 is the k-th row (1-based) of that image's rows in ``targets``, counted in
    the order they appear there. Where instances overlap the map holds one of them (the reference draws the
    larger ones first, so smaller objects stay visible; that order is the data side's choice, not the loss's).
  - ``overlap=False``: (N, H/4, W/4), one binary (0/1) mask per row of ``targets``, in the same order.

* ``items``: detached (4,) gained terms in the reference's order ``(box, seg, cls, dfl)``; ``loss`` is their
  sum (scalar). As for ``DetectionLoss``, ``items == reference_items`` and ``loss ==
  reference_loss.sum() / batch_size`` for the reference ``v8SegmentationLoss`` (8.3.x).

The mask term, per foreground anchor (one assigned by the task-aligned assigner): logits =
coefficients · protos of its image, BCE-with-logits against its ground-truth instance mask, zeroed outside the
assigned box (in mask pixels: a pixel column r is kept when x1 <= r < x2, rows alike), averaged over all mask
pixels, divided by the box area as a fraction of the image; summed over anchors and divided by the number of
foreground anchors. Gain: the box gain (7.5) unless ``seg`` is given.

World-size invariance: ``normalizer_reduce`` receives a detached (2,) tensor ``[Σ target scores,
foreground anchors]`` of this rank and returns it summed over all ranks (one collective per step, on every
forward, empty batches included); box/cls/dfl are divided by max(global Σ, 1), the mask term by max(global
count, 1). Then each rank's loss is its share of the global-batch loss and the ranks' gradients summed equal
one process holding the whole batch. (The reference normalises per rank.)

Cost: one host sync per call (the foreground count of each image, to split the per-image mask products);
the mask term runs image by image, so its largest tensors are one image's (r_i, H/4, W/4) logits, as in the
reference.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from yolo11_lightning.loss.assigner import TaskAlignedAssigner
from yolo11_lightning.loss.detection import DetectionLoss, Prepared, _compact

__all__ = ["SegmentationLoss"]


class SegmentationLoss(DetectionLoss):
    """Loss of the YOLO11-seg train-mode output against targets and instance masks (module docstring).

    Args:
        num_classes, strides, reg_max, box, cls, dfl, normalizer_reduce, assigner: as ``DetectionLoss``.
        num_masks: mask coefficients per anchor (32 in YOLO11-seg).
        overlap: masks are one index map per image (True) or one binary mask per target row (False).
        seg: gain of the mask term; None uses the box gain, as the reference does.
    """

    def __init__(
        self,
        num_classes: int,
        strides: Sequence[int] = (8, 16, 32),
        reg_max: int = 16,
        box: float = 7.5,
        cls: float = 0.5,
        dfl: float = 1.5,
        normalizer_reduce: Callable[[Tensor], Tensor] | None = None,
        assigner: TaskAlignedAssigner | None = None,
        num_masks: int = 32,
        overlap: bool = True,
        seg: float | None = None,
    ) -> None:
        super().__init__(num_classes, strides, reg_max, box, cls, dfl, normalizer_reduce, assigner)
        if num_masks < 1:
            raise ValueError(f"SegmentationLoss: num_masks ({num_masks}) must be >= 1")
        self.num_masks, self.overlap = num_masks, bool(overlap)
        self.seg_gain = float(box if seg is None else seg)

    def forward(  # type: ignore[override]
        self, preds: Sequence, targets: Tensor, masks: Tensor
    ) -> tuple[Tensor, Tensor]:
        maps, coefficients, protos = self._check_preds(preds)
        self._check(maps, targets)
        self._check_masks(masks, targets, protos)
        with torch.autocast(maps[0].device.type, enabled=False):
            return self._seg_loss(maps, coefficients, protos, targets, masks)

    def _seg_loss(
        self, maps: Sequence[Tensor], coefficients: Tensor, protos: Tensor, targets: Tensor, masks: Tensor
    ) -> tuple[Tensor, Tensor]:
        prep = self._assign(maps, targets)
        assign = prep.assign
        dtype = prep.pred_logits.dtype
        local = torch.stack((assign.target_scores.sum(), assign.fg_mask.sum().to(dtype)))
        reduced = self.normalizer_reduce(local) if self.normalizer_reduce is not None else local
        normalizer, foreground = reduced[0].clamp(min=1), reduced[1].clamp(min=1)
        loss_box, loss_cls, loss_dfl = self._box_cls_dfl(prep, normalizer)
        loss_seg = self._mask_sum(prep, coefficients.to(dtype), protos.to(dtype), masks) / foreground
        terms = (loss_box, loss_seg, loss_cls, loss_dfl)
        gains = (self.gains[0], self.seg_gain, self.gains[1], self.gains[2])
        gained = torch.stack([term * gain for term, gain in zip(terms, gains)])
        return gained.sum(), gained.detach()

    def _mask_sum(self, prep: Prepared, coefficients: Tensor, protos: Tensor, masks: Tensor) -> Tensor:
        """Σ over foreground anchors of the cropped, area-normalised mask BCE (not yet divided by the count).

        Image by image, as the reference: the (r_i, H/4, W/4) tensors of one image's r_i foreground anchors are
        the largest ones, not the whole batch's (R, H/4, W/4) (lower peak memory, and on a CPU blocks small
        enough for the allocator to reuse instead of mapping fresh pages every step)."""
        assign = prep.assign
        bs, na = assign.fg_mask.shape
        mh, mw = protos.shape[-2:]
        counts = assign.fg_mask.sum(1).tolist()  # the one host sync: sizes of the per-image products
        total = sum(counts)
        if total == 0:  # keep protos and coefficients in the graph (DDP), with exactly zero gradient
            return protos.flatten()[:0].sum() + coefficients.flatten()[:0].sum()
        rows, _ = _compact(assign.fg_mask.flatten(), total)  # image-major, anchors in order
        image, anchor = rows // na, rows % na
        coef = coefficients.transpose(1, 2)[image, anchor]  # (R, nm)

        masks = masks.to(protos.device, non_blocking=True)
        if tuple(masks.shape[-2:]) != (mh, mw):
            masks = F.interpolate(masks[None].to(protos.dtype), (mh, mw), mode="nearest")[0]
        gt_row = assign.gt_index[image, anchor]  # row of the assigned box in ``targets``
        # What selects each anchor's ground-truth mask: its 1-based rank among its image's rows in the overlap
        # index map, or its row of the per-instance masks.
        selector = _rank_in_image(prep.targets[:, 0].long(), bs)[gt_row] + 1 if self.overlap else gt_row

        height, width = prep.image_size
        boxes = assign.target_boxes[image, anchor]  # (R, 4) xyxy, input pixels
        unit = boxes / boxes.new_tensor([width, height, width, height])
        area = (unit[:, 2] - unit[:, 0]) * (unit[:, 3] - unit[:, 1])
        edges = unit * unit.new_tensor([mw, mh, mw, mh])  # (R, 4) box in mask pixels
        cols = torch.arange(mw, device=protos.device, dtype=protos.dtype).view(1, 1, mw)
        lines = torch.arange(mh, device=protos.device, dtype=protos.dtype).view(1, mh, 1)

        loss = protos.new_zeros(())
        parts = zip(coef.split(counts), selector.split(counts), edges.split(counts), area.split(counts))
        for i, (c, select, box, a) in enumerate(parts):
            if not counts[i]:
                continue
            logits = torch.einsum("rn,nhw->rhw", c, protos[i])  # (r_i, mh, mw)
            if self.overlap:
                gt_masks = (masks[i] == select.view(-1, 1, 1).to(masks.dtype)).to(logits.dtype)
            else:
                gt_masks = masks[select].to(logits.dtype)
            x1, y1, x2, y2 = (v.view(-1, 1, 1) for v in box.unbind(1))
            inside = (cols >= x1) & (cols < x2) & (lines >= y1) & (lines < y2)
            bce = F.binary_cross_entropy_with_logits(logits, gt_masks, reduction="none")
            loss = loss + ((bce * inside).mean((1, 2)) / a).sum()
        return loss

    def _check_preds(self, preds: Sequence) -> tuple[Sequence[Tensor], Tensor, Tensor]:
        if not isinstance(preds, (tuple, list)) or len(preds) != 3:
            raise ValueError(
                "SegmentationLoss: preds must be the train-mode output (maps, coefficients, protos) of "
                f"YOLO11(task='segment'), got a {type(preds).__name__}"
                + (f" of {len(preds)} items" if isinstance(preds, (tuple, list)) else "")
            )
        maps, coefficients, protos = preds
        if not isinstance(maps, (tuple, list)) or not maps:
            raise ValueError("SegmentationLoss: preds[0] must be the list of level maps")
        bs = maps[0].shape[0]
        anchors = sum(int(m.shape[-2] * m.shape[-1]) for m in maps)
        if coefficients.ndim != 3 or tuple(coefficients.shape) != (bs, self.num_masks, anchors):
            raise ValueError(
                f"SegmentationLoss: coefficients have shape {tuple(coefficients.shape)}, expected "
                f"(B, num_masks, A) = ({bs}, {self.num_masks}, {anchors})"
            )
        if protos.ndim != 4 or tuple(protos.shape[:2]) != (bs, self.num_masks):
            raise ValueError(
                f"SegmentationLoss: protos have shape {tuple(protos.shape)}, expected (B, num_masks, H/4, W/4) "
                f"with B={bs}, num_masks={self.num_masks}"
            )
        return maps, coefficients, protos

    def _check_masks(self, masks: Tensor, targets: Tensor, protos: Tensor) -> None:
        bs, n = protos.shape[0], targets.shape[0]
        lead, what = (
            (bs, "(B, H/4, W/4) index maps (overlap=True)")
            if self.overlap
            else (
                n,
                "(N, H/4, W/4) per-instance masks, one per targets row (overlap=False)",
            )
        )
        if not isinstance(masks, Tensor) or masks.ndim != 3 or masks.shape[0] != lead:
            shape = tuple(masks.shape) if isinstance(masks, Tensor) else type(masks).__name__
            raise ValueError(
                f"SegmentationLoss: masks have shape {shape}, expected {what}, leading size {lead}"
            )
        # Index maps that point past their image's rows would silently train on nothing: checked where that
        # costs no device sync.
        if self.overlap and masks.device.type == "cpu" and n and masks.numel():
            per_image = torch.bincount(targets[:, 0].long().clamp(0, bs - 1), minlength=bs)
            top = masks.flatten(1).to(torch.long).amax(1)  # long first: amax takes no bool
            bad = (top > per_image).nonzero()
            if bad.numel():
                i = int(bad[0, 0])
                raise ValueError(
                    f"SegmentationLoss: masks[{i}] holds index {int(top[i])} but image {i} has "
                    f"{int(per_image[i])} targets rows"
                )


def _rank_in_image(image: Tensor, bs: int) -> Tensor:
    """(N,) position (0-based) of each targets row among the rows of its image, in order of appearance."""
    if image.numel() == 0:
        return image
    onehot = F.one_hot(image.clamp(0, bs - 1), bs)
    return onehot.cumsum(0).gather(1, image.clamp(0, bs - 1)[:, None]).squeeze(1) - 1
