"""Run an exported ONNX detector through ONNX Runtime in place of ``YOLO11`` for validate, test and predict.

``OnnxDetector(path)`` is an ``nn.Module`` without parameters: float images (B, 3, H, W) RGB in [0, 1] in, the
raw (B, 4 + nc, A) predictions out (xywh in input pixels, then class scores), on the device the images came
from; what ``YOLO11.eval()`` returns. A segmentation file (metadata ``task: segment``, two outputs) gives
``(predictions (B, 4 + nc + 32, A), protos (B, 32, H/4, W/4))``, as a segmentation ``YOLO11`` in eval mode. ``YOLO11Module(weights="model.onnx")`` (``--model.weights model.onnx``)
puts it where the detector was, so the same loader, letterbox, NMS and metric score the file. Training needs
weights: ``fit`` with an ONNX file is refused (``refuse_training``).

Shapes: a file exported with ``--dynamic`` takes any height and width that are multiples of 32 (rectangular
validation batches included); a fixed-shape file takes only its export size, and another shape is an error
that says what to change, rather than a silent resize that would score a different preprocessing.
Imports torch and, when the file is opened, onnxruntime (the ``onnx`` extra); never Lightning.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from yolo11_lightning.extras import require
from yolo11_lightning.model_files.onnx_metadata import OnnxModelInfo, read_metadata
from yolo11_lightning.tasks import DEFAULT_TASK, TASKS

__all__ = ["OnnxDetector", "is_onnx_file", "refuse_training"]


def is_onnx_file(path: str | os.PathLike | None) -> bool:
    """True for a path named ``*.onnx`` (the file need not exist yet: opening it reports that)."""
    return path is not None and str(path).lower().endswith(".onnx")


def refuse_training(model: nn.Module) -> None:
    """Raise ValueError when ``model`` is an ``OnnxDetector``: an exported graph has no trainable weights."""
    if isinstance(model, OnnxDetector):
        raise ValueError(
            f"{model.path}: an ONNX file runs validate, test and predict only; fit needs trainable weights. "
            "Start from the checkpoint, weights file or reference .pt it was exported from "
            "(--model.weights best.ckpt)."
        )


def _providers(ort: Any) -> list[str]:
    """CUDA first when this onnxruntime build has it, then the CPU."""
    available = ort.get_available_providers()
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available] or available


class OnnxDetector(nn.Module):
    """An exported detector as a module: ``forward(images)`` -> (B, 4 + nc, A) predictions, or for a
    segmenter ``(predictions (B, 4 + nc + nm, A), protos (B, nm, H/4, W/4))``.

    Args:
        path: the ``.onnx`` file (ours, or a reference detection or segmentation export without NMS).
        num_classes: class count the caller expects (the dataset's); a file with another count is refused.
        providers: ONNX Runtime execution providers (default: CUDA when available, then CPU).
        task: the task the caller handles (``detect``, ``segment``); a file of another task is refused. None
            takes whatever the file holds (``task`` tells). The default is detection, as for ``load_model``.

    Attributes: ``names`` (from the file), ``num_classes``, ``task`` (a task of ``tasks.TASKS``), ``num_masks``
    (prediction channels after the class scores: a segmenter's mask coefficients, 0 for a detector), ``strides`` (8, 16, 32), ``input_shape`` ((H, W) ints for a fixed-shape file, None for
    free axes), ``info`` (the parsed metadata).
    """

    strides: tuple[int, int, int] = (8, 16, 32)

    def __init__(
        self,
        path: str | os.PathLike,
        num_classes: int | None = None,
        providers: list[str] | None = None,
        task: str | None = DEFAULT_TASK,
    ) -> None:
        super().__init__()
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path}: ONNX file not found")
        ort = require("onnxruntime", "onnx", f"running {self.path}")
        self._providers = providers or _providers(ort)
        try:
            self.session = ort.InferenceSession(str(self.path), providers=self._providers)
        except Exception as e:  # onnxruntime raises its own exception types for unreadable graphs
            raise ValueError(f"{self.path}: not a readable ONNX model ({type(e).__name__}: {e})") from e
        self.info: OnnxModelInfo = read_metadata(self.path, self.session.get_modelmeta().custom_metadata_map)
        inputs, outputs = self.session.get_inputs(), self.session.get_outputs()
        self.task = self.info.task
        spec = TASKS.get(self.task)
        if spec is None or len(inputs) != 1 or len(outputs) != len(spec.onnx_outputs):
            known = "; ".join(
                f"{t.words}: {len(t.onnx_outputs)} output(s) {t.onnx_output_doc}" for t in TASKS.values()
            )
            raise ValueError(
                f"{self.path}: expected one input and the outputs of its task ({known}); got task "
                f"{self.info.task!r}, {len(inputs)} input(s), {len(outputs)} output(s)"
            )
        if task is not None and self.task != task:
            raise ValueError(
                f"{self.path}: holds a {self.task} model ({len(outputs)} outputs), not a {task} model; "
                f"use it where {self.task} models are handled"
            )
        outputs = [outputs[i] for i in spec.onnx_output_order([o.shape for o in outputs])]
        self.input_name, self.output_name = inputs[0].name, outputs[0].name
        self.output_names = [o.name for o in outputs]
        in_shape, out_shape = list(inputs[0].shape), list(outputs[0].shape)
        if len(in_shape) != 4:
            raise ValueError(f"{self.path}: input {in_shape} is not (B, 3, H, W)")
        try:  # prediction channels after the class scores (mask coefficients, keypoints), the class count
            self.num_masks = spec.onnx_extra_channels([list(o.shape) for o in outputs], **self.info.options)
            nc = spec.onnx_num_classes(out_shape, self.num_masks)
        except ValueError as e:
            raise ValueError(f"{self.path}: {e}") from e
        h, w = in_shape[2:]
        self.input_shape: tuple[int, int] | None = (
            (h, w) if isinstance(h, int) and isinstance(w, int) else None
        )
        names = self.info.names
        if nc is None:
            nc = len(names) if names is not None else None
        if nc is None:
            raise ValueError(f"{self.path}: cannot tell the class count (no class names, output {out_shape})")
        if names is not None and len(names) != nc:
            raise ValueError(
                f"{self.path}: {len(names)} class names in the metadata, {nc} classes in the output"
            )
        if num_classes is not None and nc != num_classes:
            raise ValueError(
                f"{self.path}: the model predicts {nc} classes, the dataset has {num_classes}; validate it on the "
                "dataset it was trained for"
            )
        self.num_classes = nc
        self.names = names
        # a pose model's (K, D), as ``YOLO11.kpt_shape``; None for the other tasks
        self.kpt_shape: tuple[int, int] | None = self.info.options.get("kpt_shape")
        self.scale = self.info.scale or "n"  # what the file says, for summaries; the graph does not need it

    def __deepcopy__(self, memo: dict[int, Any]) -> OnnxDetector:
        """A copy that shares the (read-only) session: sessions cannot be pickled or copied."""
        clone = copy.copy(self)
        clone.__dict__ = {
            k: (v if k == "session" else copy.deepcopy(v, memo)) for k, v in self.__dict__.items()
        }
        return clone

    def check_shape(self, images: Tensor) -> None:
        """Raise a ValueError naming the file unless ``images`` is a shape the graph takes."""
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"{self.path}: expects images (B, 3, H, W), got {tuple(images.shape)}")
        h, w = int(images.shape[2]), int(images.shape[3])
        if self.input_shape is not None and (h, w) != self.input_shape:
            eh, ew = self.input_shape
            hint = (
                f"square letterboxing at {eh} (validate/test: --data.rect_val false --data.image_size {eh}; "
                f"predict: --image-size {eh})"
                if eh == ew
                else f"images letterboxed to {eh}x{ew}"
            )
            raise ValueError(
                f"{self.path}: exported with a fixed {eh}x{ew} input, got a {h}x{w} batch. Use {hint}, or export "
                "with --dynamic for any multiple of 32 (rectangular batches)"
            )
        if h % 32 or w % 32 or not h or not w:
            raise ValueError(f"{self.path}: input height and width must be multiples of 32, got {h}x{w}")

    def forward(self, images: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        """(B, 3, H, W) float in [0, 1] -> (B, 4 + nc, A) float32 on ``images.device``; for a segmenter
        ``(predictions (B, 4 + nc + nm, A), protos (B, nm, H/4, W/4))``."""
        self.check_shape(images)
        array = np.ascontiguousarray(images.detach().to("cpu", torch.float32).numpy())
        outs = [
            torch.from_numpy(o).to(images.device)
            for o in self.session.run(self.output_names, {self.input_name: array})
        ]
        return outs[0] if len(outs) == 1 else (outs[0], outs[1])

    def extra_repr(self) -> str:
        shape = "x".join(map(str, self.input_shape)) if self.input_shape else "dynamic HxW"
        task = "" if self.task == DEFAULT_TASK else f", task {self.task}"
        return (
            f"{self.path.name}, {self.num_classes} classes{task}, input {shape}, providers {self._providers}"
        )
