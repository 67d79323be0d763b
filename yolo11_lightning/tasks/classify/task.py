"""ClassifyTask: image classification, YOLO11-cls, and what every layer asks of it by tasks.base.

Another network: the detection backbone's layers 0-8, then C2PSA at layer 9 (no SPPF, no neck; ``has_neck = False``)
and the ``Classify`` head at layer 10; one label per image, the mean cross-entropy (``loss.ClassificationLoss``;
``reference_loss_factor`` 1: the reference does not multiply it by the batch). The data is whole images
(``whole_image``: ``data.image_dataset.ImageDataset`` with ``augment.ClassifyTransform``, the reference's
classification pipeline; ImageFolder records from ``data.sources.imagefolder``; batches add ``labels`` (B,),
``batch.py``); evaluation is top-1 / top-5 accuracy (``metric.ClassificationAccuracy``, ``val/fitness`` their mean
for ``best.ckpt``); prediction writes the top 5 per image (``draw.py``); ONNX export has one (B, nc) output.
"""

from __future__ import annotations

from typing import ClassVar

from yolo11_lightning.tasks.base import Task
from yolo11_lightning.tasks.classify.data import ClassifyData
from yolo11_lightning.tasks.classify.evaluation import ClassifyEvaluation
from yolo11_lightning.tasks.classify.export import ClassifyExport
from yolo11_lightning.tasks.classify.model import ClassifyModel
from yolo11_lightning.tasks.classify.prediction import ClassifyPrediction

__all__ = ["ClassifyTask"]


class ClassifyTask(ClassifyModel, ClassifyData, ClassifyEvaluation, ClassifyPrediction, ClassifyExport, Task):
    """Classification: backbone only, ``Classify`` head, ``ClassificationLoss``; (B, nc) probabilities."""

    name: ClassVar[str] = "classify"
    words: ClassVar[str] = "classification"
    title: ClassVar[str] = "image classification"
    noun: ClassVar[str] = "classifier"
