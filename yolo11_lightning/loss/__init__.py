"""Task-aligned assigner and the YOLO11 detection loss (plain torch); a task's own loss lives with the task."""

from yolo11_lightning.loss.assigner import Assignment, TaskAlignedAssigner
from yolo11_lightning.loss.detection import DetectionLoss

__all__ = ["Assignment", "DetectionLoss", "TaskAlignedAssigner"]
