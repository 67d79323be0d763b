"""Task-aligned assigner and the YOLO11 detection and segmentation losses (plain torch)."""

from yolo11_lightning.loss.assigner import Assignment, TaskAlignedAssigner
from yolo11_lightning.loss.detection import DetectionLoss
from yolo11_lightning.loss.segmentation import SegmentationLoss

__all__ = ["Assignment", "DetectionLoss", "SegmentationLoss", "TaskAlignedAssigner"]
