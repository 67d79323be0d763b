"""Run an exported TorchScript file (``.torchscript``) in place of ``YOLO11`` for validate, test and predict.

The file is ``export.torchscript``'s: a traced eval-mode model whose metadata sits in the archive's extra file
``config.txt`` (JSON, the keys ``model_files.onnx_metadata.metadata_props`` writes, as the reference's loader
reads them). The traced graph takes only its export size (the anchor grid is constant); the batch axis is
free. ``TorchScriptModel`` runs it on the CPU in float32 and gives what ``YOLO11.eval()`` gives. Imports torch;
never Lightning.
"""

from __future__ import annotations

import json
import os
from typing import ClassVar

import numpy as np
import torch

from yolo11_lightning.model_files.exported_model import ExportedModel, existing
from yolo11_lightning.model_files.onnx_metadata import read_metadata
from yolo11_lightning.tasks import DEFAULT_TASK

__all__ = ["TORCHSCRIPT_METADATA", "TorchScriptModel", "is_torchscript_file"]

TORCHSCRIPT_METADATA = "config.txt"  # the archive's extra file with the metadata (the reference's name)


def is_torchscript_file(path: str | os.PathLike | None) -> bool:
    """True for a path named ``*.torchscript``."""
    return path is not None and str(path).lower().endswith(".torchscript")


class TorchScriptModel(ExportedModel):
    """An exported ``.torchscript`` file run by ``torch.jit`` (arguments as ``OnnxDetector``'s)."""

    runtime: ClassVar[str] = "TorchScript"

    def __init__(
        self, path: str | os.PathLike, num_classes: int | None = None, task: str | None = DEFAULT_TASK
    ) -> None:
        super().__init__()
        self.path = existing(path, "TorchScript file")
        extra = {TORCHSCRIPT_METADATA: ""}
        try:
            session = torch.jit.load(str(self.path), _extra_files=extra, map_location="cpu")
        except Exception as e:  # torch.jit raises RuntimeError and its own types for unreadable archives
            raise ValueError(f"{self.path}: not a readable TorchScript file ({type(e).__name__}: {e})") from e
        try:
            props = json.loads(extra[TORCHSCRIPT_METADATA] or "{}")
        except json.JSONDecodeError as e:
            raise ValueError(f"{self.path}: metadata {TORCHSCRIPT_METADATA} is not JSON: {e}") from e
        info = read_metadata(
            self.path, {str(k): v if isinstance(v, str) else repr(v) for k, v in props.items()}
        )
        if info.size is None:
            raise ValueError(f"{self.path}: metadata {TORCHSCRIPT_METADATA} has no imgsz (the traced size)")
        self.__dict__["session"] = (
            session.eval()
        )  # not a submodule: the caller's .to() and dtype leave it as is
        h, w = info.size
        outs = self._raw(np.zeros((1, 3, h, w), np.float32))  # the traced graph says its shapes by running
        self._order = self._check(info, [1, 3, h, w], [list(o.shape) for o in outs], num_classes, task)

    def _raw(self, images: np.ndarray) -> list[np.ndarray]:
        with torch.inference_mode():
            out = self.session(torch.from_numpy(images))
        return [t.float().numpy() for t in (out if isinstance(out, tuple | list) else [out])]

    def _run(self, images: np.ndarray) -> list[np.ndarray]:
        outs = self._raw(images)
        return [outs[i] for i in self._order]
