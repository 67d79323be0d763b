"""Run an exported ONNX file through ONNX Runtime in place of ``YOLO11`` for validate, test and predict.

``OnnxDetector(path)`` is an ``ExportedModel`` (``model_files.exported_model``): float images (B, 3, H, W) RGB in
[0, 1] in, the raw (B, 4 + nc, A) predictions out (xywh in input pixels, then class scores), on the device the
images came from; what ``YOLO11.eval()`` returns. A segmentation file (metadata ``task: segment``, two outputs)
gives ``(predictions (B, 4 + nc + 32, A), protos (B, 32, H/4, W/4))``, as a segmentation ``YOLO11`` in eval mode.
``YOLO11Module(weights="model.onnx")`` (``--model.weights model.onnx``) puts it where the detector was, so the
same loader, letterbox, NMS and metric score the file. Training needs weights: ``fit`` with an exported file is
refused (``exported_model.refuse_training``).

Shapes: a file exported with ``--dynamic`` takes any height and width that are multiples of 32 (rectangular
validation batches included); a fixed-shape file takes only its export size, and another shape is an error
that says what to change, rather than a silent resize that would score a different preprocessing.
Imports torch and, when the file is opened, onnxruntime (the ``onnx`` extra); never Lightning.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

import numpy as np

from yolo11_lightning.extras import require
from yolo11_lightning.model_files.exported_model import ExportedModel, existing
from yolo11_lightning.model_files.onnx_metadata import read_metadata
from yolo11_lightning.tasks import DEFAULT_TASK

__all__ = ["OnnxDetector", "is_onnx_file"]


def is_onnx_file(path: str | os.PathLike | None) -> bool:
    """True for a path named ``*.onnx`` (the file need not exist yet: opening it reports that)."""
    return path is not None and str(path).lower().endswith(".onnx")


def _providers(ort: Any) -> list[str]:
    """CUDA first when this onnxruntime build has it, then the CPU."""
    available = ort.get_available_providers()
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available] or available


class OnnxDetector(ExportedModel):
    """An exported ``.onnx`` file run by ONNX Runtime (ours, or a reference detection, segmentation, pose, OBB or
    classification export without NMS).

    Args:
        path: the ``.onnx`` file.
        num_classes: class count the caller expects (the dataset's); a file with another count is refused.
        providers: ONNX Runtime execution providers (default: CUDA when available, then CPU).
        task: the task the caller handles; a file of another task is refused. None takes whatever the file
            holds (``task`` tells). The default is detection, as for ``load_model``.
    """

    runtime: ClassVar[str] = "ONNX"

    def __init__(
        self,
        path: str | os.PathLike,
        num_classes: int | None = None,
        providers: list[str] | None = None,
        task: str | None = DEFAULT_TASK,
    ) -> None:
        super().__init__()
        ort = require("onnxruntime", "onnx", f"running {path}")
        self.path = existing(path, "ONNX file")
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path}: ONNX file not found")
        self._providers = providers or _providers(ort)
        try:
            self.session = ort.InferenceSession(str(self.path), providers=self._providers)
        except Exception as e:  # onnxruntime raises its own exception types for unreadable graphs
            raise ValueError(f"{self.path}: not a readable ONNX model ({type(e).__name__}: {e})") from e
        info = read_metadata(self.path, self.session.get_modelmeta().custom_metadata_map)
        inputs, outputs = self.session.get_inputs(), self.session.get_outputs()
        if len(inputs) != 1:
            raise ValueError(f"{self.path}: expected one input (images), got {len(inputs)}")
        order = self._check(info, inputs[0].shape, [o.shape for o in outputs], num_classes, task)
        self.input_name = inputs[0].name
        self.output_names = [outputs[i].name for i in order]
        self.output_name = self.output_names[0]
        self.input_type = inputs[0].type  # tensor(float) or tensor(float16) (an fp16 export)

    def _run(self, images: np.ndarray) -> list[np.ndarray]:
        if self.input_type == "tensor(float16)":
            images = images.astype(np.float16)
        return self.session.run(self.output_names, {self.input_name: images})

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, providers {self._providers}"
