""" "Is my exported file as good as my checkpoint?": validate both on one dataset, same loader, NMS and metric.

``yolo11-lightning export --ckpt_path best.ckpt --format onnx --check-data data.yaml`` calls ``compare`` after
writing the file and prints both mAPs (any ``--format``). The checkpoint's detector runs in PyTorch, the file
through its runtime (``model_files.exported_files.open_exported``: ONNX Runtime, TorchScript, OpenVINO, ExecuTorch), each in its own ``Trainer.validate`` over the dataset's val split with
the same ``YOLODataModule`` settings. A fixed-shape export is scored with square letterboxing at its size (the
only shape it takes), on both sides; a ``--dynamic`` export with the data module's default batching.
A segmentation file is checked the same way with the segmentation data and metric: box and mask mAP.
Imports Lightning (the export command imports this module only when ``--check-data`` is given).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L

from yolo11_lightning.nn.yolo11 import YOLO11
from yolo11_lightning.tasks import DEFAULT_TASK, get_task
from yolo11_lightning.training.datamodule import YOLODataModule
from yolo11_lightning.training.module import YOLO11Module


@dataclass(frozen=True)
class ExportCheck:
    """Validation metrics of the checkpoint (PyTorch) and of the exported file (its runtime)."""

    checkpoint: dict[str, float]
    exported: dict[str, float]
    setting: str  # how images were batched, for the printout
    task: str = DEFAULT_TASK
    label: str = "onnx"  # the file's row in the printout: its format

    @property
    def metrics(self) -> tuple[str, ...]:
        """What the printout shows (the task's ``reported_metrics``)."""
        return get_task(self.task).reported_metrics

    def worst_difference(self) -> tuple[str, float]:
        """The checked metric (the task's ``checked_metrics``: the mAP50-95 of every output kind) whose
        |file - checkpoint| is largest, and that difference."""
        checked = get_task(self.task).checked_metrics
        return max(((m, abs(self.difference(m))) for m in checked), key=lambda item: item[1])

    def difference(self, name: str = "mAP50-95") -> float:
        """The file's minus the checkpoint's metric ``name``."""
        return self.exported[name] - self.checkpoint[name]

    def table(self) -> str:
        """A small plain-text table of both runs and their difference."""
        width = max(10, *(len(m) + 1 for m in self.metrics))
        first = max(12, len(self.label) + 1)
        rows = [f"{'':<{first}}" + "".join(f"{m:>{width}}" for m in self.metrics)]
        for label, values in (("checkpoint", self.checkpoint), (self.label, self.exported)):
            rows.append(f"{label:<{first}}" + "".join(f"{values[m]:>{width}.4f}" for m in self.metrics))
        rows.append(
            f"{'difference':<{first}}" + "".join(f"{self.difference(m):>+{width}.4f}" for m in self.metrics)
        )
        return "\n".join(rows)


def _square_batches() -> dict[str, Any]:
    """The data module's switch for square letterboxing of validation batches."""
    return {"rect_val": False}


def _validate(module: YOLO11Module, data: YOLODataModule, accelerator: str, task: str) -> dict[str, float]:
    trainer = L.Trainer(
        accelerator=accelerator, devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    (results,) = trainer.validate(module, datamodule=data, verbose=False)
    return {m: float(results[f"val/{m}"]) for m in get_task(task).reported_metrics}


def compare(
    model: YOLO11,
    path: str | os.PathLike,
    dataset: str,
    image_size: tuple[int, int],
    dynamic: bool,
    batch_size: int = 16,
    num_workers: int = 2,
    accelerator: str = "auto",
    label: str = "onnx",
    checkpoint: dict[str, float] | None = None,
) -> ExportCheck:
    """Validate ``model`` and the file ``path`` exported from it on ``dataset``'s val split.

    Args:
        model: the detector or segmenter that was exported (eval mode); its ``task`` picks the data and metric.
        path: the exported file.
        dataset: a dataset yaml (or ``synthetic``).
        image_size: (H, W) the file was exported at. A fixed-shape file needs H == W: validation letterboxes
            to a square of that side.
        dynamic: the file takes any multiple of 32 (then the data module's default batching is used, at
            ``max(H, W)``).
        batch_size, num_workers: validation loader settings (one device).
        accelerator: Lightning accelerator for both runs.
        label: the file's format, its row in the printout.
        checkpoint: the checkpoint's metrics from an earlier ``compare`` on the same dataset, size and batching
            (``ExportCheck.checkpoint``): reused, not validated again.
    """
    height, width = image_size
    if not dynamic and height != width:
        raise ValueError(
            f"{path}: a fixed {height}x{width} export cannot be validated with square letterboxing; export "
            "with one --image-size S, or with --dynamic"
        )
    task = model.task
    extra = {} if dynamic else _square_batches()
    data = YOLODataModule(
        dataset,
        batch_size=batch_size,
        image_size=max(height, width),
        num_workers=num_workers,
        task=task,
        **extra,
    )
    if data.num_classes != model.num_classes:
        raise ValueError(
            f"{dataset}: {data.num_classes} classes, the model has {model.num_classes}; check it on the dataset "
            "it was trained for"
        )
    if model.names is not None and list(model.names) != data.class_names:
        raise ValueError(
            f"{dataset}: classes {data.class_names}, the model's are {list(model.names)} (another order scores "
            "every label as another class); check it on the dataset it was trained for"
        )
    common = {
        "num_classes": model.num_classes,
        "class_names": data.class_names,
        "ema": False,
        "log_images": 0,
        "task": task,
        **get_task(task).model_options(model),  # a pose model's keypoint shape
    }
    torch_module = YOLO11Module(scale=model.scale, **common)
    torch_module.model.load_state_dict(model.state_dict())
    file_module = YOLO11Module(scale=model.scale, weights=str(Path(path)), **common)
    setting = (
        f"val split of {dataset}, {'data-module default batching' if dynamic else 'square letterbox'} at "
        f"{max(height, width)} px"
    )
    return ExportCheck(
        checkpoint if checkpoint is not None else _validate(torch_module, data, accelerator, task),
        _validate(file_module, data, accelerator, task),
        setting,
        task,
        label,
    )
