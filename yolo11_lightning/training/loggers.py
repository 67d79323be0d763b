"""The CLI's default loggers, and which code made a run (package version + git revision).

Lightning's own default is TensorBoard when ``tensorboard`` is installed and CSV otherwise, so installing
TensorBoard silently removes ``metrics.csv``. ``default_loggers`` gives both instead: a ``CSVLogger`` always
(first, so ``trainer.log_dir``, the checkpoint folder and resuming follow it) and a ``TensorBoardLogger``
when TensorBoard is importable, writing into the SAME ``<save_dir>/lightning_logs/version_N`` folder:
``metrics.csv``, ``checkpoints/``, ``config.yaml`` and the event file sit together, and a resumed run
(``continue_logger_version`` sets the CSV logger's version) continues that folder for both: TensorBoard
adds an event file, ``metrics.csv`` gets the new rows appended.
"""

from __future__ import annotations

import csv
import os
import warnings
from argparse import Namespace
from typing import Any

from lightning.fabric.loggers.tensorboard import _TENSORBOARD_AVAILABLE
from lightning.fabric.utilities.logger import _convert_params
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from yolo11_lightning.version import code_version

CODE_VERSION_KEY = "yolo11_lightning"  # checkpoint["yolo11_lightning"], hparams "yolo11_lightning/..."


def with_code_version(params: dict[str, Any] | Namespace) -> dict[str, Any]:
    """Adds {"yolo11_lightning": {"version", "git_revision"}} to ``params``."""
    return {**_convert_params(params), CODE_VERSION_KEY: code_version()}


class RunCSVLogger(CSVLogger):
    """CSVLogger whose ``hparams.yaml`` also names the code version, and that appends to the
    ``metrics.csv`` of a resumed run (Lightning's writer deletes the file it finds in its folder)."""

    @property
    def experiment(self) -> Any:
        if self._experiment is not None:
            return self._experiment
        if rank_zero_only.rank != 0:  # the other ranks get Lightning's dummy and must not touch the file
            return CSVLogger.experiment.fget(self)  # type: ignore[attr-defined]
        path = os.path.join(self.log_dir, "metrics.csv")
        kept = self._fs.cat_file(path) if self._fs.isfile(path) else None
        with warnings.catch_warnings():
            # "... exists and is not empty. Previous log files in this directory will be deleted": not here, a
            # resumed run's metrics.csv is put back below and appended to.
            warnings.filterwarnings("ignore", message=r"Experiment logs directory .* exists and is not empty")
            experiment = CSVLogger.experiment.fget(self)  # type: ignore[attr-defined]
        if kept and self._experiment is not None:  # rank zero made the writer (and removed the file)
            with self._fs.open(path, "wb") as f:
                f.write(kept)
            header = kept.decode("utf-8").splitlines()[0]
            experiment.metrics_keys = sorted(next(csv.reader([header])))
        return experiment

    def log_hyperparams(self, params: dict[str, Any] | Namespace | None = None) -> None:
        super().log_hyperparams(with_code_version(params or {}))


class RunTensorBoardLogger(TensorBoardLogger):
    """TensorBoardLogger that writes into the version folder of ``follow`` (a CSV logger with the same
    ``save_dir`` and ``name``) instead of picking its own next version; hparams name the code version."""

    def __init__(self, follow: CSVLogger, **kwargs: Any) -> None:
        super().__init__(save_dir=follow.save_dir, name=follow.name, **kwargs)
        self._follow = follow

    @property
    def version(self) -> int | str:
        return self._follow.version

    def log_hyperparams(
        self,
        params: dict[str, Any] | Namespace,
        metrics: dict[str, Any] | None = None,
        step: int | None = None,
    ) -> None:
        super().log_hyperparams(with_code_version(params), metrics=metrics, step=step)


def tensorboard_available() -> bool:
    return bool(_TENSORBOARD_AVAILABLE)


def default_loggers(
    save_dir: str | os.PathLike[str] | None = None, name: str = "lightning_logs", version: str | None = None
) -> list[Logger]:
    """Returns [RunCSVLogger], plus a RunTensorBoardLogger into the same folder when TensorBoard is installed.

    ``save_dir``: the trainer's ``default_root_dir`` (the working folder when ``None``, as Lightning);
    ``<save_dir>/<name>/<version>``, the next ``version_N`` when ``version`` is ``None``.
    """
    where = os.fspath(save_dir) if save_dir is not None else os.getcwd()
    csv = RunCSVLogger(save_dir=where, name=name, version=version)
    if not tensorboard_available():
        return [csv]
    return [csv, RunTensorBoardLogger(follow=csv)]


def evaluation_folder(command: str, ckpt_path: Any) -> str | None:
    """Returns where validate or test of a training run's checkpoint write, beside the run's own files.

    For a checkpoint at ``<run>/checkpoints/x.ckpt`` that is ``<run>/<command>``, instead of a new
    ``version_N`` that reads as another training run. None for any other command or checkpoint: the default
    place.
    """
    if command not in ("validate", "test") or not ckpt_path or not os.path.isfile(str(ckpt_path)):
        return None
    folder = os.path.dirname(os.path.abspath(str(ckpt_path)))
    if os.path.basename(folder) != "checkpoints":
        return None
    return os.path.join(os.path.dirname(folder), command)


class CodeVersion(Callback):
    """Stores ``{"version", "git_revision"}`` of the running code as ``checkpoint["yolo11_lightning"]``."""

    def on_save_checkpoint(
        self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        checkpoint[CODE_VERSION_KEY] = code_version()


class VersionedSaveConfig(SaveConfigCallback):
    """LightningCLI's ``config.yaml``, headed by a comment naming the code version that ran it (a comment,
    so the file still loads with ``--config``)."""

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        first = not self.already_saved  # the same on every rank (LightningCLI broadcasts it)
        # trainer.log_dir broadcasts: read it on every rank, before rank zero goes its own way.
        log_dir = trainer.log_dir if first and self.save_to_log_dir else None
        super().setup(trainer, pl_module, stage)
        if log_dir is None or not trainer.is_global_zero:
            return
        path = os.path.join(log_dir, self.config_filename)
        if os.path.isfile(path):
            info = code_version()
            with open(path, encoding="utf-8") as f:
                text = f.read()
            header = f"# yolo11_lightning {info['version']}, git revision {info['git_revision']}\n"
            with open(path, "w", encoding="utf-8") as f:
                f.write(header + text)
