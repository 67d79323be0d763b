"""Result pictures and the closing summary follow the data: a perfect predictor gives a diagonal confusion matrix
and P = R = mAP = 1 for every class; a class swap, a miss and a false alarm land in the cells they belong to;
the pictures exist, are not blank, reach TensorBoard, and the curves survive a resume."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import cv2
import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from yolo11_lightning.metrics.class_results import CONFIDENCES, Evaluation, class_results, confusion_matrix
from yolo11_lightning.metrics.detection import DetectionMAP
from yolo11_lightning.plots.evaluation import confusion_matrix_image
from yolo11_lightning.training.callbacks.checkpoints import BestCheckpoint
from yolo11_lightning.training.callbacks.closing_summary import ClosingSummary
from yolo11_lightning.training.callbacks.result_pictures import ResultPictures
from yolo11_lightning.training.datamodule import YOLODataModule
from yolo11_lightning.training.module import YOLO11Module

os.environ["YOLO_OFFLINE"] = "1"  # before any import of the reference package

NAMES = ["rectangle", "ellipse", "triangle"]


SIZE = 1000  # the images' side in pixels: no box of these tests reaches it (nothing is clipped)


def _evaluation(truths: torch.Tensor, detections: torch.Tensor, num_images: int) -> Evaluation:
    """Score ``detections`` (n, 7) ``[image, x1, y1, x2, y2, score, class]`` against ``truths`` (m, 6)
    ``[image, x1, y1, x2, y2, class]`` with ``DetectionMAP``, one batch of 4 images at a time, and return what it
    kept."""
    metric = DetectionMAP(NAMES)
    metric.keep_evaluation = True
    for start in range(0, num_images, 4):
        images = range(start, min(start + 4, num_images))
        det = [detections[detections[:, 0] == i][:, 1:].float() for i in images]
        rows = []
        for local, i in enumerate(images):
            t = truths[truths[:, 0] == i]
            cxcywh = torch.cat(((t[:, 1:3] + t[:, 3:5]) / 2, t[:, 3:5] - t[:, 1:3]), 1) / SIZE
            rows.append(torch.cat((torch.full((len(t), 1), float(local)), t[:, 5:6], cxcywh), 1))
        batch = {
            "images": torch.zeros(1, 1, 1, 1, dtype=torch.uint8).expand(len(images), 3, SIZE, SIZE),
            "targets": torch.cat(rows).float(),
            "indices": torch.tensor(list(images)),
            "scales": torch.ones(len(images)),
            "pads": torch.zeros(len(images), 2),
            "orig_sizes": torch.full((len(images), 2), SIZE),
        }
        metric.update(det, batch)
    metric.compute()
    assert metric.evaluation is not None
    return metric.evaluation


def _random_truths(generator: torch.Generator, images: int) -> torch.Tensor:
    """(m, 6) ``[image, x1, y1, x2, y2, class]``, 1-4 boxes per image, classes 0 and 1 only (2 absent)."""
    rows = []
    for image in range(images):
        n = int(torch.randint(1, 5, (1,), generator=generator))
        xy = torch.rand(n, 2, generator=generator) * 200
        wh = torch.rand(n, 2, generator=generator) * 40 + 10
        cls = torch.randint(0, 2, (n, 1), generator=generator).double()
        rows.append(torch.cat([torch.full((n, 1), float(image)), xy, xy + wh, cls], 1))
    return torch.cat(rows)


def _as_detections(truths: torch.Tensor, score: float = 0.9) -> torch.Tensor:
    return torch.cat(
        [truths[:, :5], torch.full((len(truths), 1), score, dtype=truths.dtype), truths[:, 5:]], 1
    )


def test_a_perfect_predictor_is_diagonal_and_scores_one() -> None:
    truths = _random_truths(torch.Generator().manual_seed(0), images=12)
    results = class_results(_evaluation(truths, _as_detections(truths), 12), NAMES)
    counts = np.bincount(truths[:, 5].long().numpy(), minlength=3)
    assert results.instances.tolist() == counts.tolist()
    assert results.images[2] == 0 and results.num_images == 12
    expected = np.zeros((4, 4), np.int64)
    expected[[0, 1], [0, 1]] = counts[:2]
    np.testing.assert_array_equal(results.confusion, expected)
    box = results.kinds["box"]
    np.testing.assert_allclose(box.p[:2], 1.0)
    np.testing.assert_allclose(box.r[:2], 1.0)
    np.testing.assert_allclose(box.ap50_95[:2], 1.0)
    assert np.isnan(box.ap50[2]) and np.isnan(box.p[2])  # a class without truths has no score
    assert box.map50_95 == pytest.approx(1.0) and box.f1[:2, box.best_confidence == CONFIDENCES].min() == 1
    # A model that finds nothing: P = R = 0 (not a precision of 1 for keeping nothing).
    none = class_results(_evaluation(truths, _as_detections(truths)[:0], 12), NAMES).kinds["box"]
    assert (none.p[:2] == 0).all() and (none.r[:2] == 0).all()
    misses = _as_detections(truths)
    misses[:, 1:5] += 500  # every detection far from every truth
    wrong = class_results(_evaluation(truths, misses, 12), NAMES).kinds["box"]
    assert (wrong.p[:2] == 0).all() and (wrong.r[:2] == 0).all() and wrong.map50_95 == 0
    # Above the detections' score nothing is found.
    assert (box.recall[:2, CONFIDENCES > 0.9] == 0).all() and (box.recall[:2, CONFIDENCES < 0.899] == 1).all()


def test_swaps_misses_and_false_alarms_land_in_their_cells() -> None:
    truths = torch.tensor(
        [[0, 0, 0, 10, 10, 0], [0, 50, 50, 70, 70, 1], [1, 0, 0, 30, 30, 1], [1, 40, 40, 60, 60, 0]],
        dtype=torch.float64,
    )
    detections = torch.tensor(
        [
            [0, 0, 0, 10, 10, 0.8, 1],  # truth class 0 predicted as 1
            [0, 50, 50, 70, 71, 0.9, 1],  # right
            [1, 100, 100, 120, 120, 0.7, 2],  # false alarm of class 2
            [1, 40, 40, 60, 60, 0.1, 0],  # below the 0.25 confidence: the truth counts as missed
        ],
        dtype=torch.float64,
    )
    matrix = confusion_matrix(detections, truths, 3)
    expected = np.zeros((4, 4), np.int64)
    expected[1, 0] = 1  # predicted 1, true 0
    expected[1, 1] = 1
    expected[3, 1] = 1  # truth of class 1 in image 1 not found: background row
    expected[3, 0] = 1  # the low-score detection does not count
    expected[2, 3] = 1  # false alarm: background column
    np.testing.assert_array_equal(matrix, expected)


def test_curves_follow_precision_and_recall() -> None:
    """Part of the truths found at score 0.8, as many false alarms at 0.3: from 0.3 to 0.8 the recall is the found
    share, nothing is found above 0.8, and the precision falls from 1 at 0.8 to 0.5 at 0.3 and below."""
    truths = _random_truths(torch.Generator().manual_seed(1), images=20)
    found = _as_detections(truths[::2], score=0.8)
    alarms = found.clone()
    alarms[:, 1:5] += 500  # far from any truth
    alarms[:, 5] = 0.3
    box = class_results(_evaluation(truths, torch.cat([found, alarms]), 20), NAMES).kinds["box"]
    between = (CONFIDENCES > 0.301) & (CONFIDENCES < 0.799)
    for c in (0, 1):
        share = float((truths[::2, 5] == c).sum() / (truths[:, 5] == c).sum())
        np.testing.assert_allclose(box.recall[c, between | (CONFIDENCES < 0.3)], share, atol=1e-6)
        assert (box.recall[c, CONFIDENCES > 0.801] == 0).all()
        np.testing.assert_allclose(box.precision[c, CONFIDENCES < 0.299], 0.5, atol=1e-6)
        assert (box.precision[c, CONFIDENCES > 0.801] == 1).all()
        assert np.all(np.diff(box.precision[c, between]) > 0)
    assert np.all(np.diff(box.recall[:2], axis=1) <= 1e-12)  # recall never grows with the threshold


def _noisy_detections(truths: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Each truth found with a jittered box and a random score, some with the wrong class, plus false alarms."""
    found = _as_detections(truths)
    found[:, 1:5] += torch.randn(len(found), 4, generator=generator, dtype=torch.float64) * 6
    found[:, 5] = torch.rand(len(found), generator=generator, dtype=torch.float64)
    swap = torch.rand(len(found), generator=generator) < 0.2
    found[swap, 6] = 1 - found[swap, 6]
    alarms = found[torch.rand(len(found), generator=generator) < 0.4].clone()
    alarms[:, 1:5] += 300
    alarms[:, 6] = torch.randint(0, 3, (len(alarms),), generator=generator).double()
    return torch.cat([found, alarms])


def test_the_confusion_matrix_and_p_r_equal_the_oracles() -> None:
    """The same detections through the reference's ``ConfusionMatrix`` and ``ap_per_class``: equal counts, and
    equal per-class P and R at the best-F1 threshold (and equal curves)."""
    from ultralytics.utils.metrics import ConfusionMatrix, ap_per_class

    generator = torch.Generator().manual_seed(3)
    truths = _random_truths(generator, images=30)
    truths = truths[truths[:, 0] != 7]  # an image with detections only
    detections = _noisy_detections(truths, generator)
    detections = detections[detections[:, 0] != 9]  # an image with truths only
    evaluation = _evaluation(truths, detections, 30)
    results = class_results(evaluation, NAMES)

    oracle = ConfusionMatrix(names=dict(enumerate(NAMES)))
    for image in range(30):
        d, t = detections[detections[:, 0] == image], truths[truths[:, 0] == image]
        oracle.process_batch({"bboxes": d[:, 1:5].float(), "conf": d[:, 5].float(), "cls": d[:, 6].float()},
                             {"bboxes": t[:, 1:5].float(), "cls": t[:, 5].float()})  # fmt: skip
    np.testing.assert_array_equal(results.confusion, oracle.matrix.astype(np.int64))

    ordered = detections[torch.argsort(detections[:, 0], stable=True)]  # the evaluation's order
    ordered[:, 5] = ordered[:, 5].float().double()  # the scores the metric saw: float32, as detections are
    matched = evaluation.kinds["box"].matched
    out = ap_per_class(
        matched[:, None].astype(float), ordered[:, 5].numpy(), ordered[:, 6].numpy(), truths[:, 5].numpy()
    )
    p, r, classes, p_curve, r_curve = out[2], out[3], out[6], out[7], out[8]
    box = results.kinds["box"]
    np.testing.assert_allclose(box.p[classes.astype(int)], p, atol=1e-9)
    np.testing.assert_allclose(box.r[classes.astype(int)], r, atol=1e-9)
    np.testing.assert_allclose(box.precision[classes.astype(int)], p_curve, atol=1e-9)
    np.testing.assert_allclose(box.recall[classes.astype(int)], r_curve, atol=1e-9)
    assert 0 < box.mean(box.p) < 1 and 0 < box.mean(box.r) < 1  # the data is neither perfect nor empty


def test_confusion_pictures_are_drawn_from_the_matrix() -> None:
    diagonal = np.diag([5, 7, 0, 0])
    swapped = diagonal.copy()
    swapped[[0, 1], [0, 1]] = 0
    swapped[1, 0], swapped[0, 1] = 5, 7
    drawn = [confusion_matrix_image(m, NAMES, normalize) for m in (diagonal, swapped) for normalize in (0, 1)]
    for image in drawn:
        assert image.ndim == 3 and image.dtype == np.uint8 and image.std() > 10
    assert (
        np.abs(drawn[0].astype(int) - drawn[2]).sum() > 0
        and np.abs(drawn[1].astype(int) - drawn[3]).sum() > 0
    )


class PerfectDetector(YOLO11Module):
    """Its detections are the validation batch's truths, at score 0.9."""

    def validation_step(self, batch, batch_idx):
        self._truths = DetectionMAP.targets_in_input(batch)
        return super().validation_step(batch, batch_idx)

    def forward_with_nms(self, images):
        if self.training or not hasattr(self, "_truths"):
            return super().forward_with_nms(images)
        return [torch.cat([t[:, :4], torch.full_like(t[:, :1], 0.9), t[:, 4:]], 1) for t in self._truths]


def _fit(
    root: Path, dataset: Path, epochs: int, ckpt_path: str | None = None
) -> tuple[L.Trainer, ClosingSummary]:
    summary = ClosingSummary()
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=epochs, limit_train_batches=2, limit_val_batches=2,
        num_sanity_val_steps=0, enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1,
        default_root_dir=str(root), callbacks=[BestCheckpoint(), ResultPictures(), summary],
        logger=[CSVLogger(str(root), name="", version=""), TensorBoardLogger(str(root), name="", version="")],
    )  # fmt: skip
    data = YOLODataModule(dataset=str(dataset), image_size=64, batch_size=4, num_workers=0)
    module = PerfectDetector(num_classes=3, class_names=NAMES, ema=False, log_images=0, optimizer="SGD")
    trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
    return trainer, summary


def test_a_fit_leaves_pictures_that_follow_the_data_and_a_summary_naming_every_class(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    root = tmp_path / "run"
    _fit(root, tiny_dataset, epochs=1)
    trainer, summary = _fit(root, tiny_dataset, epochs=2, ckpt_path=str(root / "checkpoints" / "best.ckpt"))
    pictures = root / "pictures"
    expected = ["results.png", "labels_per_class.png", "labels_boxes.png", "train_batch0.jpg", "train_batch1.jpg",
                *(f"val/{n}.png" for n in ("confusion_matrix", "confusion_matrix_normalized", "box_PR_curve",
                                           "box_F1_curve", "box_P_curve", "box_R_curve"))]  # fmt: skip
    for name in expected:
        image = cv2.imread(str(pictures / name))
        assert image is not None, f"{name} missing"
        assert image.std() > 10, f"{name} is blank"
    # The confusion matrix of a perfect predictor: diagonal, nothing in the background row or column.
    rows = list(csv.reader((pictures / "val" / "confusion_matrix.csv").open()))
    assert rows[0][1:] == [*NAMES, "background"]
    matrix = np.array([[int(v) for v in row[1:]] for row in rows[1:]])
    assert matrix.trace() > 0 and (matrix == np.diag(np.diag(matrix))).all()
    # The summary: every class by name, P = R = mAP = 1, the best epoch, the files.
    for name in NAMES:
        assert f"\n{name} " in summary.last_text
    table = {row["class"]: row for row in csv.DictReader((root / "summary_fit.csv").open())}
    assert set(table) == {"all", *NAMES}
    for name in ("all", *(n for n in NAMES if int(table[n]["instances"]))):
        for column in ("box_P", "box_R", "box_mAP50", "box_mAP50-95"):
            assert float(table[name][column]) == pytest.approx(1.0), (name, column)
    assert "best: epoch 0, val/mAP50-95 1.0000" in summary.last_text
    assert "pictures/val/confusion_matrix.png" in summary.last_text and "summary_fit.csv" in summary.last_text
    # The curves went on after the resume: epochs 0 and 1 in the history, and both in the loggers.
    history = next(c for c in trainer.callbacks if isinstance(c, ResultPictures)).history
    assert sorted(history["val/mAP50-95"]) == [0, 1] and sorted(history["train/box_loss"]) == [0, 1]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = set()
    for events in root.glob("events.out.tfevents.*"):
        accumulator = EventAccumulator(str(events), size_guidance={"images": 0})
        accumulator.Reload()
        tags |= set(accumulator.Tags()["images"])
    assert {"pictures/results", "pictures/val/confusion_matrix", "pictures/train_batch0"} <= tags, tags
