"""LightningCLI for ``yolo11-lightning fit|validate|test|predict``."""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence
from typing import Any

from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from yolo11_lightning.data.datamodule import YOLODataModule
from yolo11_lightning.training.checkpointing import find_last_checkpoint, use_atomic_checkpoints
from yolo11_lightning.training.module import YOLO11Module

# Trainer defaults of the CLI that differ from Lightning's own: the reference trainer's 100 epochs.
TRAINER_DEFAULTS: dict[str, Any] = {"max_epochs": 100}


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
    before any process starts; when a run fails in the process that launched the other ranks, those ranks
    are ended too instead of being left waiting in a collective.
    """

    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.class_names", "model.class_names", apply_on="instantiate")

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        trainer = super().instantiate_trainer(**kwargs)
        use_atomic_checkpoints(trainer)
        return trainer

    def _run_guarded(self, name: str, **kwargs: Any) -> Any:
        try:
            return getattr(self.trainer, name)(**kwargs)
        except BaseException:
            end_launched_ranks(self.trainer)
            raise

    # LightningCLI calls these instead of the Trainer's methods of the same name.
    def fit(self, **kwargs: Any) -> Any:
        return self._run_guarded("fit", **kwargs)

    def validate(self, **kwargs: Any) -> Any:
        return self._run_guarded("validate", **kwargs)

    def test(self, **kwargs: Any) -> Any:
        return self._run_guarded("test", **kwargs)

    def predict(self, **kwargs: Any) -> Any:
        return self._run_guarded("predict", **kwargs)

    def before_fit(self) -> None:
        world = self.trainer.num_nodes * self.trainer.num_devices
        batch = getattr(self.datamodule, "batch_size", None)
        if batch is not None and batch % world:
            fits = [n for n in (batch // world * world, (batch // world + 1) * world) if n]
            raise ValueError(
                f"data.batch_size={batch} is the GLOBAL batch and must divide by the world size {world} "
                f"(trainer.num_nodes={self.trainer.num_nodes} x trainer.devices={self.trainer.num_devices}); "
                f"e.g. data.batch_size={' or '.join(map(str, fits))}"
            )
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and int(
            os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")
        ):
            rank_zero_warn(
                "torchrun --max-restarts with the workers sharing torchrun's rendezvous store: after a restart the "
                "new workers can read the dead ones' addresses and fail to connect (pytorch/pytorch#135712). "
                "Launch torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (scripts/torchrun_node.sh does)."
            )
        config = self.config_init[self.subcommand]
        if config.get("ckpt_path") == "last":
            config["ckpt_path"] = find_last_checkpoint(self.trainer)
            rank_zero_info(
                f"--ckpt_path last: resuming from {config['ckpt_path']}"
                if config["ckpt_path"]
                else "--ckpt_path last: no checkpoint yet, starting fresh"
            )


def end_launched_ranks(trainer: Trainer) -> None:
    """SIGKILL the ranks this process launched (Lightning's own launcher, ``devices > 1`` without torchrun).

    Lightning ends them itself only on Ctrl+C, or when one of them exits with an error. When this process
    fails instead, e.g. a collective timed out because another rank hangs, the launched ranks would be
    left behind holding their devices. Under torchrun or srun the launcher does this job.
    """
    launcher = getattr(trainer.strategy, "launcher", None)
    if isinstance(launcher, _SubprocessScriptLauncher):
        launcher.kill(signal.SIGKILL)


def run_lightning_cli(args: Sequence[str] | None = None) -> YOLOLightningCLI:
    """Parse ``args`` (``fit --config ...``) and run the subcommand."""
    return YOLOLightningCLI(
        YOLO11Module,
        YOLODataModule,
        args=list(args) if args is not None else None,
        seed_everything_default=0,
        save_config_kwargs={"overwrite": True},
        trainer_defaults={**TRAINER_DEFAULTS, "callbacks": default_callbacks()},
    )
