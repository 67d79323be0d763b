"""Our training defaults beside the reference trainer's, one row per setting, with the reason where they differ.

``python -m yolo11_lightning.cli.defaults`` prints the table that ``docs/defaults.md`` holds; a test checks
the reference column against the oracle's default configuration and our column against the live defaults
(``YOLO11Module``, ``YOLODataModule`` and the CLI's Trainer defaults), so neither side can drift unnoticed.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

# The reference trainer's defaults (Ultralytics 8.3 `cfg/default.yaml`, and the EMA/clipping constants of its
# trainer code), as the values our rows are compared with.
REFERENCE_DEFAULTS: dict[str, Any] = {
    "epochs": 100, "patience": 100, "batch": 16, "imgsz": 640, "cache": False, "workers": 8,
    "optimizer": "auto", "seed": 0, "deterministic": True, "rect": False, "cos_lr": False, "close_mosaic": 10,
    "amp": True, "fraction": 1.0, "multi_scale": False, "lr0": 0.01, "lrf": 0.01, "momentum": 0.937,
    "weight_decay": 0.0005, "warmup_epochs": 3.0, "warmup_momentum": 0.8, "warmup_bias_lr": 0.1, "box": 7.5,
    "cls": 0.5, "dfl": 1.5, "nbs": 64, "hsv_h": 0.015, "hsv_s": 0.7, "hsv_v": 0.4, "degrees": 0.0,
    "translate": 0.1, "scale": 0.5, "shear": 0.0, "perspective": 0.0, "flipud": 0.0, "fliplr": 0.5,
    "mosaic": 1.0, "mixup": 0.0, "iou": 0.7, "max_det": 300,
    # Not in the yaml: fixed in the reference's code (max_image_pixels: PIL's, whose `Image.open` in the label
    # check refuses images above 2 * `Image.MAX_IMAGE_PIXELS`).
    "ema_decay": 0.9999, "ema_tau": 2000, "clip_grad_norm": 10.0, "val_conf": 0.001,
    "max_image_pixels": 178_956_970,
}  # fmt: skip

# Keys that are constants in the reference's code rather than entries of its default configuration.
CODE_CONSTANTS = ("ema_decay", "ema_tau", "clip_grad_norm", "val_conf", "max_image_pixels")


@dataclass(frozen=True)
class DefaultRow:
    """One setting: the reference key, where it lives here (``model.x``, ``data.x``, ``trainer.x``) or None when we
    have no such setting, and why we differ (empty when the values are equal)."""

    reference: str
    ours: str | None
    reason: str = ""


ROWS: tuple[DefaultRow, ...] = (
    DefaultRow("epochs", "trainer.max_epochs", ""),
    DefaultRow("patience", None, "no early stopping unless you add Lightning's `EarlyStopping`; with 100 epochs "
               "the reference's patience of 100 never stops a default run either"),
    DefaultRow("batch", "data.batch_size", ""),
    DefaultRow("imgsz", "data.image_size", ""),
    DefaultRow("cache", "data.cache_images", ""),
    DefaultRow("workers", "data.num_workers", "loader processes per device, 2 for CPU runs; the GPU presets set "
               "`auto`: each local rank's cores minus one, at most 16 (8 with `recent` mosaic partners). The "
               "reference's 8 per GPU is capped at cores / devices: with 8 cores per GPU or fewer it leaves none "
               "to the training process"),
    DefaultRow("optimizer", "model.optimizer", ""),
    DefaultRow("seed", "data.seed", ""),
    DefaultRow("deterministic", "trainer.deterministic", "Lightning's default (None): deterministic kernels cost "
               "GPU speed; the data order and augmentation are deterministic without them"),
    DefaultRow("rect", None, "rectangular training batches are not offered (the reference's default is off too)"),
    DefaultRow("cos_lr", "model.cos_lr", ""),
    DefaultRow("close_mosaic", "data.close_mosaic", ""),
    DefaultRow("amp", "trainer.precision", "Lightning's explicit precision: 32-true by default (CPU-safe); the GPU "
               "presets use bf16-mixed"),
    DefaultRow("fraction", None, "train on a subset with a `.txt` image list instead"),
    DefaultRow("multi_scale", None, "not offered (the reference's default is off too)"),
    DefaultRow("lr0", "model.lr0", ""),
    DefaultRow("lrf", "model.lrf", ""),
    DefaultRow("momentum", "model.momentum", ""),
    DefaultRow("weight_decay", "model.weight_decay", ""),
    DefaultRow("warmup_epochs", "model.warmup_epochs", ""),
    DefaultRow("warmup_momentum", "model.warmup_momentum", ""),
    DefaultRow("warmup_bias_lr", "model.warmup_bias_lr", ""),
    DefaultRow("box", "model.box", ""),
    DefaultRow("cls", "model.cls", ""),
    DefaultRow("dfl", "model.dfl", ""),
    DefaultRow("nbs", "model.nominal_batch", ""),
    DefaultRow("hsv_h", "data.hsv_h", ""),
    DefaultRow("hsv_s", "data.hsv_s", ""),
    DefaultRow("hsv_v", "data.hsv_v", ""),
    DefaultRow("degrees", "data.degrees", ""),
    DefaultRow("translate", "data.translate", ""),
    DefaultRow("scale", "data.scale_jitter", ""),
    DefaultRow("shear", "data.shear", ""),
    DefaultRow("perspective", "data.perspective", ""),
    DefaultRow("flipud", "data.flipud", ""),
    DefaultRow("fliplr", "data.fliplr", ""),
    DefaultRow("mosaic", "data.mosaic", ""),
    DefaultRow("mixup", "data.mixup", ""),
    DefaultRow("val_conf", "model.conf_threshold", "unset (null): the task's, 0.001, or 0.01 for OBB, the rule of "
               "the reference's validator, which keys on the task the same way"),
    DefaultRow("iou", "model.iou_threshold", ""),
    DefaultRow("max_det", "model.max_detections", ""),
    DefaultRow("ema_decay", "model.ema_decay", ""),
    DefaultRow("ema_tau", "model.ema_tau", ""),
    DefaultRow("clip_grad_norm", "model.grad_clip_norm", ""),
    DefaultRow("max_image_pixels", "data.max_image_pixels", ""),
)  # fmt: skip

_MISSING = object()


def our_default(key: str) -> Any:
    """The live default of ``model.x``, ``data.x`` or ``trainer.x`` (the CLI's Trainer defaults, else Lightning's)."""
    from lightning.pytorch import Trainer

    from yolo11_lightning.cli.lightning_cli import TRAINER_DEFAULTS
    from yolo11_lightning.training.datamodule import YOLODataModule
    from yolo11_lightning.training.module import YOLO11Module

    group, name = key.split(".", 1)
    if group == "trainer" and name in TRAINER_DEFAULTS:
        return TRAINER_DEFAULTS[name]
    owner = {"model": YOLO11Module, "data": YOLODataModule, "trainer": Trainer}[group]
    parameter = inspect.signature(owner.__init__).parameters.get(name)
    return _MISSING if parameter is None else parameter.default


def render_table() -> str:
    """The markdown table of ``docs/defaults.md``."""
    lines = ["| reference | value | ours | value | why different |", "| --- | --- | --- | --- | --- |"]
    for row in ROWS:
        theirs = REFERENCE_DEFAULTS[row.reference]
        ours = "—" if row.ours is None else f"`{our_default(row.ours)!r}`"
        where = "—" if row.ours is None else f"`{row.ours}`"
        lines.append(f"| `{row.reference}` | `{theirs!r}` | {where} | {ours} | {row.reason} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render_table(), end="")
