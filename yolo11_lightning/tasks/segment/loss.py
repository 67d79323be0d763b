"""YOLO11 instance-segmentation loss: the detection terms plus a per-instance mask BCE.

The contract (what the data side and the model hand to the loss)::

    loss, items = SegmentationLoss(num_classes, overlap=True)(preds, targets, masks, targets_per_image)

* ``preds``: the train-mode output of ``create_model(scale, nc, task="segment")``, a tuple
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

* ``targets_per_image`` (optional): rows of ``targets`` per image, a host-side list of B ints
  (``DetectionBatch["targets_per_image"]``). It bounds each image's foreground anchors (at most ``topk`` per row)
  without reading the device; without it the loss reads the per-image foreground counts back (one host sync).

* ``items``: detached (4,) gained terms in the reference's order ``(box, seg, cls, dfl)``; ``loss`` is their
  sum (scalar). As for ``DetectionLoss``, ``items == reference_items`` and ``loss ==
  reference_loss.sum() / batch_size`` for the reference ``v8SegmentationLoss`` (8.3.x).

The mask term, per foreground anchor (one assigned by the task-aligned assigner): logits =
coefficients · protos of its image, BCE-with-logits against its ground-truth instance mask, zeroed outside the
assigned box (in mask pixels: a pixel column r is kept when x1 <= r < x2, rows alike), averaged over all mask
pixels, divided by the box area as a fraction of the image; summed over anchors and divided by the number of
foreground anchors. Gain: the box gain (7.5) unless ``seg`` is given.

World-size invariance: as ``DetectionLoss``; the summary handed to ``sum_over_ranks`` is ``[Σ target scores,
foreground anchors, Σ box, Σ seg, Σ cls, Σ dfl]``: box/cls/dfl are divided by max(global Σ, 1), the mask term by
max(global count, 1). Then each rank's loss is its share of the global-batch loss and the ranks' gradients summed
equal one process holding the whole batch. (The reference normalises per rank.)

Cost: the mask term runs image by image, so its largest tensors are one image's (r_i, H/4, W/4) logits, as in
the reference. On the CPU, r_i is the image's foreground count (read for free); on an accelerator it is the bound
``min(topk · rows of the image, anchors)`` known on the host, the rows past the foreground count weighing 0, so
that the step never waits for the device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from yolo11_lightning.loss.assigner import TaskAlignedAssigner
from yolo11_lightning.loss.detection import DetectionLoss, Prepared, compact_rows

__all__ = ["SegmentationLoss"]


class SegmentationLoss(DetectionLoss):
    """Loss of the YOLO11-seg train-mode output against targets and instance masks; see the module docstring.

    Args:
        num_classes, strides, reg_max, box, cls, dfl, sum_over_ranks, assigner: as ``DetectionLoss``.
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
        sum_over_ranks: Callable[[Tensor], Tensor] | None = None,
        assigner: TaskAlignedAssigner | None = None,
        num_masks: int = 32,
        overlap: bool = True,
        seg: float | None = None,
    ) -> None:
        super().__init__(num_classes, strides, reg_max, box, cls, dfl, sum_over_ranks, assigner)
        if num_masks < 1:
            raise ValueError(f"SegmentationLoss: num_masks ({num_masks}) must be >= 1")
        self.num_masks, self.overlap = num_masks, bool(overlap)
        self.seg_gain = float(box if seg is None else seg)

    def forward(  # type: ignore[override]
        self, preds: Sequence, targets: Tensor, masks: Tensor, targets_per_image: Sequence[int] | None = None
    ) -> tuple[Tensor, Tensor]:
        maps, coefficients, protos = self._check_preds(preds)
        self._check(maps, targets)
        self._check_masks(masks, targets, protos)
        if targets_per_image is not None and len(targets_per_image) != maps[0].shape[0]:
            raise ValueError(
                f"SegmentationLoss: targets_per_image has {len(targets_per_image)} counts for a batch of "
                f"{maps[0].shape[0]} images"
            )
        with torch.autocast(maps[0].device.type, enabled=False):
            return self._seg_loss(maps, coefficients, protos, targets, masks, targets_per_image)

    def _seg_loss(
        self, maps: Sequence[Tensor], coefficients: Tensor, protos: Tensor, targets: Tensor, masks: Tensor,
        targets_per_image: Sequence[int] | None,
    ) -> tuple[Tensor, Tensor]:  # fmt: skip
        prep = self._assign(maps, targets)
        assign = prep.assign
        dtype = prep.pred_logits.dtype
        box, cls, dfl = self._box_cls_dfl_sums(prep).unbind()
        mask = self._mask_sum(prep, coefficients.to(dtype), protos.to(dtype), masks, targets_per_image)
        sums = torch.stack((box, mask * self.seg_gain, cls, dfl))
        normalisers = torch.stack((assign.target_scores.sum(), assign.fg_mask.sum().to(dtype)))
        return self._normalise(sums, normalisers, (0, 1, 0, 0))

    def _row_bounds(self, prep: Prepared, targets_per_image: Sequence[int] | None) -> list[int]:
        """Returns per image how many foreground anchors to take.

        The exact count on the CPU (reading it is free), else the bound ``min(topk · rows, anchors)`` from
        host-side counts (no wait for the device).
        """
        fg_mask = prep.assign.fg_mask
        bs, na = fg_mask.shape
        if fg_mask.device.type == "cpu":
            return [int(n) for n in fg_mask.sum(1).tolist()]
        if targets_per_image is None:  # no host-side counts: read them (one host sync)
            targets_per_image = torch.bincount(prep.targets[:, 0].long(), minlength=bs).tolist()
        return [min(int(n) * self.assigner.topk, na) for n in targets_per_image]

    def _mask_sum(
        self, prep: Prepared, coefficients: Tensor, protos: Tensor, masks: Tensor,
        targets_per_image: Sequence[int] | None,
    ) -> Tensor:  # fmt: skip
        """Sums the cropped, area-normalised mask BCE over foreground anchors, not yet divided by their count.

        Image by image, as the reference: the (r_i, H/4, W/4) tensors of one image's r_i anchors are the largest
        ones, not the whole batch's (R, H/4, W/4) (lower peak memory, and on a CPU blocks small enough for the
        allocator to reuse instead of mapping fresh pages every step)."""
        assign = prep.assign
        bs = assign.fg_mask.shape[0]
        mh, mw = protos.shape[-2:]
        bounds = self._row_bounds(prep, targets_per_image)
        # Every term multiplies a tensor of the graph: an empty batch keeps protos and coefficients in it (DDP),
        # with exactly zero gradient.
        loss = protos.flatten()[:0].sum() + coefficients.flatten()[:0].sum()
        if not any(bounds):
            return loss

        masks = masks.to(protos.device, non_blocking=True)
        if tuple(masks.shape[-2:]) != (mh, mw):
            masks = F.interpolate(masks[None].to(protos.dtype), (mh, mw), mode="nearest")[0]
        # What selects each anchor's ground-truth mask: its 1-based rank among its image's rows in the overlap
        # index map, or its row of the per-instance masks.
        rank = _rank_in_image(prep.targets[:, 0].long(), bs) + 1 if self.overlap else None
        height, width = prep.image_size
        cols = torch.arange(mw, device=protos.device, dtype=protos.dtype).view(1, 1, mw)
        lines = torch.arange(mh, device=protos.device, dtype=protos.dtype).view(1, mh, 1)
        for i, bound in enumerate(bounds):
            if not bound:
                continue
            anchor, valid = compact_rows(
                assign.fg_mask[i], bound
            )  # this image's foreground anchors, in order
            c = coefficients[i].T[anchor]  # (r_i, nm)
            gt_row = assign.gt_index[i, anchor]  # row of the assigned box in ``targets``
            box = assign.target_boxes[i, anchor]  # (r_i, 4) xyxy, input pixels
            # Scaled by Python numbers: a tensor made from a list would be a blocking host-to-device copy.
            ux1, uy1, ux2, uy2 = box[:, 0] / width, box[:, 1] / height, box[:, 2] / width, box[:, 3] / height
            # Rows past the foreground count weigh 0; their area is set to 1 so that 0 * (x / 0) cannot
            # turn into a NaN gradient.
            area = torch.where(valid, (ux2 - ux1) * (uy2 - uy1), 1.0)
            x1, y1, x2, y2 = (v.view(-1, 1, 1) for v in (ux1 * mw, uy1 * mh, ux2 * mw, uy2 * mh))
            logits = torch.einsum("rn,nhw->rhw", c, protos[i])  # (r_i, mh, mw)
            if self.overlap:
                gt_masks = (masks[i] == rank[gt_row].view(-1, 1, 1).to(masks.dtype)).to(logits.dtype)
            else:
                gt_masks = masks[gt_row].to(logits.dtype)
            inside = (cols >= x1) & (cols < x2) & (lines >= y1) & (lines < y2)
            bce = F.binary_cross_entropy_with_logits(logits, gt_masks, reduction="none")
            loss = loss + ((bce * inside).mean((1, 2)) / area * valid).sum()
        return loss

    def _check_preds(self, preds: Sequence) -> tuple[Sequence[Tensor], Tensor, Tensor]:
        if not isinstance(preds, (tuple, list)) or len(preds) != 3:
            raise ValueError(
                "SegmentationLoss: preds must be the train-mode output (maps, coefficients, protos) of "
                f"create_model(task='segment'), got a {type(preds).__name__}"
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
    """Returns the 0-based (N,) position of each target row among its image's rows, in order."""
    if image.numel() == 0:
        return image
    onehot = F.one_hot(image.clamp(0, bs - 1), bs)
    return onehot.cumsum(0).gather(1, image.clamp(0, bs - 1)[:, None]).squeeze(1) - 1
