"""Optional runtimes, installed as extras of their own, imported where a command needs them.

``pip install -e .`` installs what training, validation and prediction on images need, and the TorchScript
format. An optional runtime comes with an extra (``pyproject.toml``): ``onnx`` (onnx, onnxruntime) for the
ONNX formats (``onnx``, ``onnx-fp16``, ``onnx-int8``), their checks and running an ``.onnx`` file; ``openvino``
for ``openvino`` / ``openvino-fp16`` and running an ``_openvino_model`` folder; ``int8`` (nncf) for
``openvino-int8``; ``executorch`` for ``executorch`` and running a ``.pte`` program; ``tensorboard`` for
TensorBoard event files (the loggers add it only when installed).
``require`` imports one or raises ``MissingExtraError``, whose one line names the extra to install. Imports nothing else: every layer may call it.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from yolo11_lightning.errors import UserInputError

__all__ = ["MissingExtraError", "require"]

PACKAGE = "yolo11_lightning"


class MissingExtraError(UserInputError, ImportError):
    """An optional runtime that is not installed; the message names the extra that installs it."""


def require(module: str, extra: str, needed_by: str) -> ModuleType:
    """``import module``, or raise MissingExtraError: ``<needed_by> needs <module>: pip install "<pkg>[<extra>]"``."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtraError(f'{needed_by} needs {module}: pip install "{PACKAGE}[{extra}]"') from None
