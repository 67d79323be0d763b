"""The task contract: what every layer asks of a YOLO11 task, split by who asks, one facet per module.

A task (``tasks/detect.py``, ``tasks/<task>/``) is one ``Task`` made of its facets, registered by one line in
``tasks/__init__.py``; each facet's hooks and detection's answers are in the facet's module:

* ``model.py`` (``TaskModel``): the network (which layers, the head), the model files, the loss;
* ``data/task_samples.py`` (``TaskSamples``: what the Dataset reads) and ``data.py`` (``TaskData``): label
  fields, samples, whole-image pipelines, the collate, split and label checks;
* ``evaluation.py`` (``TaskEvaluation``): the metric, scoring a batch, what ``best.ckpt`` follows;
* ``prediction.py`` (``TaskPrediction``): results in original pixels, their json fields, every picture;
* ``export.py`` (``TaskExport``): the ONNX outputs, their shapes and metadata.

Tasks reach the module (``training.module.YOLO11Module``) through its public methods only: ``model``,
``hparams``, ``model_input`` and ``forward_with_nms``.
"""

from __future__ import annotations

from typing import ClassVar

from yolo11_lightning.tasks.base.data import TaskData
from yolo11_lightning.tasks.base.evaluation import TaskEvaluation
from yolo11_lightning.tasks.base.export import TaskExport
from yolo11_lightning.tasks.base.model import TaskModel
from yolo11_lightning.tasks.base.prediction import TaskPrediction

__all__ = ["Task"]


class Task(TaskModel, TaskData, TaskEvaluation, TaskPrediction, TaskExport):
    """A YOLO11 task: its names and its facets; detection's behaviour is the default."""

    name: ClassVar[str]
    words: ClassVar[str]  # "a <words> model": detection, segmentation
    title: ClassVar[str]  # what ``yolo11-lightning info`` calls its models: detection, instance segmentation
    noun: ClassVar[str]  # what one model is: detector, instance segmenter

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"
