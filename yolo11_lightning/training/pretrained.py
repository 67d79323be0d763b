"""Start a model from pretrained weights, with Lightning's rank-zero messages.

The loading itself is ``model_files.weights.load_pretrained`` (plain torch); this wrapper only sends its summary and
warnings through ``rank_zero_info`` / ``rank_zero_warn``, so one line is printed per run, not per rank.
``weights_task_claim`` is what a weights file says about the run's task (``tasks.resolution``).
"""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from yolo11_lightning.model_files import weights as _weights
from yolo11_lightning.model_files.weights import WeightsMismatchError, file_task
from yolo11_lightning.nn.yolo11 import YOLO11
from yolo11_lightning.tasks.resolution import TaskClaim, task_words

__all__ = ["WeightsMismatchError", "load_pretrained", "weights_task_claim"]


def load_pretrained(model: YOLO11, path: str | Path, strict: bool = True) -> tuple[int, list[str]]:
    """Loads pretrained weights with rank-zero messages; returns the tensors loaded and the names not loaded.

    The loading is model_files.weights.load_pretrained.
    """
    return _weights.load_pretrained(model, path, strict, info=rank_zero_info, warn=rank_zero_warn)


def weights_task_claim(weights: str | Path) -> TaskClaim | None:
    """Reads the task a weights file claims from its header, without loading its tensors.

    The file is our weights or checkpoint file or a reference ``.pt``; the header is read by ``file_task``.
    None when it says nothing; its loader reports why.
    """
    task = file_task(weights)
    return (
        None
        if task is None
        else TaskClaim(task, f"model.weights={str(weights)!r} holds a {task_words(task)} model")
    )
