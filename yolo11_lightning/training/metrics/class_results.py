"""What an evaluation found, class by class: the numbers behind the closing summary and the result pictures.

``DetectionMAP`` keeps, when asked (``keep_evaluation``), an ``Evaluation``: the gathered detections and truths
it scored and COCO's accumulated arrays (``MeanAveragePrecision(extended_summary=True)``). ``class_results``
turns that into ``ClassResults`` on the host, only when somebody draws or prints it (rank 0, at the end):

* per class, the images it appears in and its instances;
* per kind (``box``; ``mask`` for segmentation), COCO's AP50 and AP50-95 per class (the logged mAP is their
  mean over the classes present) and COCO's precision-recall curve at IoU 0.5; and precision, recall and F1
  against the confidence threshold, counted as the reference counts them: each detection is a true positive
  when it matches a truth of its class at IoU 0.5 or more (``reference_ap.match_by_iou``: pairs by decreasing
  IoU, each box once), and precision and recall are counted down the scores and interpolated between them.
  P and R per class are read where the mean F1 over the classes peaks (smoothed), the reference's rule, so the
  table's P and R are the ones the reference prints for the same detections;
* a box confusion matrix as the reference draws it: detections scoring above 0.25 matched to truths at
  IoU above 0.45 whatever their classes (each detection's best truth, then each truth's best detection); a
  missed truth counts in the background row, an unmatched detection in the background column.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor
from torchvision.ops import box_iou

from yolo11_lightning.training.metrics.reference_ap import match_by_iou

CONFIDENCES = np.linspace(0.0, 1.0, 1000)  # the thresholds the curves are drawn at (the reference's grid)
RECALLS = np.linspace(0.0, 1.0, 101)  # COCO's recall levels


@dataclass
class Evaluation:
    """What one ``DetectionMAP.compute`` scored, gathered from every rank, on the host.

    Attributes:
        detections: (n, 7) ``[image, x1, y1, x2, y2, score, class]``, original image pixels, by image (stable).
        truths: (m, 6) ``[image, x1, y1, x2, y2, class]``, original image pixels, by image (stable).
        num_images: images evaluated.
        coco: per kind (``box``, ``mask``) COCO's extended summary: ``precision`` and ``scores`` (T=10 IoUs,
            R=101 recalls, K classes, 4 areas, 3 detection limits), ``classes`` (K,), ``map``, ``map_50``.
        matched: per kind other than ``box`` (whose boxes are here), (n,) bool in ``detections`` order: the
            detection matches a truth of its class at IoU >= 0.5 (``match_at_half``); masks are matched where
            they are decoded (``SegmentationMAP``).
    """

    detections: Tensor
    truths: Tensor
    num_images: int
    coco: dict[str, dict[str, Tensor]]
    matched: dict[str, np.ndarray] = field(default_factory=dict)

    KEPT = ("precision", "scores", "classes", "map", "map_50")  # what ``coco`` keeps of COCO's result


@dataclass
class KindResults:
    """Per-class results of one kind of prediction (boxes or masks); K classes, C = ``len(CONFIDENCES)``.

    Classes without truths hold NaN in every per-class array."""

    map50_95: float  # COCO's, as logged
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
        """Mean over the classes that have truths (NaN when none has)."""
        present = values[~np.isnan(values)]
        return float(present.mean()) if len(present) else float("nan")


@dataclass
class ClassResults:
    """Everything the summary and the pictures show of one evaluation (module docstring)."""

    names: list[str]
    images: np.ndarray  # (K,) images with at least one truth of the class
    instances: np.ndarray  # (K,) truths of the class
    num_images: int
    kinds: dict[str, KindResults]  # "box", and "mask" for segmentation
    confusion: np.ndarray  # (K + 1, K + 1) counts [predicted, true]; index K is the background


def class_results(evaluation: Evaluation, names: Sequence[str]) -> ClassResults:
    """The per-class results of ``evaluation`` for the classes ``names`` (module docstring)."""
    k = len(names)
    truths = evaluation.truths.double().cpu()
    truth_classes = truths[:, 5].long().numpy()
    instances = np.bincount(truth_classes, minlength=k)[:k]
    pairs = np.unique(np.stack([truths[:, 0].numpy(), truth_classes], 1), axis=0) if len(truths) else []
    images = np.bincount(np.asarray(pairs, np.int64)[:, 1], minlength=k)[:k] if len(pairs) else np.zeros(k)
    detections = evaluation.detections.double().cpu()
    scores, det_classes = detections[:, 5].numpy(), detections[:, 6].long().numpy()
    kinds = {}
    for kind, coco in evaluation.coco.items():
        matched = evaluation.matched.get(kind) if kind != "box" else _box_matches(detections, truths)
        counted = _counted(matched, scores, det_classes, instances)
        kinds[kind] = _kind_results(coco, k, *counted)
    return ClassResults(
        names=list(names),
        images=images.astype(np.int64),
        instances=instances.astype(np.int64),
        num_images=evaluation.num_images,
        kinds=kinds,
        confusion=confusion_matrix(evaluation.detections, evaluation.truths, k),
    )


def _box_matches(detections: Tensor, truths: Tensor) -> np.ndarray:
    """(n,) bool: each detection of ``detections`` (by image) matches a truth box of its class at IoU >= 0.5."""
    det_by_image, truth_by_image = _split_by_image(detections), _split_by_image(truths)
    parts = []
    for image, det in det_by_image.items():
        truth = truth_by_image.get(image, truths[:0])
        iou = box_iou(truth[:, 1:5], det[:, 1:5]).numpy()
        parts.append(match_at_half(iou, truth[:, 5].numpy(), det[:, 6].numpy()))
    return np.concatenate(parts) if parts else np.zeros(0, bool)


def match_at_half(iou: np.ndarray, truth_classes: np.ndarray, detection_classes: np.ndarray) -> np.ndarray:
    """(m truths, n detections) IoU of one image -> (n,) bool, true positives at IoU 0.5 (module docstring)."""
    if not iou.size:
        return np.zeros(iou.shape[1], bool)
    return match_by_iou(iou, truth_classes[:, None] == detection_classes[None, :])[:, 0]


def _counted(
    matched: np.ndarray | None, scores: np.ndarray, classes: np.ndarray, instances: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per class (K, C) precision and recall against ``CONFIDENCES`` from per-detection matches, as the
    reference computes them: the cumulative counts in decreasing score order, interpolated linearly between
    the detections' scores (recall 0 and precision 1 above the highest). A class with truths but no detection
    has zeros; a class without truths, NaN."""
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
    """``values`` smoothed by a centred moving average over ``fraction`` of their length (edges repeated)."""
    width = round(len(values) * fraction * 2) // 2 + 1  # odd
    padded = np.concatenate((np.full(width // 2, values[0]), values, np.full(width // 2, values[-1])))
    return np.convolve(padded, np.ones(width) / width, mode="valid")


def _kind_results(coco: dict[str, Tensor], k: int, precision: np.ndarray, recall: np.ndarray) -> KindResults:
    """One kind's results: COCO's per-class AP and PR curve (area "all", the largest detection limit) and the
    counted ``precision`` and ``recall`` (K, C)."""
    coco_precision = coco["precision"][..., 0, -1].double().cpu().numpy()  # (T, R, Kc)
    classes = coco["classes"].reshape(-1).long().cpu().numpy()
    out = {
        name: np.full(size, np.nan) for name, size in (("ap50_95", k), ("ap50", k), ("pr", (k, len(RECALLS))))
    }
    for column, cls in enumerate(classes):
        if not 0 <= cls < k or coco_precision[0, 0, column] < 0:  # no truths of this class: COCO writes -1
            continue
        valid = np.clip(coco_precision[:, :, column], 0, None)
        out["ap50_95"][cls] = valid.mean()
        out["ap50"][cls] = valid[0].mean()
        out["pr"][cls] = valid[0]
    f1 = 2 * precision * recall / (precision + recall + 1e-16)
    present = ~np.isnan(precision[:, 0])
    mean_f1 = f1[present].mean(0) if present.any() else np.zeros(len(CONFIDENCES))
    best = int(np.argmax(_box_filter(mean_f1)))  # the reference's rule: the peak of the smoothed mean F1
    return KindResults(
        map50_95=float(coco["map"]),
        map50=float(coco["map_50"]),
        ap50_95=out["ap50_95"],
        ap50=out["ap50"],
        pr_curve=out["pr"],
        precision=precision,
        recall=recall,
        f1=f1,
        best_confidence=float(CONFIDENCES[best]),
        p=precision[:, best],
        r=recall[:, best],
    )


def confusion_matrix(
    detections: Tensor, truths: Tensor, num_classes: int, min_score: float = 0.25, min_iou: float = 0.45
) -> np.ndarray:
    """(K + 1, K + 1) int64 counts ``[predicted, true]``, index K the background (module docstring).

    ``detections`` (n, 7) ``[image, x1, y1, x2, y2, score, class]`` and ``truths`` (m, 6)
    ``[image, x1, y1, x2, y2, class]`` of any number of images, in the same pixels."""
    k = num_classes
    matrix = np.zeros((k + 1, k + 1), np.int64)
    detections = detections.double().cpu()
    detections = detections[detections[:, 5] > min_score]
    truths = truths.double().cpu()
    det_by_image = _split_by_image(detections)
    truth_by_image = _split_by_image(truths)
    for image in set(det_by_image) | set(truth_by_image):
        det = det_by_image.get(image, detections[:0])
        truth = truth_by_image.get(image, truths[:0])
        det_cls = det[:, 6].long().clamp(0, k).numpy()
        truth_cls = truth[:, 5].long().clamp(0, k).numpy()
        truth_of_det = np.full(len(det), -1)
        if len(det) and len(truth):
            iou = box_iou(truth[:, 1:5], det[:, 1:5]).numpy()
            t, d = np.nonzero(iou > min_iou)
            pairs = np.stack([t, d, iou[t, d]], 1)
            pairs = pairs[np.argsort(-pairs[:, 2], kind="stable")]
            pairs = pairs[np.unique(pairs[:, 1], return_index=True)[1]]  # each detection's best truth
            pairs = pairs[np.argsort(-pairs[:, 2], kind="stable")]
            pairs = pairs[np.unique(pairs[:, 0], return_index=True)[1]]  # then each truth's best detection
            truth_of_det[pairs[:, 1].astype(int)] = pairs[:, 0].astype(int)
        found = truth_of_det >= 0
        np.add.at(matrix, (det_cls[found], truth_cls[truth_of_det[found]]), 1)
        missed = np.ones(len(truth), bool)
        missed[truth_of_det[found]] = False
        np.add.at(matrix, (np.full(missed.sum(), k), truth_cls[missed]), 1)
        np.add.at(matrix, (det_cls[~found], np.full((~found).sum(), k)), 1)
    return matrix


def _split_by_image(rows: Tensor) -> dict[int, Tensor]:
    """Rows ``[image, ...]`` grouped by their image id."""
    if not len(rows):
        return {}
    order = torch.argsort(rows[:, 0], stable=True)
    rows = rows[order]
    ids, counts = torch.unique_consecutive(rows[:, 0], return_counts=True)
    return {int(i): part for i, part in zip(ids.tolist(), torch.split(rows, counts.tolist()))}
