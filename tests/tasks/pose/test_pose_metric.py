"""Pose mAP (``tasks.pose.metric.PoseMAP``): equal to the oracle validator's keypoint mAP on the same detections
(its ``kpt_iou``, ``match_predictions`` and ``ap_per_class``, fed identical inputs), and equal on 2 ranks (unpadded
shards) and on 1."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from torch import Tensor

from yolo11_lightning.tasks.pose.loss import COCO_SIGMAS, keypoint_sigmas
from yolo11_lightning.tasks.pose.metric import PoseMAP

os.environ.setdefault("YOLO_OFFLINE", "1")

SIZE = 64


def _batches(kpt_shape: tuple[int, int], images: int, start: int = 0, per_batch: int = 2, seed: int = 0):
    """(batch, detections (n, 6) input pixels, detected keypoints (n, K, D)) per batch: truths with keypoints
    (some unlabelled), detections near them (jittered boxes and keypoints, some of another class) plus clutter."""
    k, d = kpt_shape
    out = []
    for first in range(start, start + images, per_batch):
        count = min(per_batch, start + images - first)
        g = torch.Generator().manual_seed(seed * 1000 + first)
        targets, truth_points, detections, points = [], [], [], []
        for i in range(count):
            m = int(torch.randint(0, 4, (1,), generator=g))
            centre = torch.rand(m, 2, generator=g) * 40 + 12
            size = torch.rand(m, 2, generator=g) * 16 + 6
            classes = torch.randint(0, 3, (m,), generator=g).float()
            kp = centre[:, None] + (torch.rand(m, k, 2, generator=g) - 0.5) * size[:, None]
            vis = torch.randint(0, 3, (m, k, 1), generator=g).float()
            targets.append(
                torch.cat((torch.full((m, 1), float(i)), classes[:, None], centre / SIZE, size / SIZE), 1)
            )
            truth_points.append(torch.cat((kp / SIZE, vis), -1))
            n_extra = int(torch.randint(0, 3, (1,), generator=g))
            jitter = (torch.rand(m, k, 2, generator=g) - 0.5) * size[:, None] * (0.1 if k == 17 else 0.4)
            det_kp = kp + jitter
            clutter = torch.rand(n_extra, k, 2, generator=g) * SIZE
            det_kp = torch.cat((det_kp, clutter))
            boxes = torch.cat((centre - size / 2, centre + size / 2), 1) + torch.randn(m, 4, generator=g)
            c = torch.rand(n_extra, 2, generator=g) * SIZE
            boxes = torch.cat((boxes, torch.cat((c, c + 10), 1)))
            det_cls = torch.cat((classes, torch.randint(0, 3, (n_extra,), generator=g).float()))
            flip = torch.rand(len(det_cls), generator=g) < 0.15
            det_cls[flip] = (det_cls[flip] + 1) % 3
            scores = torch.rand(len(det_cls), generator=g)
            detections.append(torch.cat((boxes, scores[:, None], det_cls[:, None]), 1))
            if d == 3:
                det_kp = torch.cat((det_kp, torch.rand(len(det_kp), k, 1, generator=g)), -1)
            points.append(det_kp)
        batch = {
            "images": torch.zeros(count, 3, SIZE, SIZE, dtype=torch.uint8),
            "targets": torch.cat(targets),
            "keypoints": torch.cat(truth_points),
            "indices": torch.arange(first, first + count),
            "scales": torch.ones(count),
            "pads": torch.zeros(count, 2),
            "orig_sizes": torch.full((count, 2), SIZE),
        }
        out.append((batch, detections, points))
    return out


def _fill(metric: PoseMAP, batches) -> None:
    for batch, detections, points in batches:
        metric.update(detections, batch, points)


def _oracle_pose_map(batches, kpt_shape: tuple[int, int]) -> tuple[float, float]:
    from ultralytics.models.yolo.pose import PoseValidator
    from ultralytics.utils import ops
    from ultralytics.utils.metrics import ap_per_class, kpt_iou

    validator = PoseValidator()
    validator.iouv = torch.linspace(0.5, 0.95, 10)
    sigma = np.array(COCO_SIGMAS) if tuple(kpt_shape) == (17, 3) else np.ones(kpt_shape[0]) / kpt_shape[0]
    tps, confs, classes, truth_classes = [], [], [], []
    for batch, detections, points in batches:
        targets = batch["targets"]
        for i, (det, kp) in enumerate(zip(detections, points)):
            own = targets[:, 0] == i
            gt_cls = targets[own, 1]
            gt_boxes = ops.xywh2xyxy(targets[own, 2:6] * SIZE)
            gt_kp = batch["keypoints"][own].clone()
            gt_kp[..., :2] *= SIZE
            truth_classes.append(gt_cls.numpy())
            if len(det) == 0:
                continue
            if len(gt_cls) == 0:
                tp = np.zeros((len(det), 10), bool)
            else:
                area = ops.xyxy2xywh(gt_boxes)[:, 2:].prod(1) * 0.53
                iou = kpt_iou(gt_kp, kp, sigma=sigma, area=area)
                tp = validator.match_predictions(det[:, 5], gt_cls, iou).cpu().numpy()
            tps.append(tp)
            confs.append(det[:, 4].numpy())
            classes.append(det[:, 5].numpy())
    results = ap_per_class(
        np.concatenate(tps), np.concatenate(confs), np.concatenate(classes), np.concatenate(truth_classes)
    )
    ap = results[5]
    return float(ap[:, 0].mean()), float(ap.mean())


@pytest.mark.parametrize("kpt_shape", [(5, 3), (4, 2), (17, 3)])
def test_pose_map_equals_the_oracle_validator(kpt_shape: tuple[int, int]) -> None:
    batches = _batches(kpt_shape, 9, seed=sum(kpt_shape))
    metric = PoseMAP()
    _fill(metric, batches)
    result = metric.compute()
    map50, map50_95 = _oracle_pose_map(batches, kpt_shape)
    assert 0.05 < map50_95 < 0.95  # informative: neither all nor nothing matched
    assert abs(float(result["pose_mAP50-95"]) - map50_95) < 1e-9
    assert abs(float(result["pose_mAP50"]) - map50) < 1e-9
    fitness = 0.1 * result["mAP50"] + 0.9 * result["mAP50-95"] + 0.1 * map50 + 0.9 * map50_95
    assert abs(float(result["fitness"]) - float(fitness)) < 1e-6


def test_keypoint_sigmas_are_the_reference_ones() -> None:
    from ultralytics.utils.metrics import OKS_SIGMA

    np.testing.assert_allclose(keypoint_sigmas((17, 3)), OKS_SIGMA)
    assert keypoint_sigmas((5, 3)) == (0.2,) * 5


def test_distributed_pose_map_equals_single_process_with_unpadded_shards() -> None:
    """Rank 0 holds 4 images, rank 1 holds 3 (unpadded): the gathered states give the single-process value.
    The gather is torchmetrics' ``_sync_dist`` with the collective replaced by its result on rank 0; a real
    2-rank gloo run is the CLI test of ``test_pose_train.py``."""
    single = PoseMAP()
    _fill(single, _batches((5, 3), 7))
    expected = single.compute()
    rank0, rank1 = PoseMAP(), PoseMAP()
    _fill(rank0, _batches((5, 3), 4))
    _fill(rank1, _batches((5, 3), 3, start=4))
    sent: list[Tensor] = []
    rank1._sync_dist(lambda t, group=None: sent.append(t) or [t])
    rank0._sync_dist(lambda t, group=None: [t, sent.pop(0)])
    assert not sent
    gathered = rank0.compute()
    for key in ("mAP50-95", "mAP50", "pose_mAP50-95", "pose_mAP50", "fitness"):
        assert gathered[key] == expected[key], key


def test_an_empty_rank_and_no_detections() -> None:
    metric, empty = PoseMAP(), PoseMAP()
    batches = _batches((5, 3), 2)
    for batch, detections, points in batches:
        metric.update([d[:0] for d in detections], batch, [p[:0] for p in points])
    sent: list[Tensor] = []
    empty._sync_dist(lambda t, group=None: sent.append(t) or [t])
    metric._sync_dist(lambda t, group=None: [t, sent.pop(0)])
    assert float(metric.compute()["pose_mAP50-95"]) == 0.0


def test_the_summary_table_and_pictures_show_the_pose_map() -> None:
    """A kept evaluation carries the keypoints as a kind of their own: the closing table has pose P, R, mAP50 and
    mAP50-95 (the logged value in the ``all`` row), the per-class curves and a box confusion matrix are there."""
    from yolo11_lightning.metrics.class_results import class_results
    from yolo11_lightning.plots.evaluation import confusion_matrix_image
    from yolo11_lightning.training.callbacks.closing_summary import class_rows

    metric = PoseMAP(["person"])
    metric.keep_evaluation = True
    _fill(metric, _batches((17, 3), 6))
    logged = metric.compute()
    results = class_results(metric.evaluation, ["person"])
    assert set(results.kinds) == {"box", "pose"}
    rows = class_rows(results)
    assert rows[0]["pose_mAP50-95"] == pytest.approx(float(logged["pose_mAP50-95"]))
    assert rows[1]["pose_mAP50-95"] == pytest.approx(float(logged["pose_AP/person"]))
    assert 0 < rows[0]["pose_R"] <= 1 and results.confusion.sum() > 0
    assert confusion_matrix_image(results.confusion, ["person"], normalize=True).ndim == 3
