"""LightningCLI for ``yolo11-lightning fit|validate|test|predict``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities import rank_zero_info

from yolo11_lightning.data.datamodule import YOLODataModule
from yolo11_lightning.training.checkpointing import find_last_checkpoint, use_atomic_checkpoints
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
    """LightningCLI with the dataset's class count and names linked into the model.

    Also: checkpoints are written atomically (``AtomicCheckpointIO``); ``fit --ckpt_path last`` finds the
    newest ``last*.ckpt`` of earlier runs in any logger version and starts fresh when there is none (so a
    restart loop can always pass it); a global batch that does not divide by the world size is refused
    before any process starts.
    """

    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.class_names", "model.class_names", apply_on="instantiate")

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        trainer = super().instantiate_trainer(**kwargs)
        use_atomic_checkpoints(trainer)
        return trainer

    def before_fit(self) -> None:
        world = self.trainer.num_nodes * self.trainer.num_devices
        batch = getattr(self.datamodule, "batch_size", None)
        if batch is not None and batch % world:
            raise ValueError(
                f"data.batch_size={batch} is the GLOBAL batch and must divide by the world size {world} "
                f"(trainer.num_nodes={self.trainer.num_nodes} x trainer.devices={self.trainer.num_devices}); "
                f"e.g. data.batch_size={max(world, batch // world * world)}"
            )
        config = self.config_init[self.subcommand]
        if config.get("ckpt_path") == "last":
            config["ckpt_path"] = find_last_checkpoint(self.trainer)
            rank_zero_info(
                f"--ckpt_path last: resuming from {config['ckpt_path']}"
                if config["ckpt_path"]
                else "--ckpt_path last: no checkpoint yet, starting fresh"
            )


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
