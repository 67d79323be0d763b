"""The mAP as the reference validator computes it: pose (OKS) and OBB (probiou) scores, and box mAP for comparing
with Ultralytics logs (not COCO's).

Two rules differ from COCO evaluation (``metrics.coco``):

- **Matching**: per image and IoU threshold, every (truth, detection) pair of the same class with IoU at
  or above the threshold is a candidate; pairs are taken by decreasing IoU, each truth and each detection
  at most once, whatever the detection's score. COCO goes through the detections by decreasing score and
  gives each the best free truth, and keeps only the 100 best detections per image.
- **Interpolation**: the precision envelope is extended with a point (recall 1, precision 0), sampled by
  linear interpolation at 101 recalls and integrated with the trapezoid rule. COCO takes, at each of the
  101 recalls, the envelope's value at the first point reaching it (a step function) and 0 beyond the
  highest recall reached. The linear ramp from the last point down to (1, 0) adds area COCO does not
  count, so the reference's figure is usually the higher one.

The AP of each class present in the ground truth is averaged over the 10 IoU thresholds 0.50:0.05:0.95,
then over classes.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

IOU_THRESHOLDS = np.linspace(0.5, 0.95, 10)
RECALLS = np.linspace(0.0, 1.0, 101)  # where a class's PR curve is read


def match_by_iou(iou: np.ndarray, same_class: np.ndarray) -> np.ndarray:
    """Matches one image's detections to its truths at IoU 0.50:0.05:0.95, as the reference does.

    Takes the (m truths, n detections) IoU and class agreement and returns (n, 10) bool: the detection is
    a true positive at each threshold.
    """
    truth, det = np.nonzero(same_class)
    return match_pairs(iou[truth, det], det, truth, iou.shape[1])


def match_pairs(iou: np.ndarray, pair_det: np.ndarray, pair_truth: np.ndarray, num_det: int) -> np.ndarray:
    """Matches detections to truths of many images at once, as the reference does.

    Takes the (p,) IoUs of their (detection, truth) pairs of the same image and class, listed by truth then
    detection (truth and detection indices unique over the images), and returns (num_det, 10) bool: the
    detection is a true positive at IoU 0.50:0.05:0.95. Pairs of different images never compete, so this
    equals matching each image alone.
    """
    correct = np.zeros((num_det, len(IOU_THRESHOLDS)), bool)
    for k, threshold in enumerate(IOU_THRESHOLDS):
        candidate = np.flatnonzero(iou >= threshold)
        if not len(candidate):
            continue
        candidate = candidate[np.argsort(-iou[candidate], kind="stable")]
        truth, det = pair_truth[candidate], pair_det[candidate]
        _, first = np.unique(det, return_index=True)  # each detection's best truth
        truth, det = truth[first], det[first]
        _, first = np.unique(truth, return_index=True)  # then each truth once
        correct[det[first], k] = True
    return correct


def interpolated_ap(recall: np.ndarray, precision: np.ndarray) -> float:
    """Returns the AP of one PR curve, points in decreasing score order, by the reference's interpolation."""
    rec = np.concatenate(([0.0], recall, [1.0]))
    pre = np.concatenate(([1.0], precision, [0.0]))
    envelope = np.maximum.accumulate(pre[::-1])[::-1]
    grid = np.linspace(0, 1, 101)
    values = np.interp(grid, rec, envelope)
    return float(((values[1:] + values[:-1]) / 2 * np.diff(grid)).sum())  # trapezoid rule


def class_average_precisions(
    correct: list[np.ndarray],
    scores: list[np.ndarray],
    classes: list[np.ndarray],
    truth_classes: list[np.ndarray],
) -> tuple[np.ndarray, np.ndarray]:
    """Computes per-class AP at IoU 0.50:0.05:0.95 as the reference's ap_per_class does.

    Takes per-image detections' (n, 10) true-positive flags per IoU threshold, their scores and classes,
    and per-image truth classes; returns the classes present in the truths (C,) and their AP (C, 10). A
    class never detected has AP 0. Ties in score keep the detections' order.
    """
    present, aps, _ = precision_curves(
        np.concatenate([*correct, np.zeros((0, len(IOU_THRESHOLDS)), bool)]),
        np.concatenate([*scores, np.zeros(0)]),
        np.concatenate([*classes, np.zeros(0)]),
        np.concatenate([*truth_classes, np.zeros(0)]),
    )
    return present, aps


def precision_curves(
    correct: np.ndarray,
    scores: np.ndarray,
    classes: np.ndarray,
    truth_classes: np.ndarray,
    share: tuple[int, int] = (0, 1),
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Computes class_average_precisions of concatenated arrays and each class's PR curve.

    The curve is the class's precision envelope at IoU 0.5 read at 101 recalls 0..1, the one the reference
    draws. Returns present (C,), AP (C, 10) and curves (C, 101).

    ``share`` (rank, ranks): compute only the present classes ``i`` with ``i % ranks == rank``, the others' rows
    left at -inf (classes are independent: ranks can split them)."""
    rank, ranks = share
    present, counts = np.unique(truth_classes, return_counts=True)
    aps = np.zeros((len(present), len(IOU_THRESHOLDS)))
    curves = np.zeros((len(present), len(RECALLS)))
    mine = np.arange(len(present)) % ranks == rank
    aps[~mine], curves[~mine] = -np.inf, -np.inf
    if not len(correct) or not len(present):
        return present, aps, curves
    order = np.argsort(-scores, kind="stable")
    tp, cls = correct[order], classes[order]
    for i in np.flatnonzero(mine):
        hits = tp[cls == present[i]].astype(np.float64)
        if not len(hits):
            continue
        cum_tp, cum_fp = hits.cumsum(0), (1 - hits).cumsum(0)
        recall, precision = cum_tp / (counts[i] + 1e-16), cum_tp / (cum_tp + cum_fp)
        aps[i] = [interpolated_ap(recall[:, k], precision[:, k]) for k in range(len(IOU_THRESHOLDS))]
        rec = np.concatenate(([0.0], recall[:, 0], [1.0]))
        envelope = np.maximum.accumulate(np.concatenate(([1.0], precision[:, 0], [0.0]))[::-1])[::-1]
        curves[i] = np.interp(RECALLS, rec, envelope)
    return present, aps, curves


def as_tensor(value: float) -> Tensor:
    """Returns the value as a float64 scalar tensor, what DetectionMAP.compute returns."""
    return torch.tensor(value, dtype=torch.float64)
