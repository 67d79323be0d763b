"""An exported model file run by its runtime in place of ``YOLO11`` for validate, test and predict.

``ExportedModel`` is the part every runtime shares: an ``nn.Module`` without parameters, float images
(B, 3, H, W) RGB in [0, 1] in, the raw outputs ``YOLO11.eval()`` gives out (a detector's (B, 4 + nc, A); a
segmenter's ``(predictions, protos)``), on the device the images came from. It checks what the file says about
itself (metadata: ``model_files.onnx_metadata.read_metadata``) against its outputs and the caller's task and class
count. A runtime subclass (``onnx_runtime.OnnxDetector``, ``torchscript_runtime.TorchScriptModel``,
``openvino_runtime.OpenVinoModel``, ``executorch_runtime.ExecuTorchModel``) opens the file and runs one batch (``_run``). Imports torch; never Lightning.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from yolo11_lightning.model_files.onnx_metadata import OnnxModelInfo
from yolo11_lightning.tasks import DEFAULT_TASK, TASKS

__all__ = ["ExportedModel", "existing", "refuse_training"]


def refuse_training(model: nn.Module) -> None:
    """Raise ValueError when ``model`` is an ``ExportedModel``: an exported graph has no trainable weights."""
    if isinstance(model, ExportedModel):
        article = "an" if model.runtime[0] in "AEIOU" else "a"
        raise ValueError(
            f"{model.path}: {article} {model.runtime} file runs validate, test and predict only; fit needs "
            "trainable weights. Start from the checkpoint, weights file or reference .pt it was exported from "
            "(--model.weights best.ckpt)."
        )


class ExportedModel(nn.Module):
    """An exported file as a module: ``forward(images)`` -> the eval outputs of the model it was exported from.

    Attributes: ``path``, ``names`` (from the file), ``num_classes``, ``task`` (a task of ``tasks.TASKS``),
    ``num_masks`` (prediction channels after the class scores: mask coefficients, keypoints; 0 for a detector),
    ``strides`` (8, 16, 32), ``input_shape`` ((H, W) ints for a fixed-shape file, None for free axes), ``info``
    (the parsed metadata), ``kpt_shape`` (a pose model's (K, D), else None), ``runtime`` (what runs it).
    """

    strides: tuple[int, int, int] = (8, 16, 32)
    runtime: ClassVar[str] = "exported"  # the format, as messages name it
    # attributes a copy shares with its original (runtime sessions cannot be pickled or copied)
    _shared: ClassVar[tuple[str, ...]] = ("session",)

    def _check(
        self,
        info: OnnxModelInfo,
        in_shape: Sequence[Any],
        out_shapes: Sequence[Sequence[Any]],
        num_classes: int | None,
        task: str | None,
    ) -> list[int]:
        """Set the attributes from the file's ``info``, input shape and output shapes (the file's order);
        returns where each of the task's outputs is among the file's. Raises ValueError naming the file."""
        self.info = info
        self.task = info.task
        spec = TASKS.get(self.task)
        if spec is None or len(out_shapes) != len(spec.onnx_outputs):
            known = "; ".join(
                f"{t.words}: {len(t.onnx_outputs)} output(s) {t.onnx_output_doc}" for t in TASKS.values()
            )
            raise ValueError(
                f"{self.path}: expected one input and the outputs of its task ({known}); got task "
                f"{info.task!r}, {len(out_shapes)} output(s)"
            )
        if task is not None and self.task != task:
            raise ValueError(
                f"{self.path}: holds a {self.task} model ({len(out_shapes)} outputs), not a {task} model; "
                f"use it where {self.task} models are handled"
            )
        order = spec.onnx_output_order([list(s) for s in out_shapes])
        shapes = [list(out_shapes[i]) for i in order]
        if len(in_shape) != 4:
            raise ValueError(f"{self.path}: input {list(in_shape)} is not (B, 3, H, W)")
        try:  # prediction channels after the class scores (mask coefficients, keypoints), the class count
            self.num_masks = spec.onnx_extra_channels(shapes, **info.options)
            nc = spec.onnx_num_classes(shapes[0], self.num_masks)
        except ValueError as e:
            raise ValueError(f"{self.path}: {e}") from e
        h, w = in_shape[2:]
        self.input_shape: tuple[int, int] | None = (
            (h, w) if isinstance(h, int) and isinstance(w, int) else None
        )
        names = info.names
        if nc is None:
            nc = len(names) if names is not None else None
        if nc is None:
            raise ValueError(f"{self.path}: cannot tell the class count (no class names, output {shapes[0]})")
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
        self.kpt_shape: tuple[int, int] | None = info.options.get("kpt_shape")
        self.scale = info.scale or "n"  # what the file says, for summaries; the graph does not need it
        return order

    def __deepcopy__(self, memo: dict[int, Any]) -> ExportedModel:
        """A copy that shares the (read-only) runtime session."""
        clone = copy.copy(self)
        clone.__dict__ = {
            k: (v if k in self._shared else copy.deepcopy(v, memo)) for k, v in self.__dict__.items()
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
                "to ONNX with --dynamic for any multiple of 32 (rectangular batches)"
            )
        if h % 32 or w % 32 or not h or not w:
            raise ValueError(f"{self.path}: input height and width must be multiples of 32, got {h}x{w}")

    def _run(self, images: np.ndarray) -> list[np.ndarray]:
        """The file's outputs, in the task's order, for a float32 (B, 3, H, W) array."""
        raise NotImplementedError

    def forward(self, images: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        """(B, 3, H, W) float in [0, 1] -> (B, 4 + nc, A) float32 on ``images.device``; for a segmenter
        ``(predictions (B, 4 + nc + nm, A), protos (B, nm, H/4, W/4))``."""
        self.check_shape(images)
        array = np.ascontiguousarray(images.detach().to("cpu", torch.float32).numpy())
        outs = [torch.from_numpy(np.asarray(o, dtype=np.float32)).to(images.device) for o in self._run(array)]
        return outs[0] if len(outs) == 1 else (outs[0], outs[1])

    def extra_repr(self) -> str:
        shape = "x".join(map(str, self.input_shape)) if self.input_shape else "dynamic HxW"
        task = "" if self.task == DEFAULT_TASK else f", task {self.task}"
        return f"{self.path.name}, {self.num_classes} classes{task}, input {shape}, {self.runtime}"


def existing(path: str | os.PathLike, what: str) -> Path:
    """``path`` as a Path; FileNotFoundError naming it and ``what`` it should be when it does not exist."""
    found = Path(path)
    if not found.exists():
        raise FileNotFoundError(f"{found}: {what} not found")
    return found
