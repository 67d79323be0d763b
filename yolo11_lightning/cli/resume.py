"""Decide how ``fit`` starts from a checkpoint: ``--ckpt_path last``, the global batch, another run, a finished one.

Every process runs these checks before training starts, on the same config and files, so all decide alike: the
global batch must divide by the world size and equal the checkpoint's; ``--ckpt_path last`` finds the newest
``last*.ckpt`` of earlier runs (a fresh start when there is none, so a restart loop can always pass it) and refuses
one of another run; a finished run trains nothing more. ``resume_command`` says how to continue a stopped run.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from lightning.pytorch import LightningDataModule, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only, rank_zero_warn

from yolo11_lightning.errors import UserInputError
from yolo11_lightning.training.checkpointing import continue_logger_version, find_last_checkpoint
from yolo11_lightning.training.run_identity import CheckpointSummary, differences, identity


def check_global_batch(trainer: Trainer, datamodule: LightningDataModule | None) -> None:
    """Refuse a global ``data.batch_size`` that does not divide by the world size, naming two that do."""
    world = trainer.num_nodes * trainer.num_devices
    batch = getattr(datamodule, "batch_size", None)
    if batch is not None and batch % world:
        fits = [n for n in (batch // world * world, (batch // world + 1) * world) if n]
        raise UserInputError(
            f"data.batch_size={batch} is the GLOBAL batch and must divide by the world size {world} "
            f"(trainer.num_nodes={trainer.num_nodes} x trainer.devices={trainer.num_devices}); "
            f"e.g. data.batch_size={' or '.join(map(str, fits))}"
        )


def warn_shared_rendezvous_store() -> None:
    """Warn when torchrun restarts workers that share its rendezvous store (they can fail to connect)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and int(
        os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")
    ):
        rank_zero_warn(
            "torchrun --max-restarts with the workers sharing torchrun's rendezvous store: after a restart the "
            "new workers can read the dead ones' addresses and fail to connect (pytorch/pytorch#135712). "
            "Launch torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (scripts/torchrun_node.sh does)."
        )


def resolve_last_checkpoint(config: dict[str, Any], trainer: Trainer) -> bool:
    """Replace ``ckpt_path: last`` in ``config`` by the newest ``last*.ckpt`` (None: start fresh); True if it was
    ``last``."""
    if config.get("ckpt_path") != "last":
        return False
    config["ckpt_path"] = find_last_checkpoint(trainer)
    rank_zero_info(
        f"--ckpt_path last: resuming from {config['ckpt_path']}"
        if config["ckpt_path"]
        else "--ckpt_path last: no checkpoint yet, starting fresh"
    )
    return True


def check_resume(
    path: str,
    from_last: bool,
    seed: Any,
    trainer: Trainer,
    model: LightningModule,
    datamodule: LightningDataModule | None,
) -> bool:
    """Refuse a checkpoint of another run (``last``) or of another global batch; True when its run is finished
    (nothing to fit). Otherwise the loggers continue the checkpoint's version folder."""
    saved = CheckpointSummary.read(path)
    batch = getattr(datamodule, "batch_size", None)
    if saved.global_batch is not None and batch is not None and saved.global_batch != batch:
        raise UserInputError(
            f"{path} was trained with data.batch_size={saved.global_batch} (the GLOBAL batch); resuming with "
            f"data.batch_size={batch} would change the data order and the recipe. Resume with "
            f"data.batch_size={saved.global_batch} (the per-device batch follows the number of devices)."
        )
    current = identity(model.hparams, getattr(datamodule, "hparams", {}), seed)
    changed = differences(saved.identity, current)
    if changed and from_last:
        raise UserInputError(
            f"--ckpt_path last found {path}, a checkpoint of another run: "
            + "; ".join(changed)
            + ". Start the new experiment in another trainer.default_root_dir, or pass that checkpoint's "
            "path as --ckpt_path to continue it with the new settings."
        )
    if changed:
        rank_zero_warn(f"resuming {path} with changed settings: " + "; ".join(changed))
    if saved.finished(trainer.max_epochs, trainer.max_steps):
        rank_zero_info(
            f"{path}: this run already finished ({saved.epochs_completed} epochs, global step "
            f"{saved.global_step}; trainer.max_epochs={trainer.max_epochs}, trainer.max_steps="
            f"{trainer.max_steps}). Nothing to train: raise trainer.max_epochs to train longer."
        )
        return True
    continue_logger_version(trainer, path)
    return False


def resume_command(given_args: Sequence[str], checkpoint: str) -> str:
    """The command line that continues a stopped run: as typed, with ``--ckpt_path`` naming ``checkpoint``."""
    args, skip = [], False
    for arg in given_args:
        if skip:
            skip = False
        elif arg == "--ckpt_path":
            skip = True
        elif not arg.startswith("--ckpt_path="):
            args.append(arg)
    return shlex.join(["yolo11-lightning", *args, "--ckpt_path", checkpoint])


def rank_zero_warn_line(message: str) -> None:
    """One line on stderr from global rank zero (not a Python warning: no file and line number to it)."""
    if rank_zero_only.rank == 0:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
