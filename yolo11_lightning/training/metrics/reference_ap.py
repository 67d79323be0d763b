"""The mAP as the reference validator prints it, for comparing with Ultralytics logs (not COCO's).

Two rules differ from COCO evaluation (``evaluation.DetectionMAP``, faster-coco-eval):

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
from torchvision.ops import box_iou

IOU_THRESHOLDS = np.linspace(0.5, 0.95, 10)


def match_by_iou(iou: np.ndarray, same_class: np.ndarray) -> np.ndarray:
    """(m truths, n detections) IoU and class agreement -> (n, 10) bool: detection is a true positive."""
    correct = np.zeros((iou.shape[1], len(IOU_THRESHOLDS)), bool)
    iou = iou * same_class
    for k, threshold in enumerate(IOU_THRESHOLDS):
        truth, det = np.nonzero(iou >= threshold)
        if not len(det):
            continue
        best_first = np.argsort(-iou[truth, det], kind="stable")
        truth, det = truth[best_first], det[best_first]
        _, first = np.unique(det, return_index=True)  # each detection's best truth
        truth, det = truth[first], det[first]
        _, first = np.unique(truth, return_index=True)  # then each truth once
        correct[det[first], k] = True
    return correct


def interpolated_ap(recall: np.ndarray, precision: np.ndarray) -> float:
    """AP of one PR curve (points in decreasing score order) with the reference's interpolation."""
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
    """The reference's ``ap_per_class``: from per-image detections' (n, 10) true-positive flags per IoU threshold,
    their scores and classes, and per-image truth classes -> (classes present in the truths (C,), their AP (C, 10)
    at IoU 0.50:0.05:0.95); a class never detected has AP 0. Ties in score keep the detections' order."""
    present, counts = np.unique(np.concatenate([*truth_classes, np.zeros(0)]), return_counts=True)
    aps = np.zeros((len(present), len(IOU_THRESHOLDS)))
    if not correct or not len(present):
        return present, aps
    tp, conf, cls = np.concatenate(correct), np.concatenate(scores), np.concatenate(classes)
    order = np.argsort(-conf, kind="stable")
    tp, cls = tp[order], cls[order]
    for i, (c, n_truth) in enumerate(zip(present, counts)):
        hits = tp[cls == c].astype(np.float64)
        if not len(hits):
            continue
        cum_tp, cum_fp = hits.cumsum(0), (1 - hits).cumsum(0)
        recall, precision = cum_tp / (n_truth + 1e-16), cum_tp / (cum_tp + cum_fp)
        aps[i] = [interpolated_ap(recall[:, k], precision[:, k]) for k in range(len(IOU_THRESHOLDS))]
    return present, aps


def reference_style_map(detections: list[Tensor], truths: list[Tensor]) -> float:
    """mAP50-95 of per-image (n, 6) ``[x1, y1, x2, y2, score, class]`` detections against (m, 5)
    ``[x1, y1, x2, y2, class]`` truths, in the same pixels, by the reference's rules (module docstring)."""
    correct, scores, classes, truth_classes = [], [], [], []
    for det, truth in zip(detections, truths):
        det, truth = det.double().cpu(), truth.double().cpu()
        truth_classes.append(truth[:, 4].numpy())
        if len(det) == 0:
            continue
        if len(truth):
            iou = box_iou(truth[:, :4], det[:, :4]).numpy()
            same = (truth[:, 4:5] == det[None, :, 5]).numpy()
            correct.append(match_by_iou(iou, same))
        else:
            correct.append(np.zeros((len(det), len(IOU_THRESHOLDS)), bool))
        scores.append(det[:, 4].numpy())
        classes.append(det[:, 5].numpy())
    present, aps = class_average_precisions(correct, scores, classes, truth_classes)
    return float(aps.mean()) if len(present) else 0.0


def as_tensor(value: float) -> Tensor:
    """The value as a float64 scalar tensor (what ``DetectionMAP.compute`` returns)."""
    return torch.tensor(value, dtype=torch.float64)
