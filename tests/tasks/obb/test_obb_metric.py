"""Rotated NMS and OBB mAP against the oracle (``ultralytics``, YOLO_OFFLINE=1): the same detections give the same
survivors and the same mAP50-95 / mAP50 as its OBB validator; unpadded shards on 2 ranks give the 1-rank value."""

from __future__ import annotations

import math
import os
import warnings

import numpy as np
import pytest
import torch
from torch import Tensor

from yolo11_lightning.tasks.obb.metric import ObbMAP
from yolo11_lightning.tasks.obb.nms import rotated_nms

os.environ.setdefault("YOLO_OFFLINE", "1")

HEIGHT, WIDTH, NUM_CLASSES = 64, 96, 3


def _images(count: int, seed: int = 0) -> list[tuple[Tensor, Tensor]]:
    """Per image: (m, 6) truths ``[cx, cy, w, h, r, class]`` and (n, 7) detections ``[cx, cy, w, h, score,
    class, r]`` in input pixels: jittered copies of the truths (some of another class), duplicates, misses and
    false positives, distinct scores."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        m = int(torch.randint(0, 7, (1,), generator=g))
        centre = torch.rand(m, 2, generator=g) * torch.tensor([WIDTH, HEIGHT])
        size = 4 + torch.rand(m, 2, generator=g) * 26
        angle = torch.rand(m, 1, generator=g) * math.pi - math.pi / 2
        classes = torch.randint(0, NUM_CLASSES, (m, 1), generator=g).float()
        truth = torch.cat((centre, size, angle, classes), 1)
        copies = truth.repeat(2, 1)[torch.rand(2 * m, generator=g) < 0.8]
        noise = torch.randn(len(copies), 5, generator=g) * torch.tensor([1.5, 1.5, 2.0, 2.0, 0.15])
        boxes = copies[:, :5] + noise
        boxes[:, 2:4] = boxes[:, 2:4].abs() + 1
        det_classes = torch.where(torch.rand(len(copies), generator=g) < 0.1,
                                  torch.randint(0, NUM_CLASSES, (len(copies),), generator=g).float(), copies[:, 5])  # fmt: skip
        k = int(torch.randint(0, 4, (1,), generator=g))
        false = torch.cat((torch.rand(k, 2, generator=g) * torch.tensor([WIDTH, HEIGHT]),
                           4 + torch.rand(k, 2, generator=g) * 20, torch.rand(k, 1, generator=g)), 1)  # fmt: skip
        boxes = torch.cat((boxes, false))
        det_classes = torch.cat((det_classes, torch.randint(0, NUM_CLASSES, (k,), generator=g).float()))
        scores = torch.rand(len(boxes), generator=g) * 0.9 + 0.05
        det = torch.cat((boxes[:, :4], scores[:, None], det_classes[:, None], boxes[:, 4:5]), 1)
        out.append((truth, det[scores.argsort(descending=True)]))
    return out


def _batch(images: list[tuple[Tensor, Tensor]], start: int) -> dict:
    """A batch of these images as the OBB collate makes it (targets normalised to the input)."""
    rows = []
    for i, (truth, _) in enumerate(images):
        scale = torch.tensor([WIDTH, HEIGHT, WIDTH, HEIGHT])
        rows.append(torch.cat((torch.full((len(truth), 1), float(i)), truth[:, 5:6], truth[:, :4] / scale,
                               truth[:, 4:5]), 1))  # fmt: skip
    return {"images": torch.zeros(len(images), 3, HEIGHT, WIDTH, dtype=torch.uint8),
            "targets": torch.cat(rows) if rows else torch.zeros(0, 7),
            "indices": torch.arange(start, start + len(images))}  # fmt: skip


def _fill(metric: ObbMAP, images: list[tuple[Tensor, Tensor]], start: int = 0, batch_size: int = 3) -> None:
    for b in range(0, len(images), batch_size):
        chunk = images[b : b + batch_size]
        metric.update([det for _, det in chunk], _batch(chunk, start + b))


def _oracle_map(images: list[tuple[Tensor, Tensor]]) -> tuple[float, float]:
    """The oracle's OBB validator: probiou matching (its ``_process_batch``) and ``OBBMetrics``."""
    from ultralytics.models.yolo.obb.val import OBBValidator
    from ultralytics.utils.metrics import OBBMetrics

    validator = OBBValidator.__new__(OBBValidator)  # its matching only: no run folder, no model
    validator.iouv = torch.linspace(0.5, 0.95, 10)
    validator.niou = 10
    metrics = OBBMetrics(names={i: str(i) for i in range(NUM_CLASSES)})
    for truth, det in images:
        preds = {"bboxes": torch.cat((det[:, :4], det[:, 6:7]), 1), "conf": det[:, 4], "cls": det[:, 5]}
        pbatch = {"bboxes": truth[:, :5], "cls": truth[:, 5]}
        cls = pbatch["cls"].numpy()
        metrics.update_stats({**validator._process_batch(preds, pbatch), "target_cls": cls,
                              "target_img": np.unique(cls), "conf": preds["conf"].numpy(),
                              "pred_cls": preds["cls"].numpy()})  # fmt: skip
    metrics.process()
    return float(metrics.box.map), float(metrics.box.map50)


def test_obb_map_equals_the_oracle_validator() -> None:
    images = _images(24)
    ours = ObbMAP([str(i) for i in range(NUM_CLASSES)])
    _fill(ours, images)
    result = ours.compute()
    oracle_map, oracle_map50 = _oracle_map(images)
    assert 0.1 < oracle_map < 0.9
    assert result["mAP50-95"].item() == pytest.approx(oracle_map, abs=1e-9)
    assert result["mAP50"].item() == pytest.approx(oracle_map50, abs=1e-9)


def test_distributed_obb_map_equals_single_process_with_unpadded_shards() -> None:
    """Rank 0 holds 13 images, rank 1 holds 11 (unpadded, one rank without a batch of the other's size): the
    gathered states give the single-process value (torchmetrics' ``_sync_dist``, the collective replaced by its
    result on rank 0; the 2-rank gloo CLI fit is in test_obb_resume.py)."""
    images = _images(24, seed=1)
    single = ObbMAP()
    _fill(single, images)
    expected = single.compute()
    rank0, rank1 = ObbMAP(), ObbMAP()
    _fill(rank0, images[:13])
    _fill(rank1, images[13:], start=13, batch_size=4)
    sent: list[Tensor] = []
    rank1._sync_dist(lambda t, group=None: sent.append(t) or [t])
    rank0._sync_dist(lambda t, group=None: [t, sent.pop(0)])
    assert not sent
    gathered = rank0.compute()
    for key in ("mAP50-95", "mAP50", "mAP75"):
        assert gathered[key] == expected[key], key
    empty = ObbMAP()
    empty._sync_dist(lambda t, group=None: [t, t])  # a rank that saw no batch still sends (0, width) states
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchmetrics: compute before update
        assert empty.compute()["mAP50-95"] == 0


@pytest.mark.parametrize("multi_label", [True, False])
def test_rotated_nms_equals_the_oracle(multi_label: bool) -> None:
    from ultralytics.utils.nms import non_max_suppression

    g = torch.Generator().manual_seed(3)
    anchors = 400
    centre = torch.rand(2, 2, anchors, generator=g) * 60
    size = 5 + torch.rand(2, 2, anchors, generator=g) * 20
    scores = torch.rand(2, NUM_CLASSES, anchors, generator=g) ** 3
    angle = (torch.rand(2, 1, anchors, generator=g) - 0.25) * math.pi
    predictions = torch.cat((centre, size, scores, angle), 1)
    ours = rotated_nms(predictions, 0.05, 0.5, max_detections=60, multi_label=multi_label)
    oracle = non_max_suppression(predictions.clone(), 0.05, 0.5, nc=NUM_CLASSES, multi_label=multi_label,
                                 max_det=60, rotated=True)  # fmt: skip
    for a, b in zip(ours, oracle):
        assert 20 < len(a) <= 60
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_validation_score_threshold_follows_the_task_as_the_oracles_validator_does() -> None:
    """Unset, ``conf_threshold`` is the oracle validator's for the task: 0.01 for OBB, 0.001 otherwise; a value
    given is kept (and stored as given)."""
    from ultralytics.cfg import get_cfg
    from ultralytics.models.yolo.detect import DetectionValidator
    from ultralytics.models.yolo.obb import OBBValidator

    from yolo11_lightning import YOLO11Module

    for task, validator_class in (("obb", OBBValidator), ("detect", DetectionValidator)):
        validator = validator_class(args=get_cfg(overrides={"task": task}))
        module = YOLO11Module(scale="n", num_classes=NUM_CLASSES, task=task, log_images=0)
        assert module.hparams.conf_threshold == validator.args.conf, task
    given = YOLO11Module(scale="n", num_classes=NUM_CLASSES, task="obb", log_images=0, conf_threshold=0.2)
    assert given.hparams.conf_threshold == 0.2


def test_a_kept_obb_evaluation_gives_the_summary_table_and_a_probiou_confusion_matrix() -> None:
    """OBB keeps its evaluation like the box tasks: per-class rows whose ``all`` mAP is the logged one, and a
    confusion matrix matched by probiou (a perfect predictor: the diagonal)."""
    from yolo11_lightning.metrics.class_results import class_results
    from yolo11_lightning.training.callbacks.closing_summary import class_rows

    names = [str(i) for i in range(NUM_CLASSES)]
    metric = ObbMAP(names)
    metric.keep_evaluation = True
    _fill(metric, _images(24))
    logged = metric.compute()
    rows = class_rows(class_results(metric.evaluation, names))
    assert rows[0]["box_mAP50-95"] == pytest.approx(float(logged["mAP50-95"]))
    perfect = ObbMAP(names)
    perfect.keep_evaluation = True
    images = [(truth, torch.cat((truth[:, :4], torch.full((len(truth), 1), 0.9), truth[:, 5:6], truth[:, 4:5]), 1))
              for truth, _ in _images(12, seed=2)]  # fmt: skip
    _fill(perfect, images)
    perfect.compute()
    matrix = class_results(perfect.evaluation, names).confusion
    counts = np.bincount(torch.cat([t[:, 5] for t, _ in images]).long().numpy(), minlength=NUM_CLASSES)
    np.testing.assert_array_equal(matrix, np.diag([*counts, 0]))
