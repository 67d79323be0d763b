"""YOLO11 object detection trained with PyTorch Lightning.

``YOLO11`` (the detector) imports only torch. ``YOLODataModule`` and ``YOLO11Module`` pull in
Lightning, so they are loaded on first access: model, loss and ops stay usable in scripts and
exports that have no Trainer.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY = {
    "YOLO11": "yolo11_lightning.nn.yolo11",
    "DetectionLoss": "yolo11_lightning.loss",
    "TaskAlignedAssigner": "yolo11_lightning.loss",
    "YOLODataModule": "yolo11_lightning.training.datamodule",
    "YOLO11Module": "yolo11_lightning.training.module",
}

__all__ = ["YOLO11", "DetectionLoss", "TaskAlignedAssigner", "YOLO11Module", "YOLODataModule", "__version__"]

if TYPE_CHECKING:  # pragma: no cover
    from yolo11_lightning.loss import DetectionLoss, TaskAlignedAssigner
    from yolo11_lightning.nn.yolo11 import YOLO11
    from yolo11_lightning.training.datamodule import YOLODataModule
    from yolo11_lightning.training.module import YOLO11Module


def __getattr__(name: str) -> Any:
    if name == "__version__":  # the installed distribution's (pyproject.toml), read on first access
        from yolo11_lightning.version import package_version

        return package_version()
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'yolo11_lightning' has no attribute {name!r}")
