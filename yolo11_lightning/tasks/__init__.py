"""The YOLO11 tasks: one ``Task`` per task (``tasks.base`` is the contract every layer reads), one line each here.

A new task is its own files (a ``Task`` subclass and what it needs: head, loss, label fields, metric) and one
entry in ``TASKS`` below; nothing else in the package names it (ARCHITECTURE.md, "A task").
Which task a run is (named once, by the model, a checkpoint, a weights file or the dataset) is ``tasks.choice``.
"""

from __future__ import annotations

from yolo11_lightning.tasks.base import Task
from yolo11_lightning.tasks.detect import DetectTask
from yolo11_lightning.tasks.segment.task import SegmentTask

__all__ = ["DEFAULT_TASK", "TASKS", "Task", "get_task"]

TASKS: dict[str, Task] = {task.name: task for task in (DetectTask(), SegmentTask())}
DEFAULT_TASK = "detect"  # the task of configs and weights files that name none


def get_task(name: str) -> Task:
    """The task named ``name``; a clear error listing the known ones otherwise."""
    task = TASKS.get(name)
    if task is None:
        raise ValueError(f"unknown YOLO11 task {name!r}; choose one of {', '.join(TASKS)}")
    return task
