"""Which runtime opens an exported model file, by its name: ``.onnx`` (ONNX Runtime), ``.torchscript``
(TorchScript), an ``_openvino_model`` folder or ``.xml`` (OpenVINO), ``.pte`` (ExecuTorch).

``open_exported(path)`` returns the ``ExportedModel`` that runs it in place of ``YOLO11``; ``is_exported_file``
tells whether a path names one. The runtimes import their packages only when a file is opened.
"""

from __future__ import annotations

import os

from yolo11_lightning.model_files.executorch_runtime import ExecuTorchModel, is_executorch_file
from yolo11_lightning.model_files.exported_model import ExportedModel
from yolo11_lightning.model_files.onnx_runtime import OnnxDetector, is_onnx_file
from yolo11_lightning.model_files.openvino_runtime import OpenVinoModel, is_openvino_model
from yolo11_lightning.model_files.torchscript_runtime import TorchScriptModel, is_torchscript_file
from yolo11_lightning.tasks import DEFAULT_TASK

__all__ = ["is_exported_file", "open_exported"]


def is_exported_file(path: str | os.PathLike | None) -> bool:
    """True when ``path`` names an exported model (by its name; it need not exist yet)."""
    return (
        is_onnx_file(path) or is_torchscript_file(path) or is_openvino_model(path) or is_executorch_file(path)
    )


def open_exported(
    path: str | os.PathLike, num_classes: int | None = None, task: str | None = DEFAULT_TASK
) -> ExportedModel:
    """The runtime model of the exported file ``path`` (``task`` None: the file's; a class count or task other
    than the given ones is refused)."""
    if is_onnx_file(path):
        return OnnxDetector(path, num_classes, task=task)
    if is_torchscript_file(path):
        return TorchScriptModel(path, num_classes, task=task)
    if is_openvino_model(path):
        return OpenVinoModel(path, num_classes, task=task)
    if is_executorch_file(path):
        return ExecuTorchModel(path, num_classes, task=task)
    raise ValueError(
        f"{path}: not an exported model (.onnx, .torchscript, an _openvino_model folder or .xml, .pte)"
    )
