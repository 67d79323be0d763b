"""How far an exported file's outputs, run by its runtime, are from the PyTorch model's on the same images."""

from __future__ import annotations

import os

import numpy as np
import torch

from yolo11_lightning.export.tracing import eval_outputs
from yolo11_lightning.model_files.exported_files import open_exported
from yolo11_lightning.nn.yolo11 import YOLO11
from yolo11_lightning.tasks import get_task

__all__ = ["exported_output_diffs"]


def exported_output_diffs(model: YOLO11, path: str | os.PathLike, images: torch.Tensor) -> dict[str, float]:
    """Output name (the task's ``onnx_outputs``) -> largest |runtime - PyTorch| for float ``images`` (B, 3, H, W).

    Raises MissingExtraError when the runtime is not installed, ValueError naming the file when its outputs
    differ in number or shape from the model's."""
    runner = open_exported(path, model.num_classes, task=model.task)
    got = runner(images.float().cpu())
    got = list(got) if isinstance(got, tuple | list) else [got]
    expected = eval_outputs(model, images)
    names = get_task(model.task).onnx_outputs
    diffs = {}
    for name, a, b in zip(names, got, expected):
        if a.shape != b.shape:
            raise ValueError(
                f"{path}: output {name} shape {tuple(a.shape)} differs from PyTorch's {tuple(b.shape)}"
            )
        diffs[name] = float(np.abs(a.numpy() - b.numpy()).max())
    return diffs
