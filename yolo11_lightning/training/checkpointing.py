"""Crash-safe checkpoint files, and finding the newest ``last`` checkpoint of a run to resume from.

Lightning's ``TorchCheckpointIO`` serialises into memory, then writes through an fsspec transaction
whose temporary file lives in the system temp folder. When that folder is on another filesystem than
the checkpoints (node-local ``/tmp``, checkpoints on NFS or Lustre: the usual cluster layout), the final
move is a copy, and a job killed during it leaves a truncated ``last.ckpt``; nothing is fsynced either.
``AtomicCheckpointIO`` writes next to the target, fsyncs, and renames over it: a reader, or a restarted
job, sees the previous complete file or the new complete file, never a mix.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

log = logging.getLogger(__name__)

TEMP_MARK = ".tmp-"


def atomic_torch_save(obj: Any, path: str | os.PathLike[str]) -> None:
    """Saves like torch.save(obj, path) but never leaves a partial file under ``path``.

    Streams into ``.<name>.tmp-<pid>`` in the same folder (no second in-memory copy of the checkpoint),
    fsyncs it, ``os.replace``-s it over ``path`` (atomic within one POSIX filesystem) and fsyncs the
    folder so the rename itself survives a power loss. Temporary files left by a killed earlier write of
    the same target are removed first.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}{TEMP_MARK}*"):
        stale.unlink(missing_ok=True)
    temp = path.with_name(f".{path.name}{TEMP_MARK}{os.getpid()}")
    try:
        with open(temp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    # Some filesystems refuse fsync on a directory; the rename is still atomic there.
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


class AtomicCheckpointIO(TorchCheckpointIO):
    """TorchCheckpointIO whose local writes are atomic (``atomic_torch_save``).

    Remote URLs (``s3://``, ``gs://``, ...) keep Lightning's implementation: object stores publish an
    object only once its upload completes. Loading and removal are Lightning's.
    """

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        target = str(path)
        if storage_options is not None or not _is_local(target):
            super().save_checkpoint(checkpoint, path, storage_options=storage_options)
            return
        atomic_torch_save(checkpoint, target.removeprefix("file://"))

    def load_checkpoint(
        self,
        path: Any,
        map_location: Any | None = lambda storage, loc: storage,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        """Loads a checkpoint with torch's weights-only loader after model_files.torch_file.load's checks.

        The checks are the archive, the claimed sizes and a restricted unpickler; then ``weights_only=True``
        loads the same open file. Errors are a CheckpointError naming the file.

        ``weights_only=False`` passed explicitly (a caller that trusts the file) and ``http(s)`` URLs keep
        Lightning's loader.
        """
        from lightning.fabric.utilities.cloud_io import get_filesystem

        from yolo11_lightning.model_files.torch_file import load

        target = str(path)
        if weights_only is False or target.startswith(("http://", "https://")):
            return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        fs = get_filesystem(target)
        if not fs.exists(target):
            raise FileNotFoundError(f"Checkpoint file not found: {target}")
        with fs.open(target, "rb") as f:
            return load(f, map_location=map_location, label=target)


def use_atomic_checkpoints(trainer: L.Trainer) -> None:
    """Gives the trainer an AtomicCheckpointIO unless a custom checkpoint IO was configured."""
    if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:
        trainer.strategy.checkpoint_io = AtomicCheckpointIO()


def _checkpoint_folders(trainer: L.Trainer, callback: ModelCheckpoint) -> list[Path]:
    """Lists every folder ``callback`` writes to, over all logger versions; a restart starts a new version."""
    if callback.dirpath is not None:
        return [Path(str(callback.dirpath))]
    if trainer.loggers:
        logger = trainer.loggers[0]
        save_dir = logger.save_dir if logger.save_dir is not None else trainer.default_root_dir
        # <save_dir>/<name>/<version>/checkpoints, as ModelCheckpoint resolves it; every version.
        return sorted((Path(str(save_dir)) / str(logger.name)).glob("*/checkpoints"))
    return [Path(trainer.default_root_dir) / "checkpoints"]


def find_last_checkpoint(trainer: L.Trainer) -> str | None:
    """Finds the newest last*.ckpt of this run's checkpoint callbacks, or SLURM's hpc_ckpt_*.ckpt, if any.

    Lightning's own ``ckpt_path="last"`` only looks in the *current* logger version's folder; after a
    restart the logger opens a new version, so it finds nothing and silently starts over. This looks in
    every version folder and takes the most recently written file, as Lightning does among its candidates.
    Checkpoints must be on a filesystem that every node sees (each rank loads the file itself).
    """
    candidates: set[Path] = set()
    for callback in trainer.checkpoint_callbacks:
        if not isinstance(callback, ModelCheckpoint):
            continue
        for folder in _checkpoint_folders(trainer, callback):
            if not _is_local(str(folder)):
                continue
            last = callback.CHECKPOINT_NAME_LAST or "last"
            candidates.update(p for p in folder.glob(f"{last}*{callback.FILE_EXTENSION}") if p.is_file())
    # Lightning's SLURM auto-requeue (SIGUSR1) saves here.
    candidates.update(Path(trainer.default_root_dir).glob("hpc_ckpt_*.ckpt"))
    if not candidates:
        return None
    return str(max(candidates, key=lambda p: p.stat().st_mtime_ns))


def continue_logger_version(trainer: L.Trainer, checkpoint_path: str) -> None:
    """Write a resumed run into the logger version folder its checkpoint lives in.

    A checkpoint at ``<save_dir>/<name>/<version>/checkpoints/x.ckpt`` makes a CSV or TensorBoard logger with
    that save_dir and name reuse ``<version>``: the run keeps one folder (metrics.csv appended, the same
    ``best.ckpt`` and ``last.ckpt``, so the best score carries on), instead of a new version per restart.
    Must run before anything reads ``trainer.log_dir``; other loggers are left alone.
    """
    path = Path(checkpoint_path).resolve()
    if path.parent.name != "checkpoints" or not trainer.loggers:
        return
    logger = trainer.loggers[0]
    if not isinstance(logger, CSVLogger | TensorBoardLogger) or logger.save_dir is None:
        return
    version_dir = path.parent.parent
    if version_dir.parent == (Path(str(logger.save_dir)) / str(logger.name)).resolve():
        # Both loggers read their version lazily from here; a number when the folder is ``version_<N>`` (the
        # progress bar shows it as v_num, a string's last 4 characters: "on_0").
        number = re.fullmatch(r"version_(\d+)", version_dir.name)
        logger._version = int(number[1]) if number else version_dir.name
