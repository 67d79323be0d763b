"""YOLO11Module: the detector (or segmenter), its loss and the reference optimisation recipe as a LightningModule."""

from __future__ import annotations

import logging
import math
import os
import warnings
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import BatchSizeFinder, Callback, LearningRateFinder
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.warnings import PossibleUserWarning
from torch import Tensor

from yolo11_lightning.errors import UserInputError
from yolo11_lightning.metrics.class_results import ClassResults
from yolo11_lightning.metrics.detection import DetectionMAP
from yolo11_lightning.model_files.onnx_runtime import OnnxDetector, is_onnx_file, refuse_training
from yolo11_lightning.nn.scales import SCALES
from yolo11_lightning.structures.batch import DetectionBatch, ImageBatch
from yolo11_lightning.tasks import create_model, get_task
from yolo11_lightning.tasks.choice import choose_task
from yolo11_lightning.training.callbacks.ema import ModelEMA
from yolo11_lightning.training.callbacks.machine import MACHINE_DEFAULTS, MachineSettings
from yolo11_lightning.training.callbacks.recipe import ReferenceRecipe, global_batch_size
from yolo11_lightning.training.callbacks.unreadable_images import UnreadableImages
from yolo11_lightning.training.callbacks.validation_images import ValidationImages
from yolo11_lightning.training.faults import NonFiniteStepGuard
from yolo11_lightning.training.host_memory import keep_freed_host_memory
from yolo11_lightning.training.optim import (
    LRScaling,
    OptimizerName,
    OptimizerRecipe,
    build_optimizer,
    nominal_accumulation,
)
from yolo11_lightning.training.pretrained import load_pretrained, weights_task_claim
from yolo11_lightning.training.step_exchange import StepExchange

log = logging.getLogger(__name__)

# Lightning advises sync_dist=True for epoch-level logs under DDP; the evaluation metrics are global already.
warnings.filterwarnings(
    "ignore", message=r"It is recommended to use `self\.log\('(val|test)/", category=PossibleUserWarning
)


# Lightning 2.6 tests `isinstance(spec, LeafSpec)`, which torch deprecates since 2.9: a warning at every start that
# no user can act on (Lightning's to change). Only that message is silenced.
warnings.filterwarnings(
    "ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning
)


class _WithoutCloudTips(logging.Filter):
    """Lightning 2.6 advertises its cloud services (LitLogger, LitModels) at Trainer starts: lines no run needs."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip: For seamless cloud")


logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_WithoutCloudTips())


def refuse_tuners(trainer: L.Trainer) -> None:
    """Refuse Lightning's tuners (``LearningRateFinder``, ``BatchSizeFinder``, ``Tuner``), naming what to set.

    Both change a setting while training runs, under assumptions this module does not meet: the learning rate
    follows the reference recipe step by step (warmup from ``warmup_bias_lr``, then ``lr0`` to ``lr0 * lrf``),
    which overrides any trial schedule, and ``data.batch_size`` is the global batch the data order, the
    nominal-batch accumulation and every resume depend on.
    """
    for callback in trainer.callbacks:
        if isinstance(callback, LearningRateFinder):
            raise UserInputError(
                "LearningRateFinder is not supported: the learning rate follows the reference recipe at every "
                "step (warmup, then lr0 -> lr0 * lrf), which would override its trial schedule; set --model.lr0 "
                "(or --model.optimizer auto, which picks lr0 from the dataset size)"
            )
        if isinstance(callback, BatchSizeFinder):
            raise UserInputError(
                "BatchSizeFinder is not supported: data.batch_size is the global batch that the data order, the "
                "nominal-batch accumulation and resuming depend on, so it is not changed during a run; set "
                "--data.batch_size (it is split over the devices)"
            )


class YOLO11Module(L.LightningModule):
    """Train, validate and predict with a YOLO11 detector or instance segmenter.

    Batches follow the DataModule contract (``images`` uint8 (B, 3, H, W), ``targets`` (N, 6), per-image
    letterbox metadata). Images become float on the device. The loss is scaled so that gradients equal the
    reference trainer's for the same *global* batch whatever the number of devices: the loss normaliser is
    summed over ranks, and the scale undoes DDP's gradient averaging and Lightning's accumulation division.

    The task (``tasks.base``) decides the head, the loss, the metric and what predict returns: ``detect``
    (box mAP; (n, 6) detections) or ``segment`` (YOLO11-seg: ``SegmentationBatch`` input, box and mask mAP,
    detections with masks).

    Args:
        scale: YOLO11 scale, one of n, s, m, l, x.
        num_classes: class count (the CLI links it from the dataset).
        class_names: class names, index = class id (linked from the dataset).
        weights: optional reference ``.pt`` or our ``.ckpt``/weights file to start from; the class head keeps
            its fresh initialisation when the class count differs. An exported ``.onnx`` file replaces the
            detector with ``model_files.onnx_runtime.OnnxDetector`` (ONNX Runtime) for validate/test/predict; fit refuses it.
        weights_strict: refuse ``weights`` unless every tensor outside the class head fits (another scale or
            task is an error naming it); ``False`` loads whatever fits and warns.
        optimizer: ``auto`` (the reference's default: AdamW for short runs, SGD past 10k iterations, chosen
            once at fit start and kept by resumes), ``SGD`` or ``AdamW``.
        lr0, lrf, momentum, weight_decay, warmup_*, cos_lr: the reference recipe (``auto`` ignores lr0 and the
            optimiser's momentum, and warms the bias LR from 0).
        lr_scaling: ``none | linear | sqrt`` scaling of lr0 by global batch / ``lr_reference_batch``.
        nominal_batch: images per optimiser step the recipe is tuned for (accumulation and decay follow it).
        box, cls, dfl: loss gains.
        ema, ema_decay, ema_tau: exponential moving average of the weights (used for validation and saving).
        conf_threshold, iou_threshold, max_detections: post-processing for validation and prediction;
            ``conf_threshold=None`` takes the task's (``Task.validation_conf``: 0.001, OBB 0.01, as the reference's
            validator picks) and is stored resolved in the hyper-parameters.
        reference_style_map: also log ``val/mAP50-95_reference_style`` (and ``test/``), the mAP by the
            reference validator's rules, beside the COCO one (``metrics.reference_ap``).
        grad_clip_norm: gradient norm clip (0 disables).
        log_images: validation images drawn with predictions each epoch (0 disables).
        max_skipped_steps: optimiser steps with a NaN/inf loss are skipped on every rank together; this many in
            a row stop the run with a clear error (0: never stop).
        channels_last: keep weights and activations in NHWC memory layout (on by default: +20-30% training
            images/s on oneDNN CPUs, the layout Tensor Cores want; the numbers stay the same up to float
            rounding). Turn off to train in PyTorch's default NCHW layout.
        task: ``detect`` or ``segment`` (``configs/model/yolo11*-seg.yaml``). None (default): the task of the
            ``weights`` file (read from its header: ``model_files.weights.file_task``; an ``.onnx`` file's
            metadata), else detection. A given task keeps it whatever ``weights`` holds (fine-tuning from
            another task's file loads what fits). The data follows it (``YOLODataModule(task=None)``).
            Checkpoints and ``hparams`` keep the resolved task. ``obb`` and ``classify`` are refused
            (one-line TaskError): their models and losses exist, their data, metrics and prediction not yet.
        kpt_shape: [K, D], keypoints per instance and values per keypoint, for a pose model (None: [17, 3]; the
            CLI sets the dataset's); kept in ``hparams`` and checkpoints beside ``num_classes``. Refused for
            other tasks.
    """

    def __init__(
        self,
        scale: str = "n",
        num_classes: int = 80,
        class_names: list[str] | None = None,
        weights: str | None = None,
        weights_strict: bool = True,
        optimizer: OptimizerName = "auto",
        lr0: float = 0.01,
        lrf: float = 0.01,
        momentum: float = 0.937,
        weight_decay: float = 5e-4,
        warmup_epochs: float = 3.0,
        warmup_momentum: float = 0.8,
        warmup_bias_lr: float = 0.1,
        cos_lr: bool = False,
        lr_scaling: LRScaling = "none",
        lr_reference_batch: int = 64,
        nominal_batch: int = 64,
        box: float = 7.5,
        cls: float = 0.5,
        dfl: float = 1.5,
        ema: bool = True,
        ema_decay: float = 0.9999,
        ema_tau: float = 2000.0,
        conf_threshold: float | None = None,
        iou_threshold: float = 0.7,
        max_detections: int = 300,
        grad_clip_norm: float = 10.0,
        log_images: int = 4,
        max_skipped_steps: int = 10,
        channels_last: bool = True,
        reference_style_map: bool = False,
        task: str | None = None,
        kpt_shape: list[int] | None = None,
    ) -> None:
        super().__init__()
        if isinstance(
            weights, os.PathLike
        ):  # a string in the checkpoint's hyper-parameters (plain data only)
            weights = os.fspath(weights)
        onnx = None
        if is_onnx_file(weights):  # an exported model, run by ONNX Runtime: validate/test/predict only
            onnx = OnnxDetector(weights, num_classes, task=task)  # task None: the file's
            task = onnx.task
        elif task is None:  # the weights file's task (its header only), else detection
            claim = weights_task_claim(weights) if weights else None
            task = choose_task([], weights=claim)
        self.save_hyperparameters()  # after `task` is resolved: hparams hold the task, never None
        # LightningCLI hands its config as the hyper-parameters: a task the file named is not in it (.onnx).
        self.hparams["task"] = task
        initial = getattr(self, "_hparams_initial", None)  # Lightning's copy for the loggers
        if initial is not None:
            initial["task"] = task
        if class_names is not None and len(class_names) != num_classes:
            raise UserInputError(f"class_names has {len(class_names)} names but num_classes is {num_classes}")
        if scale not in SCALES:
            raise UserInputError(
                f"model.scale={scale!r} is not a YOLO11 scale; choose one of {', '.join(SCALES)}"
            )
        self.task = get_task(task)
        if conf_threshold is None:
            self.hparams["conf_threshold"] = self.task.validation_conf
            if initial is not None:
                initial["conf_threshold"] = self.task.validation_conf
        try:
            self.model = create_model(scale=scale, num_classes=num_classes, task=task, kpt_shape=kpt_shape)
        except ValueError as e:  # a kpt_shape for a task without keypoints, or not [K, D]
            raise UserInputError(f"model.kpt_shape: {e}") from None
        self.model.names = list(class_names) if class_names is not None else None
        if onnx is not None:
            self.model = onnx
        elif weights:
            load_pretrained(self.model, weights, strict=weights_strict)
        if channels_last:  # before the EMA callback copies the model, so the copy is NHWC too
            self.model.to(memory_format=torch.channels_last)
        self.criterion = self.task.build_loss(self.model, box, cls, dfl)
        self.recipe = OptimizerRecipe(
            name=optimizer, lr0=lr0, lrf=lrf, momentum=momentum, weight_decay=weight_decay,
            warmup_epochs=warmup_epochs, warmup_momentum=warmup_momentum, warmup_bias_lr=warmup_bias_lr,
            cos_lr=cos_lr, lr_scaling=lr_scaling, lr_reference_batch=lr_reference_batch,
            nominal_batch=nominal_batch,
        )  # fmt: skip
        self.val_map = self.task.make_metric(class_names, reference_style=reference_style_map)
        self.test_map = self.task.make_metric(class_names, reference_style=reference_style_map)
        self.resolved_recipe: OptimizerRecipe | None = None  # set at fit start, or restored from a checkpoint
        # Warmup, accumulation ramp and loss scale: the reference's loop, driven from a callback (recipe.py).
        self.loop_recipe = ReferenceRecipe()
        self.step_guard = NonFiniteStepGuard(max_skipped_steps)
        # The training step's one collective (loss normalisers and items, the ranks' flags): step_exchange.py.
        self.step_exchange = StepExchange()
        self._published_step = -1  # the optimiser step whose values the exchange's pending copy holds
        self._warned_step = -1  # the last skipped step warned about
        self._items: Tensor | None = (
            None  # the last training batch's loss items (device), logged on log steps
        )
        self._batch_images = 0
        self._epoch_loss_sums: list[float] = []  # the loss items read back this epoch, summed (host)
        self._epoch_loss_reads = 0
        self._class_results: tuple[Any, ClassResults | None] = (None, None)  # (its evaluation, results)

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: Any, *args: Any, **kwargs: Any) -> YOLO11Module:
        """Lightning's ``load_from_checkpoint``, after the file passed the guarded reader.

        Lightning reads the file with its own loader, not the strategy's checkpoint IO; the guard
        (``model_files.torch_file.load``: archive layout, claimed sizes, restricted unpickler) refuses a crafted file
        first, with an error naming it. Then Lightning restores it with ``weights_only=True``.
        """
        from yolo11_lightning.model_files.torch_file import load

        if isinstance(checkpoint_path, str | os.PathLike) and "://" not in str(checkpoint_path):
            load(checkpoint_path, map_location="cpu")  # raises CheckpointError on anything but plain data
        kwargs.setdefault("weights_only", True)
        return super().load_from_checkpoint(checkpoint_path, *args, **kwargs)

    # ----------------------------------------------------------------------------------------- set-up
    def setup(self, stage: str) -> None:
        # Loss normalisers and items summed over ranks (world-size invariance), flags alongside: one all-reduce.
        self.step_exchange.connect()
        self.criterion.sum_over_ranks = self.step_exchange.sum_over_ranks
        trainer = self._trainer  # None when setup is called by hand
        if trainer is not None:
            self.step_guard.precision = str(trainer.precision)
            refuse_tuners(trainer)
        # A Trainer built without the machine-settings callback gets its defaults.
        without_settings = trainer is not None and not any(
            isinstance(c, MachineSettings) for c in trainer.callbacks
        )
        if (
            without_settings
            and MACHINE_DEFAULTS["keep_host_memory"]
            and trainer.strategy.root_device.type == "cpu"
        ):
            keep_freed_host_memory()

    def log(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        """``LightningModule.log``, which does nothing under ``Trainer(barebones=True)`` (Lightning refuses every
        call there); our callbacks log through it too."""
        if self._trainer is not None and self._trainer.barebones:
            return
        super().log(name, value, *args, **kwargs)

    def global_batch_size(self) -> int:
        """Images per training batch over all devices (the DataModule's ``batch_size``)."""
        return global_batch_size(self.trainer)

    def accumulation(self) -> int:
        """Batches per optimiser step under the nominal-batch rule."""
        return nominal_accumulation(self.global_batch_size(), self.recipe.nominal_batch)

    def num_train_samples(self) -> int | None:
        """Images in the training set, when the DataModule tells (needed by ``optimizer: auto``)."""
        return getattr(getattr(self.trainer, "datamodule", None), "num_train_samples", None)

    def configure_callbacks(self) -> list[Callback]:
        if self.trainer.state.fn == "fit":  # before any callback copies the model for EMA
            refuse_training(self.model)
        callbacks: list[Callback] = [UnreadableImages()]
        if self.hparams.ema:
            callbacks.append(ModelEMA(decay=self.hparams.ema_decay, tau=self.hparams.ema_tau))
        if self.hparams.log_images > 0:
            callbacks.append(ValidationImages(num_images=self.hparams.log_images))
        callbacks.append(self.loop_recipe)
        return callbacks

    def configure_optimizers(self) -> torch.optim.Optimizer:
        global_batch = self.global_batch_size()
        if self.resolved_recipe is None:
            self.resolved_recipe = self._resolve_recipe(global_batch)
        else:  # a resumed run keeps what its start chose, whatever max_epochs or the world size are now
            rank_zero_info(f"optimizer kept from the checkpoint: {self.resolved_recipe.describe()}")
        return build_optimizer(self.model, self.resolved_recipe, global_batch)

    def _resolve_recipe(self, global_batch: int) -> OptimizerRecipe:
        """The concrete recipe of this run: ``auto`` decided from the training-set size, batch and epochs."""
        if self.recipe.name != "auto":
            recipe = self.recipe.resolve(global_batch, self.hparams.num_classes, total_iterations=0)
            rank_zero_info(f"optimizer: {recipe.describe()}")
            return recipe
        num_samples = self.num_train_samples()
        if num_samples is None:
            raise UserInputError(
                "optimizer 'auto' chooses from the training-set size, which this run does not tell: use "
                "YOLODataModule (or a datamodule with a `num_train_samples` attribute), or set "
                "model.optimizer to SGD or AdamW"
            )
        max_epochs = max(self.trainer.max_epochs or 1, 1)
        iterations = math.ceil(num_samples / max(global_batch, self.recipe.nominal_batch)) * max_epochs
        recipe = self.recipe.resolve(global_batch, self.hparams.num_classes, iterations)
        rank_zero_info(
            f"optimizer 'auto' chose {recipe.describe()}: {iterations} iterations (ceil({num_samples} images / "
            f"max(batch {global_batch}, nominal {self.recipe.nominal_batch})) x {max_epochs} epochs) "
            f"{'>' if recipe.name == 'SGD' else '<='} 10000; lr0 and momentum of the config are ignored"
        )
        return recipe

    def configure_gradient_clipping(self, optimizer: torch.optim.Optimizer, gradient_clip_val=None,
                                    gradient_clip_algorithm=None) -> None:  # fmt: skip
        clip = gradient_clip_val if gradient_clip_val is not None else self.hparams.grad_clip_norm
        if not clip:
            return
        torch_optimizer = getattr(optimizer, "optimizer", optimizer)
        plugin = self.trainer.precision_plugin
        if isinstance(plugin, MixedPrecision) and getattr(
            torch_optimizer, "_step_supports_amp_scaling", False
        ):
            # Lightning's mixed-precision plugin refuses to clip a fused optimiser (it would unscale inside its
            # step), even under bf16 where nothing is scaled. Under 16-mixed it is unscaled here first (what
            # Lightning does for the other optimisers), so the clip is right and the scaler's step hands the
            # fused kernel its found-inf flag: no host read.
            if plugin.scaler is not None:
                plugin.scaler.unscale_(torch_optimizer)
            params = [p for group in torch_optimizer.param_groups for p in group["params"]]
            torch.nn.utils.clip_grad_norm_(params, clip)
            return
        self.clip_gradients(optimizer, gradient_clip_val=clip, gradient_clip_algorithm="norm")

    # --------------------------------------------------------------------------------------- training
    def forward(self, images: Tensor) -> Any:
        """Run the detector on float images in [0, 1] (B, 3, H, W)."""
        return self.model(images)

    @staticmethod
    def to_float(images: Tensor) -> Tensor:
        """uint8 (B, 3, H, W) batch -> float in [0, 1], on the device it already is."""
        # One kernel (the uint8 -> float cast happens inside the division): no float copy to divide again.
        return images / 255 if images.dtype == torch.uint8 else images

    def model_input(self, images: Tensor) -> Tensor:
        """The batch's uint8 images as the detector's float input, in its memory layout.

        Loader batches are channels-last already (``structures.batch.stack_images``): no copy then. Any reorder
        happens while still uint8, 4x fewer bytes to shuffle than in float.
        """
        nhwc = self.hparams.channels_last
        images = images.contiguous(memory_format=torch.channels_last if nhwc else torch.contiguous_format)
        return self.to_float(images)

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
        self.loop_recipe.zero_grad_before_batch(optimizer)  # the recipe zeroes after each step instead

    def training_step(self, batch: DetectionBatch, batch_idx: int) -> Tensor:
        images = self.model_input(batch["images"])
        # The loss sums its normalisers and terms over ranks (step_exchange): `items` are the global batch's,
        # and a NaN/inf on any rank is in every rank's `items`, so all ranks skip the step alike.
        loss, items = self.task.loss(self.criterion, self.model(images), batch)
        self.step_guard.observe(items)
        self._items, self._batch_images = (
            items,
            images.shape[0],
        )  # logged after the optimiser step, on log steps
        # The reference's gradient for the global batch (the normaliser is already global): recipe.py.
        return loss * self.loop_recipe.loss_scale(self.trainer, images.shape[0], self.task)

    def _logs_this_batch(self) -> bool:
        """Whether the loss items are read back and logged after this batch: on the optimiser steps Lightning's
        loggers write (every ``log_every_n_steps``, Lightning's own rule ``should_update_logs``; every step under
        ``fast_dev_run``), and on an epoch's last batch and the run's last step, so that the callbacks
        (``EarlyStopping``, ``ModelCheckpoint`` on a training loss) always find the newest values there."""
        trainer = self.trainer
        if trainer.fast_dev_run:
            return True
        epoch_loop = trainer.fit_loop.epoch_loop
        if epoch_loop.batch_progress.is_last_batch:
            return True
        if epoch_loop._should_accumulate():
            return False
        if trainer.max_steps > 0 and trainer.global_step + 1 >= trainer.max_steps:
            return True
        return bool(getattr(trainer._logger_connector, "should_update_logs", True))

    def optimizer_step(
        self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None
    ) -> None:
        """Step, unless a loss of this step's batches was NaN/inf on any rank: then every rank skips it.

        The closure (training_step + backward; DDP's gradient all-reduce runs there on every rank) is run
        first, so the decision comes between backward and the update. It stays on the device: the optimiser
        gets it as ``found_inf`` (PyTorch's fused SGD/AdamW skip the update on it, as under a GradScaler),
        and under a GradScaler a skipped step's gradients are made non-finite so that the scaler skips it.
        Skipped: no parameter or optimiser-state update; ``train/skipped_steps`` counts them. An optimiser
        that takes no ``found_inf`` gets the decision from one host read per step.
        """
        loss = optimizer_closure() if optimizer_closure is not None else None
        flag = self.step_guard.close_window()
        torch_optimizer = getattr(optimizer, "optimizer", optimizer)
        step = self.trainer.global_step
        scaler = getattr(self.trainer.precision_plugin, "scaler", None)
        if flag is not None and scaler is None and not torch_optimizer.defaults.get("fused"):
            # An optimiser that takes no found_inf: decide on the host (one read per step).
            if self.step_guard.read(self.step_guard.counters().tolist()):
                optimizer.zero_grad(set_to_none=True)
                self._warned_step = step
                self._warn_skipped(step)
            else:
                optimizer.step(closure=lambda: loss)
        else:
            if flag is not None and scaler is not None:
                _poison_gradients(torch_optimizer, flag)  # the scaler's own check then skips the step
            elif flag is not None:
                torch_optimizer.found_inf = flag
            try:
                # The closure already ran: hand its loss back (mixed-precision plugins need a non-None result).
                optimizer.step(closure=lambda: loss)
            finally:
                torch_optimizer.__dict__.pop("found_inf", None)
        self.loop_recipe.after_optimizer_step(self.trainer, optimizer, batch_idx)
        # The values exchanged at the previous step are read now (their copy has landed), this step's published.
        self.settle_step_exchange()
        if self._logs_this_batch():
            self._log_step(step)
        self.step_exchange.publish(self.step_guard.counters())
        self._published_step = step

    def _log_step(self, step: int) -> None:
        """Log the loss items and the skipped-step count of this optimiser step: its one host read, on the steps
        the loggers write. The progress bar and the loggers then hold host values (a device value logged every
        step would be read back every step)."""
        counters = self.step_guard.counters()
        parts = [
            self._items.detach().float().flatten(),
            *([counters.float()] if counters is not None else []),
        ]
        host = torch.cat([p.to(parts[0].device) for p in parts]).cpu()
        items = host[: len(self.task.loss_items)].tolist()
        self._epoch_loss_sums = [a + b for a, b in zip(self._epoch_loss_sums or [0.0] * len(items), items)]
        self._epoch_loss_reads += 1
        for name, value in zip(self.task.loss_items, host):
            self.log(f"train/{name}_loss", value, prog_bar=True, batch_size=self._batch_images)
        if counters is not None:
            self._read_guard(host[len(self.task.loss_items) :].tolist(), step)
        if self.step_guard.skipped:
            self.log("train/skipped_steps", torch.tensor(float(self.step_guard.skipped)), rank_zero_only=True)

    def settle_step_exchange(self) -> None:
        """Read what the last optimiser step published (flags summed over ranks, the guard's counters):
        warns about a skipped step, raises ``NonFiniteLossError`` at the limit. Called at every step and before
        checkpoints and epoch ends (``training.callbacks.checkpoints``); reading a step twice does nothing more."""
        if self.step_exchange.advance() and self.step_exchange.extra:
            self._read_guard(self.step_exchange.extra, self._published_step)

    def _read_guard(self, counters: list[float], step: int) -> None:
        """The guard's counters as of optimiser step ``step``, read on the host: warn once if it was skipped."""
        if self.step_guard.read(counters) and step != self._warned_step:
            self._warned_step = step
            self._warn_skipped(step)

    def _warn_skipped(self, step: int) -> None:
        if self.trainer.is_global_zero:
            log.warning(
                "step %d: NaN/inf loss on at least one rank; optimiser step skipped on all ranks "
                "(%d skipped, %d in a row, limit %d)", step, self.step_guard.skipped,
                self.step_guard.consecutive, self.step_guard.max_consecutive,
            )  # fmt: skip

    def on_train_epoch_start(self) -> None:
        self._epoch_loss_sums, self._epoch_loss_reads = [], 0

    def epoch_loss_means(self) -> dict[str, float]:
        """This epoch's training loss items (``train/<name>_loss``), averaged over the steps they were logged at
        (every ``log_every_n_steps`` and the epoch's last; they are read back on those steps only)."""
        if not self._epoch_loss_reads:
            return {}
        reads = self._epoch_loss_reads
        return {f"train/{n}_loss": v / reads for n, v in zip(self.task.loss_items, self._epoch_loss_sums)}

    def on_train_start(self) -> None:
        self.step_exchange.reset()  # nothing exchanged yet in this fit
        self._published_step = self._warned_step = -1

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["nonfinite_steps"] = self.step_guard.state_dict()
        if self.resolved_recipe is not None:
            checkpoint["optimizer_recipe"] = self.resolved_recipe.state_dict()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.step_guard.load_state_dict(checkpoint.get("nonfinite_steps", {}))
        if "optimizer_recipe" in checkpoint:  # restored before configure_optimizers runs
            self.resolved_recipe = OptimizerRecipe.from_state_dict(checkpoint["optimizer_recipe"])

    # ------------------------------------------------------------------------------------- evaluation
    def detect(self, images: Tensor) -> list[Tensor]:
        """uint8 (B, 3, H, W) images -> per image (n, 6 + extra) detections in input pixels (the task's NMS)."""
        return self.task.nms(self, self.model(self.model_input(images)))

    def _evaluate(self, batch: DetectionBatch, metric: DetectionMAP) -> dict[str, Any]:
        return self.task.evaluate(self, batch, metric)  # {"detections": ...}: ValidationImages draws these

    def keep_evaluations(self) -> None:
        """Make validation and test keep what they scored, for ``class_results`` (the result pictures and the
        closing summary ask for it on rank 0; other ranks keep nothing)."""
        for metric in (self.val_map, self.test_map):
            metric.keep_evaluation = True

    def class_results(self, split: str) -> ClassResults | None:
        """Per-class results of the newest ``val`` or ``test`` evaluation (``metrics.class_results``); None when
        none finished since ``keep_evaluations``. Computed once per evaluation."""
        evaluation = (self.val_map if split == "val" else self.test_map).evaluation
        if evaluation is None:
            return None
        if self._class_results[0] is not evaluation:
            names = self.hparams.class_names or [str(i) for i in range(self.hparams.num_classes)]
            self._class_results = (evaluation, self.task.class_results(evaluation, names))
        return self._class_results[1]

    def on_validation_epoch_start(self) -> None:
        if self.trainer.state.fn == "fit" and self.trainer.world_size > 1:
            self._use_rank_zero_buffers()

    def _use_rank_zero_buffers(self) -> None:
        """Every rank takes rank 0's buffers (BatchNorm statistics; the EMA's, swapped in by its callback before
        this hook): each validation shard is scored by the one model the checkpoint holds.

        Ranks update their statistics from their own batches. DDP's ``broadcast_buffers`` copies rank 0's
        before a forward that follows a gradient all-reduce only, so not after an epoch that ends inside an
        accumulation window, and never when it is off (``tests/test_ddp_buffers.py``).
        """
        buffers = dict(self.model.named_buffers())
        rank_zero = self.trainer.strategy.broadcast({k: v.detach().cpu() for k, v in buffers.items()}, src=0)
        with torch.no_grad():
            for name, buffer in buffers.items():
                buffer.copy_(rank_zero[name])

    def validation_step(self, batch: DetectionBatch, batch_idx: int) -> dict[str, Any]:
        return self._evaluate(batch, self.val_map)

    def on_validation_epoch_end(self) -> None:
        self._log_map(self.val_map, "val")

    def test_step(self, batch: DetectionBatch, batch_idx: int) -> dict[str, Any]:
        return self._evaluate(batch, self.test_map)

    def on_test_epoch_end(self) -> None:
        self._log_map(self.test_map, "test")

    def _log_map(self, metric: DetectionMAP, prefix: str) -> None:
        # compute() gathers every rank's detections and returns the same global values on every rank, on the
        # metric's device: logged without Lightning's sync (a mean of equal values would only add a barrier
        # and an all-reduce per key).
        for name, value in metric.compute().items():
            self.log(f"{prefix}/{name}", value, prog_bar=name in ("mAP50-95", "mAP50", "mask_mAP50-95"))
        metric.reset()

    def predict_step(self, batch: ImageBatch, batch_idx: int) -> list[Any]:
        """Per image, in original image pixels: detection, an (n, 6) tensor ``[x1, y1, x2, y2, score, class]``;
        segmentation, ``{"detections": (n, 6), "masks": (n, h0, w0) bool}`` (``tasks.SegmentTask.predict``)."""
        return self.task.predict(self, batch)


def _poison_gradients(optimizer: torch.optim.Optimizer, flag: Tensor) -> None:
    """Add inf to every gradient when ``flag`` is 1 (0 otherwise): a GradScaler then skips the step by its own
    check, on the device. One fused add over the gradients per step (a few microseconds on a GPU)."""
    grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if grads:
        torch._foreach_add_(grads, torch.where(flag > 0, float("inf"), 0.0))
