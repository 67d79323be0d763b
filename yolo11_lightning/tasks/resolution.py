"""Which task a run is: one rule for the CLI, ``YOLO11Module`` and ``YOLODataModule``.

The task is set once. Its sources, strongest first:

1. what the user named: ``--model.task`` (or ``model.task`` of a config such as
   ``configs/model/yolo11n-seg.yaml``), the task of the checkpoint given by ``--ckpt_path``, ``--data.task``,
   or in Python the task of the model the data module is trained with. These must agree;
2. the task of the weights file the model starts from (``--model.weights yolo11n-seg.pt``);
3. the task the dataset is labelled for, when its files say (a dataset yaml with ``kpt_shape`` is a pose
   dataset, a folder of class folders a classification one; polygon rows do not make a segmentation dataset:
   detection trains on them, taking boxes from the polygons);
4. detection.

The data follows the model and the model follows the data. A dataset that says its task is a fact about its
labels: any other task is refused. A weights file of another task than the one named is fine-tuning (it loads
what fits). A task that is not registered (a reference file or dataset of a task this package does not train)
is refused by name, listing the supported ones.

The callers read the sources (config, files) and hand them here as ``TaskClaim``s; this module reads no file.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from yolo11_lightning.errors import UserInputError
from yolo11_lightning.tasks import DEFAULT_TASK, TASKS

__all__ = ["TaskClaim", "TaskError", "resolve_task", "task_words"]


class TaskError(UserInputError):
    """Two sources of a run's task that disagree, or a task that is not supported yet."""


@dataclass(frozen=True)
class TaskClaim:
    """One source's word on the task: ``task`` (a name of ``TASKS``, or another the source read) and ``source``, how
    messages name it, e.g. ``model.task='segment' (--model.task)``."""

    task: str
    source: str


def task_words(task: str) -> str:
    """Names a task's models and datasets in messages: detection, segmentation, keypoint (pose), ..."""
    spec = TASKS.get(task)
    return spec.words if spec is not None else task


def resolve_task(
    named: Sequence[TaskClaim], weights: TaskClaim | None = None, dataset: TaskClaim | None = None
) -> str:
    """Resolves the run's task from its sources; raises TaskError naming two that disagree.

    The module docstring lists the sources.
    """
    for other in named[1:]:
        if other.task != named[0].task:
            raise TaskError(
                f"{named[0].source} but {other.source}: a run has one task; set it once (model.task), the "
                "data follows"
            )
    chosen = named[0] if named else weights or dataset
    if chosen is None:
        return DEFAULT_TASK
    if dataset is not None and dataset.task != chosen.task:
        raise TaskError(
            f"{chosen.source} but {dataset.source}: a {task_words(chosen.task)} model cannot train or evaluate "
            f"on it; use a {task_words(chosen.task)} dataset"
        )
    hint = (
        "; name the task (model.task) to train a supported one from its layers (weights_strict false)"
        if chosen is weights
        else ""
    )
    if chosen.task not in TASKS:
        raise TaskError(
            f"{chosen.source}: the {chosen.task} task is not supported yet (supported: {', '.join(TASKS)}){hint}"
        )
    return chosen.task
