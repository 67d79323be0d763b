"""LightningCLI for ``yolo11-lightning fit|validate|test|predict``."""

from __future__ import annotations

import os
import re
import signal
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import Callback, ProgressBar
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from yolo11_lightning.cli.launched_ranks import end_launched_ranks
from yolo11_lightning.cli.packaged_configs import packaged_config_names
from yolo11_lightning.cli.parser_errors import OneLineErrorParser
from yolo11_lightning.cli.resume import (
    check_global_batch,
    check_resume,
    rank_zero_warn_line,
    resolve_last_checkpoint,
    resume_command,
    warn_shared_rendezvous_store,
)
from yolo11_lightning.data.loader_workers import end_loader_workers
from yolo11_lightning.errors import UserInputError
from yolo11_lightning.model_files.exported_files import is_exported_file
from yolo11_lightning.model_files.weights import file_task
from yolo11_lightning.tasks.resolution import TaskClaim, TaskError, resolve_task
from yolo11_lightning.training.callbacks.checkpoints import BestCheckpoint, LastCheckpoint
from yolo11_lightning.training.callbacks.closing_summary import ClosingSummary
from yolo11_lightning.training.callbacks.epoch_lines import EpochLines
from yolo11_lightning.training.callbacks.hang_watchdog import HangWatchdog
from yolo11_lightning.training.callbacks.learning_rates import LearningRates
from yolo11_lightning.training.callbacks.machine import MachineSettings
from yolo11_lightning.training.callbacks.model_summary import count_flops_in_summary
from yolo11_lightning.training.callbacks.result_pictures import ResultPictures
from yolo11_lightning.training.callbacks.throughput import Throughput
from yolo11_lightning.training.checkpointing import use_atomic_checkpoints
from yolo11_lightning.training.datamodule import YOLODataModule, dataset_kpt_shape, dataset_task_claim
from yolo11_lightning.training.loggers import (
    CodeVersion,
    VersionedSaveConfig,
    default_loggers,
    evaluation_folder,
)
from yolo11_lightning.training.module import YOLO11Module
from yolo11_lightning.training.preemption import (
    StoppedBeforeTraining,
    TrainingPreempted,
    stop_signals_end_startup,
)
from yolo11_lightning.training.pretrained import weights_task_claim

# Trainer defaults of the CLI that differ from Lightning's own: the reference trainer's 100 epochs.
TRAINER_DEFAULTS: dict[str, Any] = {"max_epochs": 100}


# Precisions whose parameters themselves are 16-bit (Lightning's HalfPrecision, Transformer Engine's weights).
_HALF_WEIGHTS = frozenset({"16-true", "bf16-true", "transformer-engine", "transformer-engine-float16"})


def default_callbacks(last: bool = True, checkpoints: bool = True) -> list[Any]:
    """``best.ckpt`` on the task's validation score, an always-current ``last.ckpt`` (unless ``last=False``: the
    CLI adds its own, configured by ``--last_checkpoint.*``), the learning rates (logged when the Trainer has a
    logger), the hang watchdog (stack dumps and the laggard's name when a rank stops making progress), and the
    throughput / data-wait meter, and the closing summary. With ``last=True`` (Python use), also the default
    machine settings and result pictures (the CLI adds its own, ``--machine.*`` and ``--pictures.*``).

    ``checkpoints=False`` leaves both checkpoints out, for ``Trainer(enable_checkpointing=False)`` (Lightning
    refuses any ``ModelCheckpoint`` there) or ``Trainer(barebones=True)``; the CLI does this by itself.
    """
    callbacks: list[Any] = [
        *([BestCheckpoint()] if checkpoints else []),
        LearningRates(logging_interval="step"),
        HangWatchdog(),
        Throughput(),
    ]
    if not last:
        return [*callbacks, ClosingSummary()]
    return [
        *callbacks, MachineSettings(), *([LastCheckpoint()] if checkpoints else []), ResultPictures(),
        ClosingSummary(),
    ]  # fmt: skip


def fit_to_trainer(callbacks: list[Callback], trainer_config: dict[str, Any]) -> list[Callback]:
    """``callbacks`` without our checkpoint callbacks when the Trainer will not checkpoint
    (``enable_checkpointing: false`` or ``barebones: true``): the user asked for no files, and Lightning
    refuses a ``ModelCheckpoint`` there. A ``ModelCheckpoint`` the user added stays, for Lightning to judge."""
    if trainer_config.get("enable_checkpointing") is not False and not trainer_config.get("barebones"):
        return callbacks
    return [c for c in callbacks if not isinstance(c, (BestCheckpoint, LastCheckpoint))]


def progress_for_output(trainer_config: dict[str, Any], callbacks: list[Callback]) -> list[Callback]:
    """``[EpochLines()]`` when stdout is not a terminal and the Trainer would draw a progress bar of its own (none
    named in the callbacks, ``enable_progress_bar`` not false): a log gets a line per epoch, not bar redraws."""
    named = [*callbacks, *(trainer_config.get("callbacks") or [])]
    if trainer_config.get("enable_progress_bar") is False or any(isinstance(c, ProgressBar) for c in named):
        return []
    return [] if sys.stdout.isatty() else [EpochLines()]


class YOLOLightningCLI(LightningCLI):
    """LightningCLI with the dataset's class count and names linked into the model.

    Also: checkpoints are written atomically (``AtomicCheckpointIO``); the run's task is settled in the config
    before the classes are built (``resolve_task``); how ``fit`` starts from a checkpoint (``--ckpt_path last``,
    the global batch) is ``cli.resume``'s to decide, before any process starts; when a run fails in the process
    that launched the other ranks, those ranks are ended too (``cli.launched_ranks``).
    """

    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.class_names", "model.class_names", apply_on="instantiate")
        # Always present, whatever a config does to trainer.callbacks: --last_checkpoint.every_n_minutes etc.
        parser.add_lightning_class_args(LastCheckpoint, "last_checkpoint")
        # Machine settings (compile, keep_host_memory): Trainer-side, not saved with the model.
        parser.add_lightning_class_args(MachineSettings, "machine")
        # Result pictures (curves, confusion matrix, per-class curves, labels, batches): --pictures.curves false...
        parser.add_lightning_class_args(ResultPictures, "pictures")

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        config = self._get(self.config_init, "trainer", default={})
        barebones = bool(config.get("barebones"))  # Lightning refuses any logger there
        if config.get("logger") in (None, True) and "logger" not in kwargs and not barebones:
            # metrics.csv always, plus TensorBoard when installed, in one version folder (loggers.py); validate
            # and test of a training run's checkpoint into <run>/validate or <run>/test.
            command = self.subcommand or ""
            folder = evaluation_folder(command, self._get(self.config_init, "ckpt_path", default=None))
            kwargs["logger"] = (
                default_loggers(config.get("default_root_dir"))
                if folder is None
                else default_loggers(os.path.dirname(folder), name="", version=command)
            )
        try:
            trainer = super().instantiate_trainer(**kwargs)
        except UserInputError:
            raise
        except (MisconfigurationException, ValueError, TypeError) as e:
            # Lightning's own refusal of a Trainer option (devices, precision, strategy...): the user's to fix.
            raise UserInputError(f"--trainer options: {e}") from e
        if trainer.precision in _HALF_WEIGHTS:
            raise UserInputError(
                f"trainer.precision={trainer.precision} keeps the weights, optimiser state and EMA in half "
                "precision, where the EMA's ~1e-4 updates vanish: use --trainer.precision bf16-mixed "
                "(16-mixed without bf16)"
            )
        use_atomic_checkpoints(trainer)
        count_flops_in_summary(trainer)  # the summary's FLOPs, not Lightning's 0 without an example input
        return trainer

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Callback]) -> Trainer:
        # LightningCLI appends trainer_defaults' callbacks to config["callbacks"] inside; ours are filtered
        # there, the extra ones (--last_checkpoint, --machine) here.
        defaults = self.trainer_defaults
        fitted = fit_to_trainer(defaults.get("callbacks", []), config)
        self.trainer_defaults = {**defaults, "callbacks": fitted}
        try:
            extra = fit_to_trainer(callbacks, config)
            return super()._instantiate_trainer(
                config, [*extra, *progress_for_output(config, [*fitted, *extra])]
            )
        finally:
            self.trainer_defaults = defaults

    def _run_guarded(self, name: str, **kwargs: Any) -> Any:
        try:
            with warnings.catch_warnings(), stop_signals_end_startup():
                _ignore_false_alarms(name, kwargs.get("ckpt_path"))
                return getattr(self.trainer, name)(**kwargs)
        except BaseException as error:
            end_loader_workers()  # the run is over: its persistent workers must not hold the process at exit
            if isinstance(error, StoppedBeforeTraining):
                sys.stderr.write(f"[rank pid {os.getpid()}] {error}\n")
            if isinstance(error, TrainingPreempted):
                if error.checkpoint and self.trainer.is_global_zero:
                    command = resume_command(getattr(self, "given_args", []), error.checkpoint)
                    rank_zero_warn_line(f"resume with: {command}")
                # Every rank saved and is leaving on its own: give them a moment before ending the stragglers.
                end_launched_ranks(self.trainer, grace_seconds=15.0)
                raise
            end_launched_ranks(self.trainer)
            if (
                isinstance(error, SystemExit)
                and error.code == 1
                and isinstance(error.__context__, KeyboardInterrupt)
            ):
                # Lightning's own Ctrl-C handling (outside a fit's training, nothing to keep) exits 1.
                raise SystemExit(128 + signal.SIGINT) from None
            raise

    # LightningCLI calls these instead of the Trainer's methods of the same name.
    def fit(self, **kwargs: Any) -> Any:
        if self._nothing_to_fit:
            return None
        return self._run_guarded("fit", **kwargs)

    def validate(self, **kwargs: Any) -> Any:
        return self._run_guarded("validate", **kwargs)

    def test(self, **kwargs: Any) -> Any:
        return self._run_guarded("test", **kwargs)

    def predict(self, **kwargs: Any) -> Any:
        return self._run_guarded("predict", **kwargs)

    def parse_arguments(self, parser: Any, args: Any) -> None:
        # The command line as typed: messages name `--model.task` where it came from (`resolve_task`).
        given = sys.argv[1:] if args is None else args
        self.given_args = [str(a) for a in given] if isinstance(given, list | tuple) else []
        super().parse_arguments(parser, args)

    def before_instantiate_classes(self) -> None:
        self.resolve_task()

    def resolve_task(self) -> None:
        """Set the run's task once, in the config, before the model and the data are built (``tasks.resolution``).

        Named: ``model.task`` (``--model.task``, a model config, or the checkpoint of ``--ckpt_path``, whose
        hyper-parameters Lightning copied into ``model.*``), ``data.task``; else the ``--model.weights`` file's
        task; else the dataset's (a ``kpt_shape`` yaml is pose, ...); else detection. ``model.task`` and
        ``data.task`` both get the result, so checkpoints, ``config.yaml`` and run identities hold it. Every
        process runs this on the same config and files: under DDP all raise the same TaskError, before any
        collective. An ``.onnx`` model file without a named task: the module reads the file's task and the data
        follows it in ``setup``.
        """
        config = self.config[self.subcommand] if self.subcommand else self.config
        model, data = config.get("model"), config.get("data")
        if model is None or data is None or "task" not in model or "task" not in data:
            return
        args = getattr(self, "given_args", [])
        named: list[TaskClaim] = []
        ckpt_path = config.get("ckpt_path")
        ckpt_task = file_task(ckpt_path) if ckpt_path and Path(str(ckpt_path)).is_file() else None
        typed = _typed_value(args, "--model.task")
        if ckpt_task is not None:  # Lightning's `_parse_ckpt_path` put it into model.task, over --model.task
            named.append(
                TaskClaim(ckpt_task, f"model.task={ckpt_task!r} (the checkpoint of --ckpt_path {ckpt_path})")
            )
            if typed is not None:
                named.append(TaskClaim(typed, f"model.task={typed!r} (--model.task)"))
        elif model.task is not None:
            where = "--model.task" if typed == model.task else "config"
            named.append(TaskClaim(model.task, f"model.task={model.task!r} ({where})"))
        if data.task is not None:
            where = "--data.task" if _typed_value(args, "--data.task") == data.task else "config"
            named.append(TaskClaim(data.task, f"data.task={data.task!r} ({where})"))
        dataset = dataset_task_claim(str(data.dataset))
        weights = model.get("weights")
        if not named and is_exported_file(weights):
            if dataset is not None:
                resolve_task([], dataset=dataset)  # refuses a dataset of a task we do not train
            return
        claim = weights_task_claim(weights) if weights and not named else None
        model.task = data.task = resolve_task(named, claim, dataset)
        self._follow_kpt_shape(model, str(data.dataset))

    @staticmethod
    def _follow_kpt_shape(model: Any, dataset: str) -> None:
        """A model with keypoints takes the dataset's ``kpt_shape`` when none is named; a named one that differs
        is refused (one line)."""
        if "kpt_shape" not in model:
            return
        shape = dataset_kpt_shape(dataset, model.task)
        if shape is None:
            return
        if model.kpt_shape is None:
            model.kpt_shape = list(shape)
        elif tuple(model.kpt_shape) != tuple(shape):
            raise UserInputError(
                f"model.kpt_shape={list(model.kpt_shape)} but the dataset {dataset} has kpt_shape {list(shape)}: "
                "the model's keypoints must be the dataset's"
            )

    def check_task(self) -> None:
        """Refuse a model and data of different tasks (a safety net after ``resolve_task``: e.g. a data module
        class of another kind). Every rank runs it before anything starts, on the same config: they all raise
        alike. Data modules without a ``task`` (attribute or hyper-parameter) are not checked.
        """
        data = self.datamodule
        data_task = getattr(data, "task", None) or dict(getattr(data, "hparams", None) or {}).get("task")
        model_task = getattr(getattr(self.model, "task", None), "name", None)
        model_task = model_task or dict(getattr(self.model, "hparams", None) or {}).get("task")
        if data_task is not None and model_task is not None and data_task != model_task:
            raise TaskError(
                f"model.task={model_task!r} but data.task={data_task!r}: the model and the data must be of the "
                "same task; set it once with --model.task (the data follows)"
            )

    def check_splits(self, stage: str) -> None:
        """Refuse, before any process starts, a dataset without the split ``stage`` reads (``test`` without a
        ``test`` split: an error, not val numbers reported as test ones); ``YOLODataModule.check_splits``."""
        check = getattr(self.datamodule, "check_splits", None)
        if check is not None:
            check(stage)

    def before_validate(self) -> None:
        self.check_task()
        self.check_splits("validate")

    def before_test(self) -> None:
        self.check_task()
        self.check_splits("test")

    def before_predict(self) -> None:
        self.check_task()
        self.check_splits("predict")

    def before_fit(self) -> None:
        self.check_task()
        self.check_splits("fit")
        check_global_batch(self.trainer, self.datamodule)
        warn_shared_rendezvous_store()
        config = self.config_init[self.subcommand]
        from_last = resolve_last_checkpoint(config, self.trainer)
        if config.get("ckpt_path") and config["ckpt_path"] not in ("best", "hpc", "registry"):
            self._nothing_to_fit = check_resume(
                str(config["ckpt_path"]), from_last, config.get("seed_everything"), self.trainer, self.model,
                self.datamodule,
            )  # fmt: skip

    _nothing_to_fit = False


def _typed_value(args: Sequence[str], option: str) -> str | None:
    """The last value of ``option`` on the command line (``--x v`` or ``--x=v``); None when not typed."""
    value = None
    for i, arg in enumerate(args):
        if arg == option and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(option + "="):
            value = arg[len(option) + 1 :]
    return value


def _ignore_false_alarms(command: str, ckpt_path: Any) -> None:
    """Filter the Lightning warnings whose premise does not hold for ``command`` here (inside ``catch_warnings``)."""
    if command != "fit":
        # "The WeightAveraging state cannot be restored": validate/test/predict need none of it, and the
        # checkpoint's state_dict already holds the averaged (EMA) weights (``ModelEMA``).
        warnings.filterwarnings(
            "ignore", message=r"You're using the WeightAveraging callback, but loading a checkpoint outside"
        )
    elif ckpt_path:
        # A resume writes into its checkpoint's own folder (``continue_logger_version``): the files Lightning finds
        # there are the run being continued, not another run's about to be overwritten.
        folder = Path(str(ckpt_path)).parent
        where = re.escape(os.sep.join([folder.parent.name, folder.name]))
        warnings.filterwarnings("ignore", message=rf"Checkpoint directory .*{where} exists and is not empty")


def run_lightning_cli(args: Sequence[str] | None = None) -> YOLOLightningCLI:
    """Parse ``args`` (``fit --config ...``) and run the subcommand.

    ``--config`` takes a file or a packaged config name (``quickstart``, ``model/yolo11s``; a path that exists
    wins), also in ``config:`` keys inside config files. ``trainer.logger`` unset means ``default_loggers``
    (CSV, plus TensorBoard when installed); checkpoints and ``config.yaml`` name the code version.
    """
    with packaged_config_names():
        return YOLOLightningCLI(
            YOLO11Module,
            YOLODataModule,
            args=list(args) if args is not None else None,
            parser_class=OneLineErrorParser,
            seed_everything_default=0,
            save_config_callback=VersionedSaveConfig,
            save_config_kwargs={"overwrite": True},
            trainer_defaults={
                **TRAINER_DEFAULTS,
                "callbacks": [*default_callbacks(last=False), CodeVersion()],
            },
        )
