"""What an evaluation found, class by class: the numbers behind the closing summary and the result pictures.

A task's metric (``DetectionMAP`` and its subclasses) keeps, when asked (``keep_evaluation``), an ``Evaluation``:
every detection's score and class, every truth's image and class, per kind (``box``; ``mask``, ``pose``) the
per-class AP and precision-recall curve its rules gave and each detection's match at IoU 0.5, and the confusion
matrix's pairs. ``class_results`` turns that into ``ClassResults`` on the host, only when somebody draws or
prints it (rank 0, at the end):

* per class, the images it appears in and its instances;
* per kind, the AP50 and AP50-95 per class (the logged mAP is their mean over the classes present) and the
  precision-recall curve at IoU 0.5; and precision, recall and F1 against the confidence threshold, counted as the
  reference counts them: each detection is a true positive when it matches a truth of its class at IoU 0.5 or
  more by the reference's rule (``reference_ap.match_pairs``: pairs by decreasing IoU, each box once), and
  precision and recall are counted down the scores and interpolated between them. P and R per class are read
  where the mean F1 over the classes peaks (smoothed), the reference's rule, so the table's P and R are the ones
  the reference prints for the same detections;
* a confusion matrix as the reference draws it: detections scoring above 0.25 matched to truths at IoU above
  0.45 whatever their classes (each detection's best truth, then each truth's best detection); a missed truth
  counts in the background row, an unmatched detection in the background column.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor
from torchvision.ops import box_iou

CONFIDENCES = np.linspace(0.0, 1.0, 1000)  # the thresholds the curves are drawn at (the reference's grid)
RECALLS = np.linspace(0.0, 1.0, 101)  # COCO's recall levels
CONFUSION_MIN_SCORE = 0.25  # the confusion matrix counts the detections scoring above this
CONFUSION_MIN_IOU = 0.45  # and matches them to truths at an IoU above this


@dataclass
class KindEvaluation:
    """What one kind of prediction scored: its mAPs, per class with truths (C classes) the AP at IoU
    0.50:0.05:0.95 and the precision-recall curve at IoU 0.5, and per detection its match at IoU 0.5."""

    map50_95: float
    map50: float
    map75: float
    classes: np.ndarray  # (C,) int64
    ap: np.ndarray  # (C, 10)
    pr_curve: np.ndarray  # (C, 101) precision at ``RECALLS``
    matched: np.ndarray | None = None  # (n,) bool, in ``Evaluation`` order


@dataclass
class Evaluation:
    """What one metric compute scored, gathered from every rank, on the host; n detections and m truths, both in
    dataset-index order.

    Attributes:
        scores: (n,) float64 detection scores.
        classes: (n,) int64 detection classes.
        truth_images: (m,) the dataset index of each truth's image.
        truth_classes: (m,) int64.
        num_images: images evaluated.
        kinds: per kind shown (``box``, ``mask``, ``pose``) what it scored.
        confusion: (k, 2) int64 ``[predicted class, true class]`` pairs, -1 for the background
            (``confusion_pairs``).
    """

    scores: np.ndarray
    classes: np.ndarray
    truth_images: np.ndarray
    truth_classes: np.ndarray
    num_images: int
    kinds: dict[str, KindEvaluation]
    confusion: np.ndarray


@dataclass
class KindResults:
    """Per-class results of one kind of prediction (boxes, masks, keypoints); K classes, C = ``len(CONFIDENCES)``.

    Classes without truths hold NaN in every per-class array."""

    map50_95: float  # as logged
    map50: float
    ap50_95: np.ndarray  # (K,)
    ap50: np.ndarray  # (K,)
    pr_curve: np.ndarray  # (K, 101) precision at ``RECALLS``, IoU 0.5
    precision: np.ndarray  # (K, C) against ``CONFIDENCES``
    recall: np.ndarray  # (K, C)
    f1: np.ndarray  # (K, C)
    best_confidence: float  # where the mean F1 over the classes present peaks (smoothed, as the reference)
    p: np.ndarray  # (K,) precision at ``best_confidence``
    r: np.ndarray  # (K,) recall at ``best_confidence``

    def mean(self, values: np.ndarray) -> float:
        """Returns the mean over the classes that have truths, NaN when none has."""
        present = values[~np.isnan(values)]
        return float(present.mean()) if len(present) else float("nan")


@dataclass
class ClassResults:
    """Everything the summary and the pictures show of one evaluation; see the module docstring."""

    names: list[str]
    images: np.ndarray  # (K,) images with at least one truth of the class
    instances: np.ndarray  # (K,) truths of the class
    num_images: int
    kinds: dict[str, KindResults]  # "box", and "mask" for segmentation, "pose" for pose
    confusion: np.ndarray  # (K + 1, K + 1) counts [predicted, true]; index K is the background
    # classification: per class the share of its images whose top-1 (top-5) classes hold the label, and overall
    accuracy: dict[str, tuple[float, np.ndarray]] = field(
        default_factory=dict
    )  # "top1"/"top5" -> (all, (K,))


def class_results(evaluation: Evaluation, names: Sequence[str]) -> ClassResults:
    """Returns the per-class results of an evaluation for the given class names; see the module docstring."""
    k = len(names)
    truth_classes = evaluation.truth_classes.astype(np.int64)
    inside = (truth_classes >= 0) & (truth_classes < k)
    instances = np.bincount(truth_classes[inside], minlength=k)[:k]
    pairs = np.unique(np.stack([evaluation.truth_images[inside], truth_classes[inside]], 1), axis=0)
    images = np.bincount(pairs[:, 1].astype(np.int64), minlength=k)[:k] if len(pairs) else np.zeros(k)
    kinds = {}
    for kind, scored in evaluation.kinds.items():
        counted = _counted(scored.matched, evaluation.scores, evaluation.classes, instances)
        kinds[kind] = _kind_results(scored, k, *counted)
    return ClassResults(
        names=list(names),
        images=images.astype(np.int64),
        instances=instances.astype(np.int64),
        num_images=evaluation.num_images,
        kinds=kinds,
        confusion=_confusion_counts(evaluation.confusion, k),
    )


def _counted(
    matched: np.ndarray | None, scores: np.ndarray, classes: np.ndarray, instances: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Counts per-class (K, C) precision and recall at each of ``CONFIDENCES`` from per-detection matches.

    As the reference computes them: the cumulative counts in decreasing score order, interpolated linearly
    between the detections' scores (recall 0 and precision 1 above the highest). A class with truths but no
    detection has zeros; a class without truths, NaN.
    """
    k = len(instances)
    precision = np.full((k, len(CONFIDENCES)), np.nan)
    recall = np.full((k, len(CONFIDENCES)), np.nan)
    if matched is None:
        return precision, recall
    order = np.argsort(-scores)  # numpy's default sort, as the reference's: equal scores keep its order
    matched, scores, classes = matched[order].astype(np.float64), scores[order], classes[order]
    for c in np.flatnonzero(instances > 0):
        mine = classes == c
        precision[c] = recall[c] = 0.0
        if not mine.any():
            continue
        true_pos = np.cumsum(matched[mine])
        false_pos = np.cumsum(1 - matched[mine])
        recall[c] = np.interp(-CONFIDENCES, -scores[mine], true_pos / instances[c], left=0)
        precision[c] = np.interp(-CONFIDENCES, -scores[mine], true_pos / (true_pos + false_pos), left=1)
    return precision, recall


def _box_filter(values: np.ndarray, fraction: float = 0.1) -> np.ndarray:
    """Smooths values by a centred moving average over ``fraction`` of their length, edges repeated."""
    width = round(len(values) * fraction * 2) // 2 + 1  # odd
    padded = np.concatenate((np.full(width // 2, values[0]), values, np.full(width // 2, values[-1])))
    return np.convolve(padded, np.ones(width) / width, mode="valid")


def _kind_results(scored: KindEvaluation, k: int, precision: np.ndarray, recall: np.ndarray) -> KindResults:
    """Returns one kind's results: per-class AP and PR curve and the counted (K, C) precision and recall."""
    ap50_95, ap50, pr = np.full(k, np.nan), np.full(k, np.nan), np.full((k, len(RECALLS)), np.nan)
    for row, cls in enumerate(scored.classes.tolist()):
        if 0 <= cls < k:
            ap50_95[cls], ap50[cls], pr[cls] = scored.ap[row].mean(), scored.ap[row, 0], scored.pr_curve[row]
    f1 = 2 * precision * recall / (precision + recall + 1e-16)
    present = ~np.isnan(precision[:, 0])
    mean_f1 = f1[present].mean(0) if present.any() else np.zeros(len(CONFIDENCES))
    best = int(np.argmax(_box_filter(mean_f1)))  # the reference's rule: the peak of the smoothed mean F1
    return KindResults(
        map50_95=scored.map50_95,
        map50=scored.map50,
        ap50_95=ap50_95,
        ap50=ap50,
        pr_curve=pr,
        precision=precision,
        recall=recall,
        f1=f1,
        best_confidence=float(CONFIDENCES[best]),
        p=precision[:, best],
        r=recall[:, best],
    )


def confusion_matrix(detections: Tensor, truths: Tensor, num_classes: int) -> np.ndarray:
    """Counts [predicted, true] pairs into a (K + 1, K + 1) int64 matrix, index K the background.

    The module docstring tells which pairs count.

    ``detections`` (n, 7) ``[image, x1, y1, x2, y2, score, class]`` and ``truths`` (m, 6)
    ``[image, x1, y1, x2, y2, class]`` of any number of images, in the same pixels."""
    detections, truths = detections.double().cpu(), truths.double().cpu()
    confident = torch.nonzero(detections[:, 5] > CONFUSION_MIN_SCORE)[:, 0]
    same_image = truths[:, None, 0] == detections[None, confident, 0]
    pair_truth, pair_det = (index.numpy() for index in torch.nonzero(same_image, as_tuple=True))
    pair_det = confident.numpy()[pair_det]
    iou = box_iou(truths[:, 1:5], detections[:, 1:5]).numpy()[pair_truth, pair_det]
    classes, truth_classes = detections[:, 6].long().numpy(), truths[:, 5].long().numpy()
    pairs = confusion_pairs(iou, pair_det, pair_truth, confident.numpy(), classes, truth_classes)
    return _confusion_counts(pairs, num_classes)


def confusion_pairs(
    iou: np.ndarray,
    pair_det: np.ndarray,
    pair_truth: np.ndarray,
    confident: np.ndarray,
    classes: np.ndarray,
    truth_classes: np.ndarray,
) -> np.ndarray:
    """Returns the confusion matrix's counts as pairs for any number of images at once.

    The module docstring tells which pairs count.

    Args:
        iou: (p,) IoU of every (detection, truth) pair of the same image, whatever the classes, listed by truth
            then detection, over the detections scoring above ``CONFUSION_MIN_SCORE`` only.
        pair_det, pair_truth: (p,) indices into ``classes`` (n,) and ``truth_classes`` (m,).
        confident: the indices of the detections scoring above ``CONFUSION_MIN_SCORE``.

    Returns:
        (k, 2) int64 ``[predicted class, true class]``, -1 for the background; every truth and every detection
        in the pairs' images that scores above ``CONFUSION_MIN_SCORE`` counts once.
    """
    close = iou > CONFUSION_MIN_IOU
    pairs = np.stack([pair_truth[close], pair_det[close], iou[close]], 1)
    pairs = pairs[np.argsort(-pairs[:, 2], kind="stable")]
    pairs = pairs[np.unique(pairs[:, 1], return_index=True)[1]]  # each detection's best truth
    pairs = pairs[np.argsort(-pairs[:, 2], kind="stable")]
    pairs = pairs[np.unique(pairs[:, 0], return_index=True)[1]]  # then each truth's best detection
    truth, det = pairs[:, 0].astype(np.int64), pairs[:, 1].astype(np.int64)
    missed = np.ones(len(truth_classes), bool)
    missed[truth] = False
    alarms = np.zeros(len(classes), bool)
    alarms[confident] = True
    alarms[det] = False  # the unmatched confident detections: false alarms
    return np.concatenate(
        (
            np.stack((classes[det], truth_classes[truth]), 1),
            np.stack((np.full(missed.sum(), -1), truth_classes[missed]), 1),
            np.stack((classes[alarms], np.full(alarms.sum(), -1)), 1),
        )
    ).astype(np.int64)


def _confusion_counts(pairs: np.ndarray, num_classes: int) -> np.ndarray:
    """Counts (k, 2) [predicted, true] pairs into a (K + 1, K + 1) matrix, index K the background.

    In the pairs -1 is the background, and so is a class outside 0..K-1.
    """
    k = num_classes
    matrix = np.zeros((k + 1, k + 1), np.int64)
    pairs = np.where((pairs >= 0) & (pairs < k), pairs, k).astype(np.int64)
    np.add.at(matrix, (pairs[:, 0], pairs[:, 1]), 1)
    return matrix
