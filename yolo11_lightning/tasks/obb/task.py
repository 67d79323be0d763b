"""ObbTask: oriented boxes, YOLO11-obb, and what every layer asks of it by tasks.base.

Detection with a rotation per box: the labels carry each box's four corners (``labels.ObbCorners``, moved by every
augmentation step), a sample its rotated boxes (``labels.rotated_boxes``, the batch's (N, 7) ``targets``:
``batch.collate_obb``), the head adds one angle per anchor (``head.OBB``), the loss assigns and scores rotated boxes
with probiou (``loss.ObbLoss``), evaluation and prediction use the reference's rotated NMS (``nms.rotated_nms``) and
its OBB mAP (``metric.ObbMAP``), and predictions are rotated boxes in original pixels with their corners.
"""

from __future__ import annotations

from typing import ClassVar

from yolo11_lightning.tasks.base import Task
from yolo11_lightning.tasks.obb.data import ObbData
from yolo11_lightning.tasks.obb.evaluation import ObbEvaluation
from yolo11_lightning.tasks.obb.export import ObbExport
from yolo11_lightning.tasks.obb.model import ObbModel
from yolo11_lightning.tasks.obb.prediction import ObbPrediction

__all__ = ["ObbTask"]


class ObbTask(ObbModel, ObbData, ObbEvaluation, ObbPrediction, ObbExport, Task):
    """Oriented boxes: ``OBB`` head, ``ObbLoss``; (B, 4 + nc + 1, A) eval outputs (xywh, scores, angle)."""

    name: ClassVar[str] = "obb"
    words: ClassVar[str] = "oriented-box (OBB)"
    title: ClassVar[str] = "oriented object detection"
    noun: ClassVar[str] = "oriented-box detector"
