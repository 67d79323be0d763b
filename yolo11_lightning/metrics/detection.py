"""Detection mAP: each batch matched where it is scored, the matches of every rank accumulated once per epoch.

COCO splits its evaluation in two: ``evaluateImg`` matches the detections of one image to its truths, and
``accumulate`` turns every image's matches into precision per class. ``DetectionMAP`` does the first in ``update``,
for a whole batch at once (``metrics.coco.coco_match``), so each rank matches only its own shard of the
validation set while it validates; it keeps one row per detection (its image, place, score, class and match
flags) and one per truth. ``compute`` gathers those rows (a few numbers per detection, no boxes) and accumulates
them in dataset-index order (``metrics.coco.coco_precision``): the values equal faster-coco-eval's and
pycocotools' on the same detections, and equal on any number of ranks.

A metric scores one or more kinds of prediction, each with its IoU and its rules: ``box`` here (COCO's, in
original image pixels); ``mask`` for segmentation (COCO's); ``pose`` (OKS) and OBB's ``box`` (probiou) by the
reference validator's rules (``metrics.reference_ap``). A kind logs ``<prefix>mAP50-95``, ``<prefix>mAP50``,
``<prefix>mAP75`` and ``<prefix>AP/<class>`` for every class with truths.

``reference_style=True`` adds ``mAP50-95_reference_style``: the same detections scored by the reference
validator's rules, for comparison with Ultralytics logs. Like the reference, it matches in letterboxed-input
pixels and does not clip the detections to the image (COCO scores them clipped, in original pixels).

With ``keep_evaluation`` set (the result pictures and the closing summary set it on rank 0), each compute also
keeps what it scored as ``evaluation`` (``class_results.Evaluation``), for the per-class results.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor
from torchmetrics import Metric
from torchvision.ops import box_convert

from yolo11_lightning.metrics.class_results import (
    CONFUSION_MIN_SCORE,
    Evaluation,
    KindEvaluation,
    confusion_pairs,
)
from yolo11_lightning.metrics.coco import (
    coco_box_iou,
    coco_boxes,
    coco_match,
    coco_precision,
    coco_summary,
    group_ranks,
)
from yolo11_lightning.metrics.reference_ap import IOU_THRESHOLDS, as_tensor, match_pairs, precision_curves
from yolo11_lightning.ops.letterbox import detections_to_original, letterbox_to_original

# Columns of a detection row; each kind adds one column of match flags (bit t: a match at IoU threshold t,
# bit 10: a match at IoU 0.5 by the reference's rule, what the per-class P/R/F1 curves count).
_IMAGE, _PLACE, _SCORE, _CLASS, _COUNTED = range(5)
_HALF_BIT = len(IOU_THRESHOLDS)


@dataclass(frozen=True)
class Kind:
    """One kind of prediction a metric scores: its rules (``"coco"`` or ``"reference"``), the prefix of its logged
    keys, and whether the per-class results (summary, pictures) show it."""

    rules: str
    prefix: str
    shown: bool = True


PairIoU = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (p,) detection and truth indices -> (p,) IoU


@dataclass
class ScoredBatch:
    """What ``update`` scores of one batch, flat over its images (image by image, each in its own order): n
    detections, m truths, and per kind the IoU (or OKS) of any (detection, truth) pairs of the same image."""

    det_images: np.ndarray  # (n,) the image of each detection, 0..B-1
    scores: np.ndarray  # (n,) float64
    classes: np.ndarray  # (n,) int64
    truth_images: np.ndarray  # (m,)
    truth_classes: np.ndarray  # (m,) int64
    pair_iou: dict[str, PairIoU]


class DetectionMAP(Metric):
    """COCO box mAP (IoU 0.50:0.05:0.95, 101-point) in original image pixels; see the module docstring.

    ``update(detections, batch)``: per image (n, 6) ``[x1, y1, x2, y2, score, class]`` detections in
    letterboxed-input pixels and the batch they came from. ``compute()`` -> ``{"mAP50-95", "mAP50", "mAP75",
    "AP/<class name>", ...}`` as float64 scalars on the metric's device, the same on every rank.
    """

    full_state_update = False
    KINDS: ClassVar[dict[str, Kind]] = {"box": Kind("coco", "")}
    CONFUSION_KIND = "box"  # the IoU the confusion matrix matches by

    def __init__(
        self,
        class_names: list[str] | None = None,
        max_detections: int = 300,
        reference_style: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.class_names = class_names
        self.max_detections = max_detections
        self.reference_style = reference_style
        self.kinds = dict(self.KINDS)
        if reference_style:
            self.kinds["box_reference"] = Kind("reference", "", shown=False)
        self.keep_evaluation = False
        self.evaluation: Evaluation | None = None
        # Flat float64 rows: detections [image, place, score, class, counted, flags per kind]; truths [image,
        # class]; images [image]; confusion [predicted class, true class] (-1: the background).
        self._widths = {"detections": 5 + len(self.kinds), "truths": 2, "images": 1, "confusion": 2}
        for name in self._widths:
            self.add_state(name, default=[], dist_reduce_fx="cat")

    # ----------------------------------------------------------------------------------------- per batch
    @staticmethod
    def to_original(detections: list[Tensor], batch: dict[str, Any]) -> list[Tensor]:
        """Maps (n, 6) detections from letterboxed-input pixels to original image pixels by ops.letterbox."""
        return detections_to_original(detections, batch["scales"], batch["pads"], batch["orig_sizes"])

    @staticmethod
    def targets_in_input(batch: dict[str, Any]) -> list[Tensor]:
        """Returns each image's ground truth as (m, 5) [x1, y1, x2, y2, class] in letterboxed-input pixels."""
        targets, images = batch["targets"], batch["images"]
        height, width = images.shape[-2:]
        size = torch.tensor([width, height, width, height], device=targets.device, dtype=targets.dtype)
        boxes = box_convert(targets[:, 2:6] * size, "cxcywh", "xyxy")
        return [
            torch.cat((boxes[targets[:, 0] == i], targets[targets[:, 0] == i, 1:2]), 1)
            for i in range(images.shape[0])
        ]

    @classmethod
    def targets_to_original(cls, batch: dict[str, Any]) -> list[Tensor]:
        """Returns each image's ground truth as (m, 5) [x1, y1, x2, y2, class] in original pixels."""
        out = []
        for i, truth in enumerate(cls.targets_in_input(batch)):
            original = letterbox_to_original(
                truth[:, :4], batch["scales"][i], batch["pads"][i], batch["orig_sizes"][i]
            )
            out.append(torch.cat((original, truth[:, 4:5]), 1))
        return out

    def update(self, detections: list[Tensor], batch: dict[str, Any]) -> None:
        """Matches one batch: ``detections`` per image (n, 6) in letterboxed-input pixels."""
        self._add(batch, self._score_boxes(detections, batch))

    def _score_boxes(self, detections: list[Tensor], batch: dict[str, Any]) -> ScoredBatch:
        """Scores the box kinds of a batch: COCO's IoU in original pixels, the reference's in input pixels."""
        det_images = torch.repeat_interleave(
            torch.arange(len(detections)), torch.tensor([len(d) for d in detections])
        )
        flat = torch.cat([d.detach()[:, :6] for d in detections]).cpu() if detections else torch.zeros(0, 6)
        targets = image_ordered(batch["targets"]).detach().cpu()
        truth_images = targets[:, 0].long()
        height, width = batch["images"].shape[-2:]
        truths_in_input = box_convert(
            targets[:, 2:6] * targets.new_tensor([width, height, width, height]), "cxcywh", "xyxy"
        )
        letterbox = [batch[key].detach().cpu() for key in ("scales", "pads", "orig_sizes")]
        det_boxes = coco_boxes(_to_original(flat[:, :4], det_images, *letterbox))
        truth_boxes = coco_boxes(_to_original(truths_in_input, truth_images, *letterbox))
        pair_iou = {"box": lambda d, t: coco_box_iou(truth_boxes[t], det_boxes[d])}
        if self.reference_style:
            det_input, truth_input = flat[:, :4].double().numpy(), truths_in_input.double().numpy()
            pair_iou["box_reference"] = lambda d, t: _box_iou_pairs(truth_input[t], det_input[d])
        return ScoredBatch(
            det_images=det_images.numpy(),
            scores=flat[:, 4].float().double().numpy(),
            classes=flat[:, 5].long().numpy(),
            truth_images=truth_images.numpy(),
            truth_classes=targets[:, 1].long().numpy(),
            pair_iou=pair_iou,
        )

    def _add(self, batch: dict[str, Any], scored: ScoredBatch) -> None:
        """Matches every kind of ``scored`` and appends the batch's rows to the states."""
        ids = batch["indices"].detach().cpu().double().numpy()
        scores, classes, truth_classes = scored.scores, scored.classes, scored.truth_classes
        det_counts = np.bincount(scored.det_images, minlength=len(ids))
        span = int(max(classes.max(initial=0), truth_classes.max(initial=0))) + 1
        det_groups = scored.det_images * span + classes
        truth_groups = scored.truth_images * span + truth_classes
        pair_det, pair_truth = _same_group_pairs(truth_groups, det_groups)
        ranks = group_ranks(det_groups, scores)
        counted = ranks < self.max_detections
        columns = [
            ids[scored.det_images],
            np.arange(len(scores)) - np.repeat(np.cumsum(det_counts) - det_counts, det_counts),
            scores,
            classes.astype(np.float64),
            counted.astype(np.float64),
        ]
        for name, kind in self.kinds.items():
            iou = scored.pair_iou[name](pair_det, pair_truth)
            half = match_pairs(iou, pair_det, pair_truth, len(scores))
            if kind.rules == "coco":
                capped = counted[pair_det]
                matched = coco_match(
                    iou[capped], pair_det[capped], pair_truth[capped], ranks, truth_groups, det_groups
                )
            else:
                matched = half
            flags = np.concatenate((matched, half[:, :1]), 1).astype(np.int64)
            columns.append((flags << np.arange(flags.shape[1])).sum(1).astype(np.float64))
        confident = np.flatnonzero(scores > CONFUSION_MIN_SCORE)
        image_det, image_truth = _same_group_pairs(scored.truth_images, scored.det_images[confident])
        image_det = confident[image_det]
        iou = scored.pair_iou[self.CONFUSION_KIND](image_det, image_truth)
        confusion = confusion_pairs(iou, image_det, image_truth, confident, classes, truth_classes)
        self._append("detections", np.stack(columns, 1))
        self._append("truths", np.stack((ids[scored.truth_images], truth_classes.astype(np.float64)), 1))
        self._append("images", ids[:, None])
        self._append("confusion", confusion.astype(np.float64))

    def _append(self, state: str, rows: np.ndarray) -> None:
        getattr(self, state).append(torch.from_numpy(np.ascontiguousarray(rows, np.float64)).to(self.device))

    # ------------------------------------------------------------------------------------------ per epoch
    def _sync_dist(self, dist_sync_fn: Any = None, process_group: Any = None) -> None:
        # A rank that saw no batch must still send a correctly shaped (0, width) tensor to the gather.
        for name, width in self._widths.items():
            if not getattr(self, name):
                setattr(self, name, [torch.zeros((0, width), dtype=torch.float64, device=self.device)])
        super()._sync_dist(dist_sync_fn, process_group)

    def _host_states(self) -> dict[str, np.ndarray]:
        """Concatenates every state on the host, in dataset-index order.

        Detections and truths come in dataset-index order, then each image's order: the order that makes the
        values the same on any number of ranks.
        """
        out = {}
        for name, width in self._widths.items():
            value = getattr(self, name)
            if isinstance(value, list):
                value = torch.cat(value) if value else torch.zeros((0, width), dtype=torch.float64)
            out[name] = value.cpu().numpy().reshape(-1, width)
        detections = out["detections"]
        out["detections"] = detections[np.lexsort((detections[:, _PLACE], detections[:, _IMAGE]))]
        out["truths"] = out["truths"][np.argsort(out["truths"][:, 0], kind="stable")]
        return out

    def compute(self) -> dict[str, Tensor]:
        """Returns {"mAP50-95", "mAP50", "mAP75", "AP/<class name>", ...} per kind; see the module docstring.

        Accumulated on the host from the gathered rows; the values are returned on the metric's device, where
        every other metric of the module lives, so that any consumer (a logger's sync, a collective) finds them
        on the process group's device."""
        return {name: value.to(self.device) for name, value in self._evaluate().items()}

    def _evaluate(self) -> dict[str, Tensor]:
        """Computes compute's values on the host.

        After a gather every rank holds every row; the classes are then shared out (``_share``) and each
        rank accumulates its share, the per-class arrays summed up by one all-reduce (the maximum of each
        entry: the others' entries are -inf).
        """
        states = self._host_states()
        detections, truths = states["detections"], states["truths"]
        scores, classes = detections[:, _SCORE], detections[:, _CLASS].astype(np.int64)
        truth_classes = truths[:, 1].astype(np.int64)
        share = self._share()
        partial = {}
        for column, (name, kind) in enumerate(self.kinds.items(), start=_COUNTED + 1):
            flags = detections[:, column].astype(np.int64)[:, None] >> np.arange(_HALF_BIT + 1) & 1
            matched = flags[:, :_HALF_BIT].astype(bool)
            if kind.rules == "coco":
                counted = detections[:, _COUNTED] > 0
                class_ids = np.unique(np.concatenate((classes, truth_classes)))
                arrays = [
                    coco_precision(
                        matched[counted], scores[counted], classes[counted], truth_classes, class_ids, share
                    )
                ]  # fmt: skip
            else:
                class_ids, *arrays = precision_curves(matched, scores, classes, truth_classes, share)
            partial[name] = (class_ids, arrays, flags[:, _HALF_BIT].astype(bool))
        assembled = self._assemble([a for _, arrays, _ in partial.values() for a in arrays])
        out: dict[str, Tensor] = {}
        kept: dict[str, KindEvaluation] = {}
        for name, (class_ids, arrays, half) in partial.items():
            kind = self.kinds[name]
            finished = [assembled.pop(0) for _ in arrays]
            result = (
                _coco_kind(class_ids, *finished)
                if kind.rules == "coco"
                else _reference_kind(class_ids, *finished)
            )
            result.matched = half
            if name == "box_reference":
                out["mAP50-95_reference_style"] = as_tensor(result.map50_95)
                continue
            out[f"{kind.prefix}mAP50-95"] = as_tensor(result.map50_95)
            out[f"{kind.prefix}mAP50"] = as_tensor(result.map50)
            out[f"{kind.prefix}mAP75"] = as_tensor(result.map75)
            for cls, ap in zip(result.classes.tolist(), result.ap.mean(1)):
                out[f"{kind.prefix}AP/{self._class_name(cls)}"] = as_tensor(float(ap))
            if kind.shown:
                kept[name] = result
        if self.keep_evaluation:
            self.evaluation = Evaluation(
                scores=scores,
                classes=classes,
                truth_images=truths[:, 0],
                truth_classes=truth_classes,
                num_images=len(np.unique(states["images"])),
                kinds=kept,
                confusion=states["confusion"].astype(np.int64),
            )
        return out

    def _share(self) -> tuple[int, int]:
        """Returns (rank, ranks) among which the classes are shared out.

        Every rank of the process group when this compute gathered the states (then every rank holds the same
        rows), else (0, 1).
        """
        if self._is_synced and dist.is_available() and dist.is_initialized():
            group = self.process_group
            if dist.get_world_size(group) > 1:
                return dist.get_rank(group), dist.get_world_size(group)
        return 0, 1

    def _assemble(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """Makes every rank's share of ``arrays`` whole by one max all-reduce on the process group's device.

        Each share holds -inf where another rank computed.
        """
        if self._share()[1] == 1 or not sum(a.size for a in arrays):  # the same sizes on every rank
            return arrays
        flat = torch.from_numpy(np.concatenate([a.reshape(-1) for a in arrays])).to(self.device)
        dist.all_reduce(flat, op=dist.ReduceOp.MAX, group=self.process_group)
        values = flat.cpu().numpy()
        out, start = [], 0
        for a in arrays:
            out.append(values[start : start + a.size].reshape(a.shape))
            start += a.size
        return out

    def _class_name(self, cls: int) -> str:
        return self.class_names[cls] if self.class_names and 0 <= cls < len(self.class_names) else str(cls)


def _coco_kind(class_ids: np.ndarray, precision: np.ndarray) -> KindEvaluation:
    """Builds one kind's results from COCO's (10, 101, K) precision of ``class_ids``.

    Per class, the classes with truths.
    """
    with_truths = precision[0, 0, :] > -1
    return KindEvaluation(
        map50_95=coco_summary(precision),
        map50=coco_summary(precision[0]),
        map75=coco_summary(precision[5]),
        classes=class_ids[with_truths],
        ap=precision[:, :, with_truths].mean(1).T,
        pr_curve=precision[0][:, with_truths].T,
    )


def _reference_kind(present: np.ndarray, aps: np.ndarray, curves: np.ndarray) -> KindEvaluation:
    """Builds one kind's results from the reference's AP (C, 10) and PR curves (C, 101) of present classes."""
    mean = aps.mean(0) if len(present) else np.zeros(len(IOU_THRESHOLDS))
    return KindEvaluation(
        map50_95=float(mean.mean()),
        map50=float(mean[0]),
        map75=float(mean[5]),
        classes=present.astype(np.int64),
        ap=aps,
        pr_curve=curves,
    )


def _same_group_pairs(truth_groups: np.ndarray, det_groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lists every (detection, truth) pair with the same image and class key, by truth then detection."""
    order = np.argsort(det_groups, kind="stable")
    sorted_groups = det_groups[order]
    start = np.searchsorted(sorted_groups, truth_groups, side="left")
    counts = np.searchsorted(sorted_groups, truth_groups, side="right") - start
    offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    return order[np.repeat(start, counts) + offsets], np.repeat(np.arange(len(truth_groups)), counts)


def image_ordered(rows: Tensor) -> Tensor:
    """Groups rows [image, ...] by image, each image's rows in their order.

    The rows are a batch's targets, keypoints and the like; this is the truth order every kind of a batch
    is scored in.
    """
    return rows[torch.argsort(rows[:, 0], stable=True)] if len(rows) else rows


def _to_original(boxes: Tensor, images: Tensor, scales: Tensor, pads: Tensor, orig_sizes: Tensor) -> Tensor:
    """Maps (n, 4) xyxy boxes of the (n,) images from letterboxed-input to original pixels, clipped.

    The arithmetic of ops.letterbox.letterbox_to_original, element by element, for many images at once.
    """
    per_image = scales.reshape(len(scales), -1)  # (B, 1), or (B, 2) per axis
    scale = per_image.repeat(1, 4 // per_image.shape[1])
    out = (boxes - pads.repeat(1, 2)[images]) / scale[images]
    size = orig_sizes.flip(1).repeat(1, 2)[images].to(out.dtype)  # (w, h, w, h)
    return torch.minimum(out.clamp(min=0), size)


def _box_iou_pairs(truths: np.ndarray, detections: np.ndarray) -> np.ndarray:
    """Returns the (p,) IoU of each pair of (p, 4) xyxy boxes, by torchvision.ops.box_iou's arithmetic."""
    area_t = (truths[:, 2] - truths[:, 0]) * (truths[:, 3] - truths[:, 1])
    area_d = (detections[:, 2] - detections[:, 0]) * (detections[:, 3] - detections[:, 1])
    wh = np.clip(
        np.minimum(truths[:, 2:], detections[:, 2:]) - np.maximum(truths[:, :2], detections[:, :2]), 0, None
    )
    inter = wh[:, 0] * wh[:, 1]
    return inter / (area_t + area_d - inter)


def pair_iou_from_matrices(
    matrices: list[np.ndarray], det_counts: np.ndarray, truth_counts: np.ndarray
) -> PairIoU:
    """Builds a PairIoU that reads each pair's entry of its image's (m_i, n_i) matrix."""
    flat = np.concatenate([np.zeros(0), *(np.asarray(m, np.float64).reshape(-1) for m in matrices)])
    det_start = np.cumsum(det_counts) - det_counts
    truth_start = np.cumsum(truth_counts) - truth_counts
    matrix_start = np.cumsum(truth_counts * det_counts) - truth_counts * det_counts

    def read(pair_det: np.ndarray, pair_truth: np.ndarray) -> np.ndarray:
        image = np.searchsorted(np.cumsum(truth_counts), pair_truth, side="right")
        local_truth, local_det = pair_truth - truth_start[image], pair_det - det_start[image]
        return flat[matrix_start[image] + local_truth * det_counts[image] + local_det]

    return read
