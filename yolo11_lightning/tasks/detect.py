"""Object detection, boxes and classes: every behaviour is the task contract's default from tasks.base."""

from __future__ import annotations

from typing import ClassVar

from yolo11_lightning.tasks.base import Task

__all__ = ["DetectTask"]


class DetectTask(Task):
    """YOLO11 detection (``yolo11n.pt``): ``Detect`` head, ``DetectionLoss``, box mAP, (n, 6) detections."""

    name: ClassVar[str] = "detect"
    words: ClassVar[str] = "detection"
    title: ClassVar[str] = "detection"
    noun: ClassVar[str] = "detector"
    model_suffix: ClassVar[str] = ""
    reference_class: ClassVar[str] = "DetectionModel"
