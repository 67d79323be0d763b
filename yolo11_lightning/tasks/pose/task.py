"""PoseTask: keypoints, YOLO11-pose, and what every layer asks of it by tasks.base.

Detection plus K keypoints of D values per instance (``kpt_shape``, COCO persons: (17, 3); a dataset yaml's
``kpt_shape`` with its ``flip_idx``, or a COCO keypoints json's categories' keypoint names): the labels carry them (``structures.keypoints.Keypoints``, moved by every
augmentation step), a batch its ``keypoints`` (N, K, 3) (``batch``), the head adds K·D channels per anchor
(``head.Pose``), the loss a keypoint term and a visibility term (``loss.PoseLoss``), the metric the keypoint mAP
by OKS (``metric.PoseMAP``), predictions their keypoints in original pixels (``drawing``: skeletons, COCO json
keypoints), an ONNX file its ``kpt_shape`` in the metadata.
"""

from __future__ import annotations

from typing import ClassVar

from yolo11_lightning.tasks.base import Task
from yolo11_lightning.tasks.pose.data import PoseData
from yolo11_lightning.tasks.pose.evaluation import PoseEvaluation
from yolo11_lightning.tasks.pose.export import PoseExport
from yolo11_lightning.tasks.pose.model import PoseModel
from yolo11_lightning.tasks.pose.prediction import PosePrediction

__all__ = ["PoseTask"]


class PoseTask(PoseModel, PoseData, PoseEvaluation, PosePrediction, PoseExport, Task):
    """Keypoints: ``Pose`` head, ``PoseLoss``; (n, 6 + K·D) detections once NMS carries the keypoints."""

    name: ClassVar[str] = "pose"
    words: ClassVar[str] = "keypoint (pose)"
    title: ClassVar[str] = "pose estimation"
    noun: ClassVar[str] = "pose estimator"
