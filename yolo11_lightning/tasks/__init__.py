"""The YOLO11 tasks, one Task each, registered here in one line apiece.

``tasks.base`` is the contract every layer reads.

A new task is its own files (a ``Task`` subclass and what it needs: head, loss, label fields, metric) and one
entry in ``TASKS`` below; nothing else in the package names it (ARCHITECTURE.md, "A task").
Which task a run is (named once, by the model, a checkpoint, a weights file or the dataset) is ``tasks.resolution``.
"""

from __future__ import annotations

from collections.abc import Sequence

from yolo11_lightning.nn.yolo11 import YOLO11
from yolo11_lightning.tasks.base import Task
from yolo11_lightning.tasks.classify.task import ClassifyTask
from yolo11_lightning.tasks.detect import DetectTask
from yolo11_lightning.tasks.obb.task import ObbTask
from yolo11_lightning.tasks.pose.task import PoseTask
from yolo11_lightning.tasks.segment.task import SegmentTask

__all__ = ["DEFAULT_TASK", "TASKS", "Task", "create_model", "get_task"]

# Registry order matters where a reference state dict is recognised by its keys (``Task.matches_reference``): the
# first task that claims it has it (segmentation before pose and OBB, whose extra branch a Segment head also has).
TASKS: dict[str, Task] = {
    task.name: task for task in (DetectTask(), SegmentTask(), PoseTask(), ObbTask(), ClassifyTask())
}
DEFAULT_TASK = "detect"  # the task of configs and weights files that name none


def get_task(name: str) -> Task:
    """Returns the task named ``name``; a clear error lists the known ones otherwise."""
    task = TASKS.get(name)
    if task is None:
        raise ValueError(f"unknown YOLO11 task {name!r}; choose one of {', '.join(TASKS)}")
    return task


def create_model(
    scale: str = "n",
    num_classes: int = 80,
    names: list[str] | None = None,
    task: str = "detect",
    kpt_shape: Sequence[int] | None = None,
) -> YOLO11:
    """Builds a freshly initialised YOLO11 of ``task``.

    ``kpt_shape`` (K, D) is for pose only, (17, 3) when None.
    """
    return YOLO11(scale, num_classes, names, head=get_task(task).head_spec(kpt_shape))
