"""YOLO11 trained with PyTorch Lightning: detection, segmentation, pose, oriented boxes and classification.

``YOLO11`` (the detector) imports only torch. ``create_model`` builds a model of any task, ``load_model`` opens
any model file (a reference ``.pt``, our weights file, a Lightning ``.ckpt``) without Lightning.
``YOLODataModule`` and ``YOLO11Module`` pull in Lightning. Everything is loaded on first access, so a script
that only builds a detector imports nothing else.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY = {
    "YOLO11": "yolo11_lightning.nn.yolo11",
    "create_model": "yolo11_lightning.tasks",
    "load_model": "yolo11_lightning.model_files.weights",
    "DetectionLoss": "yolo11_lightning.loss",
    "TaskAlignedAssigner": "yolo11_lightning.loss",
    "YOLODataModule": "yolo11_lightning.training.datamodule",
    "YOLO11Module": "yolo11_lightning.training.module",
}

__all__ = [
    "YOLO11",
    "DetectionLoss",
    "TaskAlignedAssigner",
    "YOLO11Module",
    "YOLODataModule",
    "__version__",
    "create_model",
    "load_model",
]

if TYPE_CHECKING:  # pragma: no cover
    from yolo11_lightning.loss import DetectionLoss, TaskAlignedAssigner
    from yolo11_lightning.model_files.weights import load_model
    from yolo11_lightning.nn.yolo11 import YOLO11
    from yolo11_lightning.tasks import create_model
    from yolo11_lightning.training.datamodule import YOLODataModule
    from yolo11_lightning.training.module import YOLO11Module


def __getattr__(name: str) -> Any:
    if name == "__version__":  # the installed distribution's (pyproject.toml), read on first access
        from yolo11_lightning.version import package_version

        return package_version()
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'yolo11_lightning' has no attribute {name!r}")
