"""LightningCLI for ``yolo11-lightning fit|validate|test|predict``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.cli import LightningCLI

from yolo11_lightning.data.datamodule import YOLODataModule
from yolo11_lightning.training.module import YOLO11Module


def default_callbacks() -> list[Any]:
    """Checkpoints on validation mAP50-95 (``best.ckpt``) plus ``last.ckpt``, and the LR monitor."""
    return [
        ModelCheckpoint(
            monitor="val/mAP50-95", mode="max", filename="best", save_last=True, auto_insert_metric_name=False
        ),
        LearningRateMonitor(logging_interval="step"),
    ]


class YOLOLightningCLI(LightningCLI):
    """LightningCLI with the dataset's class count and names linked into the model."""

    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.class_names", "model.class_names", apply_on="instantiate")


def run_lightning_cli(args: Sequence[str] | None = None) -> YOLOLightningCLI:
    """Parse ``args`` (``fit --config ...``) and run the subcommand."""
    return YOLOLightningCLI(
        YOLO11Module,
        YOLODataModule,
        args=list(args) if args is not None else None,
        seed_everything_default=0,
        save_config_kwargs={"overwrite": True},
        trainer_defaults={"callbacks": default_callbacks()},
    )
