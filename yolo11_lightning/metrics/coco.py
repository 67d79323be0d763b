"""COCO's evaluation computed from arrays: per-image greedy matching, then one precision array for every class.

This is what pycocotools' and faster-coco-eval's ``COCOeval`` compute for one IoU type, the area range "all" and
one detection limit, without one Python dict per detection and without a second run per class:

- ``coco_match`` is ``evaluateImg`` for many images at once. Within each (image, class) the detections go in
  decreasing score (equal scores keep their order), the first ``max_detections`` only; at each IoU threshold
  0.50:0.05:0.95 each takes the unmatched truth of its class with the highest IoU at or above the threshold (the
  last such truth on equal IoUs: COCO scans the truths with ``>=``). There are no crowd truths, so no truth and no
  detection is ignored.
- ``coco_precision`` is ``accumulate``: per class, the detections of every image by decreasing score (equal
  scores in image order, then each image's order), true and false positives counted down the list, the precision
  envelope read at the 101 recall thresholds (0 past the highest recall reached); -1 for a class without truths.
  ``coco_summary`` is ``summarize``: the mean of the entries that are not -1.

Box IoU follows COCO's arithmetic: the boxes reach COCO as float32 ``[x, y, w, h]`` (what torchmetrics hands over),
the intersection and union are computed from them in float64 (``maskApi.c`` ``bbIou``).
"""

from __future__ import annotations

import numpy as np
from torch import Tensor
from torchvision.ops import box_convert

# COCO's own grids, built as pycocotools builds them (``np.linspace``: 0.6000000000000001 and such, bit for bit).
IOU_THRESHOLDS = np.linspace(0.5, 0.95, int(np.round((0.95 - 0.5) / 0.05)) + 1)
RECALL_THRESHOLDS = np.linspace(0.0, 1.0, int(np.round((1.0 - 0.0) / 0.01)) + 1)


def coco_boxes(xyxy: Tensor) -> np.ndarray:
    """Converts (n, 4) [x1, y1, x2, y2] boxes to (n, 4) float64 [x, y, w, h] with COCO's float32 rounding."""
    return box_convert(xyxy.detach().float().cpu(), "xyxy", "xywh").double().numpy()


def coco_box_iou(truths: np.ndarray, detections: np.ndarray) -> np.ndarray:
    """Returns the IoU of broadcast (..., 4) float64 [x, y, w, h] boxes by COCO's bbIou arithmetic."""
    t, d = truths, detections
    w = np.minimum(d[..., 2] + d[..., 0], t[..., 2] + t[..., 0]) - np.maximum(d[..., 0], t[..., 0])
    h = np.minimum(d[..., 3] + d[..., 1], t[..., 3] + t[..., 1]) - np.maximum(d[..., 1], t[..., 1])
    inter = w * h
    union = d[..., 2] * d[..., 3] + t[..., 2] * t[..., 3] - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where((w > 0) & (h > 0), inter / union, 0.0)


def group_ranks(groups: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Ranks each detection in its group by decreasing score, equal scores in their order.

    Takes (n,) int64 group keys and scores and returns (n,) places: COCO's order within an (image, class),
    whose first ``max_detections`` count.
    """
    order = np.lexsort((np.arange(len(groups)), -scores, groups))
    ranks = np.empty(len(groups), np.int64)
    sorted_groups = groups[order]
    starts = np.flatnonzero(np.r_[True, sorted_groups[1:] != sorted_groups[:-1]]) if len(groups) else []
    first = np.repeat(starts, np.diff(np.r_[starts, len(groups)])) if len(groups) else np.zeros(0, np.int64)
    ranks[order] = np.arange(len(groups)) - first
    return ranks


def coco_match(
    iou: np.ndarray,
    pair_det: np.ndarray,
    pair_truth: np.ndarray,
    det_rank: np.ndarray,
    truth_groups: np.ndarray,
    det_groups: np.ndarray,
) -> np.ndarray:
    """Matches detections to truths of many images at once greedily, as COCO does; see the module docstring.

    Args:
        iou: (p,) IoU of each (detection, truth) pair of the same image and class.
        pair_det, pair_truth: (p,) the pairs' detection and truth indices.
        det_rank: (n,) each detection's place in its group by decreasing score (``group_ranks``); detections past
            the detection limit must have no pair.
        truth_groups, det_groups: (m,) and (n,) int64 (image, class) keys.

    Returns:
        (n, 10) bool: the detection matches a truth at IoU threshold 0.50, 0.55, ..., 0.95.
    """
    matched = np.zeros((len(det_rank), len(IOU_THRESHOLDS)), bool)
    keep = iou >= IOU_THRESHOLDS[0]  # no threshold accepts a lower IoU: such a pair never matches
    iou, pair_det, pair_truth = iou[keep], pair_det[keep], pair_truth[keep]
    if not len(iou):
        return matched
    # A group with one truth needs no scan: at each threshold its first detection reaching it takes the truth.
    truths_in_group = np.unique(truth_groups, return_counts=True)
    alone = np.isin(truth_groups[pair_truth], truths_in_group[0][truths_in_group[1] == 1])
    _first_reaching(matched, iou[alone], pair_det[alone], det_rank, det_groups)
    _scan(matched, iou[~alone], pair_det[~alone], pair_truth[~alone], det_rank, truth_groups, det_groups)
    return matched


def _first_reaching(
    matched: np.ndarray, iou: np.ndarray, pair_det: np.ndarray, det_rank: np.ndarray, det_groups: np.ndarray
) -> None:
    """Runs coco_match in place for groups of one truth.

    At each threshold the best-ranked detection of the group whose IoU reaches it is the match.
    """
    order = np.lexsort((det_rank[pair_det], det_groups[pair_det]))
    iou, pair_det = iou[order], pair_det[order]
    groups = det_groups[pair_det]
    for t, threshold in enumerate(IOU_THRESHOLDS):
        reaching = np.flatnonzero(iou >= threshold)
        _, first = np.unique(groups[reaching], return_index=True)
        matched[pair_det[reaching[first]], t] = True


def _scan(
    matched: np.ndarray,
    iou: np.ndarray,
    pair_det: np.ndarray,
    pair_truth: np.ndarray,
    det_rank: np.ndarray,
    truth_groups: np.ndarray,
    det_groups: np.ndarray,
) -> None:
    """Runs coco_match in place for groups of several truths, by COCO's scan.

    One detection of every group per step, the detections of a group in rank order, all groups and
    thresholds of a step at once.
    """
    if not len(iou):
        return
    # Each truth's place among the truths of its group, in input order (COCO's truth order).
    truth_order = np.lexsort((np.arange(len(truth_groups)), truth_groups))
    sorted_keys = truth_groups[truth_order]
    truth_slot = np.empty(len(truth_groups), np.int64)
    truth_slot[truth_order] = np.arange(len(truth_groups)) - np.searchsorted(sorted_keys, sorted_keys)
    # The candidates (detections with a pair), each with its IoU row over its group's truths.
    candidates, row_of_pair = np.unique(pair_det, return_inverse=True)
    width = int(truth_slot[pair_truth].max()) + 1
    rows = np.full((len(candidates), width), -1.0)
    rows[row_of_pair, truth_slot[pair_truth]] = iou
    groups, group_of_candidate = np.unique(det_groups[candidates], return_inverse=True)
    by_rank = np.lexsort((det_rank[candidates], group_of_candidate))
    sorted_groups = group_of_candidate[by_rank]
    step = np.empty(len(candidates), np.int64)  # a candidate's place among its group's candidates
    step[by_rank] = np.arange(len(candidates)) - np.searchsorted(sorted_groups, sorted_groups)
    taken = np.zeros((len(groups), len(IOU_THRESHOLDS), width), bool)
    thresholds = IOU_THRESHOLDS[None, :, None]
    order = np.argsort(step, kind="stable")
    bounds = np.searchsorted(step[order], np.arange(int(step.max()) + 2))
    for s in range(int(step.max()) + 1):
        active = order[bounds[s] : bounds[s + 1]]
        group = group_of_candidate[active]
        free = np.where(
            taken[group] | (rows[active][:, None, :] < thresholds), -1.0, rows[active][:, None, :]
        )
        best = width - 1 - free[..., ::-1].argmax(-1)  # the last truth of the highest IoU
        a, t = np.nonzero(free.max(-1) >= 0)
        taken[group[a], t, best[a, t]] = True
        matched[candidates[active[a]], t] = True


def coco_precision(
    true_positives: np.ndarray,
    scores: np.ndarray,
    classes: np.ndarray,
    truth_classes: np.ndarray,
    class_ids: np.ndarray,
    share: tuple[int, int] = (0, 1),
) -> np.ndarray:
    """Accumulates COCO's precision, as the module docstring says.

    Args:
        true_positives: (n, 10) bool per detection that counts (within the detection limit), in image order and
            each image's order: the ``coco_match`` flags.
        scores, classes: (n,) the detections' scores and classes.
        truth_classes: (m,) the classes of every truth.
        class_ids: (K,) the classes evaluated.
        share: (rank, ranks): accumulate only the classes ``class_ids[k]`` with ``k % ranks == rank``; the others
            are left at -inf (COCO evaluates classes independently: ranks can split them).

    Returns:
        (10, 101, K) float64 precision at each IoU threshold and recall threshold, -1 for a class without truths.
    """
    rank, ranks = share
    precision = np.full((len(IOU_THRESHOLDS), len(RECALL_THRESHOLDS), len(class_ids)), -np.inf)
    mine = np.arange(len(class_ids)) % ranks == rank
    precision[:, :, mine] = -1.0
    truths_per_class = {int(c): int(n) for c, n in zip(*np.unique(truth_classes, return_counts=True))}
    kept = np.isin(classes, class_ids[mine]) if ranks > 1 else np.ones(len(classes), bool)
    classes, scores, true_positives = classes[kept], scores[kept], true_positives[kept]
    order = np.lexsort((-scores, classes))  # per class by score; equal scores keep the rows' order (stable)
    classes, true_positives = classes[order], true_positives[order]
    starts = np.searchsorted(classes, class_ids, side="left")
    ends = np.searchsorted(classes, class_ids, side="right")
    for k in np.flatnonzero(mine):
        positives = truths_per_class.get(int(class_ids[k]), 0)
        if not positives:
            continue
        precision[:, :, k] = 0.0
        hits = true_positives[starts[k] : ends[k]]
        if not len(hits):
            continue
        tp = np.cumsum(hits, 0).astype(np.float64)
        fp = np.cumsum(~hits, 0).astype(np.float64)
        recall = tp / positives
        envelope = np.maximum.accumulate((tp / (fp + tp + np.spacing(1)))[::-1], 0)[::-1]
        for t in range(len(IOU_THRESHOLDS)):
            found = np.searchsorted(recall[:, t], RECALL_THRESHOLDS, side="left")
            reached = found < len(hits)
            precision[t, reached, k] = envelope[found[reached], t]
    return precision


def coco_summary(precision: np.ndarray) -> float:
    """Returns the mean of the precision entries that are not -1, as COCO's summarize; -1 if there is none."""
    valid = precision[precision > -1]
    return float(valid.mean()) if valid.size else -1.0
