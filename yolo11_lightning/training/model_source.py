"""Decide what model a ``YOLO11Module`` holds: its task, and the fresh network (with pretrained weights) or an exported file.

``task`` None takes the task of the ``weights`` file (its header only: ``model_files.weights.file_task``; an
exported file's metadata), else detection; a given task keeps it whatever ``weights`` holds. An exported
file (ONNX, TorchScript, OpenVINO) replaces the detector with its runtime (``model_files.exported_files``;
validate/test/predict only).
"""

from __future__ import annotations

import torch

from yolo11_lightning.errors import UserInputError
from yolo11_lightning.model_files.exported_files import is_exported_file, open_exported
from yolo11_lightning.model_files.exported_model import ExportedModel
from yolo11_lightning.nn.scales import SCALES
from yolo11_lightning.tasks.resolution import resolve_task
from yolo11_lightning.training.pretrained import load_pretrained, weights_task_claim


def module_task(weights: str | None, num_classes: int, task: str | None) -> tuple[str, ExportedModel | None]:
    """The module's task, and the runtime model when ``weights`` is an exported file."""
    if is_exported_file(weights):  # an exported model, run by its runtime: validate/test/predict only
        onnx = open_exported(weights, num_classes, task=task)  # task None: the file's
        return onnx.task, onnx
    if task is None:  # the weights file's task (its header only), else detection
        claim = weights_task_claim(weights) if weights else None
        return resolve_task([], weights=claim), None
    return task, None


def check_model_options(scale: str, num_classes: int, class_names: list[str] | None) -> None:
    """Refuses class names that do not match the class count and a scale YOLO11 does not have, in one line."""
    if class_names is not None and len(class_names) != num_classes:
        raise UserInputError(f"class_names has {len(class_names)} names but num_classes is {num_classes}")
    if scale not in SCALES:
        raise UserInputError(
            f"model.scale={scale!r} is not a YOLO11 scale; choose one of {', '.join(SCALES)}"
        )


def starting_model(
    network: torch.nn.Module,
    class_names: list[str] | None,
    onnx: ExportedModel | None,
    weights: str | None,
    weights_strict: bool,
    channels_last: bool,
) -> torch.nn.Module:
    """Returns the model a module starts from: the fresh network with its weights, or ``onnx`` when given.

    The weights load what fits unless ``weights_strict``; with ``channels_last`` the model is in the NHWC
    layout.
    """
    network.names = list(class_names) if class_names is not None else None
    model = network
    if onnx is not None:
        model = onnx
    elif weights:
        load_pretrained(model, weights, strict=weights_strict)
    if channels_last:  # before the EMA callback copies the model, so the copy is NHWC too
        model.to(memory_format=torch.channels_last)
    return model
