"""SegmentTask: instance segmentation, YOLO11-seg, and what every layer asks of it by tasks.base.

Detection plus one mask per instance: the labels carry a polygon per box (``structures``), a sample carries its
masks at 1/4 of the image side (``masks.rasterize``), the head adds 32 mask coefficients per anchor and 32
prototype masks per image (``head.Segment``), the loss a mask BCE (``loss.SegmentationLoss``), the metric the mask
mAP (``metric.SegmentationMAP``), and predictions their masks in original pixels (``mask_ops.segment_image``),
written as COCO RLE.
"""

from __future__ import annotations

from typing import ClassVar

from yolo11_lightning.tasks.base import Task
from yolo11_lightning.tasks.segment.data import SegmentData
from yolo11_lightning.tasks.segment.evaluation import SegmentEvaluation
from yolo11_lightning.tasks.segment.export import SegmentExport
from yolo11_lightning.tasks.segment.model import SegmentModel
from yolo11_lightning.tasks.segment.prediction import SegmentPrediction

__all__ = ["SegmentTask"]


class SegmentTask(SegmentModel, SegmentData, SegmentEvaluation, SegmentPrediction, SegmentExport, Task):
    """Instance segmentation: ``Segment`` head, ``SegmentationLoss``, box + mask mAP, boxes and masks.

    The masks' encoding (overlap index maps or one mask per instance) is read from each batch
    (``SegmentationBatch["mask_overlap"]``), so the loss follows whatever the data produces.
    """

    name: ClassVar[str] = "segment"
    words: ClassVar[str] = "segmentation"
    title: ClassVar[str] = "instance segmentation"
    noun: ClassVar[str] = "instance segmenter"
