"""YOLO11Module: a YOLO11 model of any task, its loss, metric and the reference recipe, wired as Lightning hooks.

Each concern lives in a module of its own that the hooks call: what model the module holds (``model_source``), the
optimiser recipe (``optim``), skipping non-finite steps (``nonfinite_steps``), reading the step's values back
(``step_logging``, ``step_exchange``), fused clipping under mixed precision (``gradient_clipping``), rank 0's
buffers before validation (``rank_zero_buffers``), refused tuners (``tuners``). The task does the rest.
"""

from __future__ import annotations

import os
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor

from yolo11_lightning.errors import UserInputError
from yolo11_lightning.metrics.class_results import ClassResults
from yolo11_lightning.metrics.detection import DetectionMAP
from yolo11_lightning.model_files.exported_model import refuse_training
from yolo11_lightning.structures.batch import DetectionBatch, ImageBatch
from yolo11_lightning.tasks import create_model, get_task
from yolo11_lightning.training.callbacks.ema import ModelEMA
from yolo11_lightning.training.callbacks.machine import MACHINE_DEFAULTS, MachineSettings
from yolo11_lightning.training.callbacks.recipe import LoopRecipe, global_batch_size
from yolo11_lightning.training.callbacks.unreadable_images import UnreadableImages
from yolo11_lightning.training.callbacks.validation_images import ValidationImages
from yolo11_lightning.training.gradient_clipping import clip_fused_under_mixed_precision
from yolo11_lightning.training.host_memory import keep_freed_host_memory
from yolo11_lightning.training.lightning_noise import silence_lightning_noise
from yolo11_lightning.training.model_source import check_model_options, module_task, starting_model
from yolo11_lightning.training.nonfinite_steps import NonFiniteStepGuard, step_unless_nonfinite
from yolo11_lightning.training.optim import (
    LRScaling,
    OptimizerName,
    OptimizerRecipe,
    build_optimizer,
    choose_recipe,
    nominal_accumulation,
)
from yolo11_lightning.training.rank_zero_buffers import use_rank_zero_buffers
from yolo11_lightning.training.step_exchange import StepExchange
from yolo11_lightning.training.step_logging import StepLog, logs_this_batch
from yolo11_lightning.training.tuners import refuse_tuners

silence_lightning_noise()


class YOLO11Module(L.LightningModule):
    """Train, validate and predict with a YOLO11 model of any task (``tasks.TASKS``).

    Batches follow the DataModule contract (``images`` uint8 (B, 3, H, W), ``targets`` (N, 6), per-image
    letterbox metadata). Images become float on the device. The loss is scaled so that gradients equal the
    reference trainer's for the same *global* batch whatever the number of devices: the loss normaliser is
    summed over ranks, and the scale undoes DDP's gradient averaging and Lightning's accumulation division.

    The task (``tasks.base``) decides the head, the loss, the metric and what predict returns: e.g. ``detect``
    (box mAP; (n, 6) detections) or ``segment`` (YOLO11-seg: ``SegmentationBatch`` input, box and mask mAP,
    detections with masks).

    Args:
        scale: YOLO11 scale, one of n, s, m, l, x.
        num_classes: class count (the CLI links it from the dataset).
        class_names: class names, index = class id (linked from the dataset).
        weights: optional reference ``.pt`` or our ``.ckpt``/weights file to start from; the class head keeps
            its fresh initialisation when the class count differs. An exported ``.onnx`` file replaces the
            detector with its runtime (``model_files.exported_files``: ONNX, TorchScript, OpenVINO) for validate/test/predict; fit refuses it.
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
        task: a task of ``tasks.TASKS`` (e.g. ``segment``: ``configs/model/yolo11*-seg.yaml``). None (default): the task of the
            ``weights`` file (read from its header: ``model_files.weights.file_task``; an ``.onnx`` file's
            metadata), else detection. A given task keeps it whatever ``weights`` holds (fine-tuning from
            another task's file loads what fits). The data follows it (``YOLODataModule(task=None)``).
            Checkpoints and ``hparams`` keep the resolved task.
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
        # A string in the checkpoint's hyper-parameters (plain data only).
        if isinstance(weights, os.PathLike):
            weights = os.fspath(weights)
        task, onnx = module_task(weights, num_classes, task)
        self.save_hyperparameters()  # after `task` is resolved: hparams hold the task, never None
        # LightningCLI hands its config as the hyper-parameters: a task the file named is not in it (.onnx).
        self._resolved_hparam("task", task)
        check_model_options(scale, num_classes, class_names)
        self.task = get_task(task)
        if conf_threshold is None:
            self._resolved_hparam("conf_threshold", self.task.validation_conf)
        try:
            network = create_model(scale=scale, num_classes=num_classes, task=task, kpt_shape=kpt_shape)
        except ValueError as e:  # a kpt_shape for a task without keypoints, or not [K, D]
            raise UserInputError(f"model.kpt_shape: {e}") from None
        self.model = starting_model(network, class_names, onnx, weights, weights_strict, channels_last)
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
        self.loop_recipe = LoopRecipe()
        self.step_guard = NonFiniteStepGuard(max_skipped_steps)
        # The training step's one collective (loss normalisers and items, the ranks' flags): step_exchange.py.
        self.step_exchange = StepExchange()
        self.step_log = StepLog(self.step_guard, self.step_exchange)  # the step's values read on the host
        self._class_results: tuple[Any, ClassResults | None] = (None, None)  # (its evaluation, results)

    def _resolved_hparam(self, key: str, value: Any) -> None:
        """Store a value resolved at init in the hyper-parameters and in Lightning's copy for the loggers."""
        self.hparams[key] = value
        initial = getattr(self, "_hparams_initial", None)
        if initial is not None:
            initial[key] = value

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: Any, *args: Any, **kwargs: Any) -> YOLO11Module:
        """Loads a module with Lightning's load_from_checkpoint after the file passed the guarded reader.

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
        """Logs like LightningModule.log, but does nothing under Trainer(barebones=True).

        Lightning refuses every call there; our callbacks log through it too.
        """
        if self._trainer is not None and self._trainer.barebones:
            return
        super().log(name, value, *args, **kwargs)

    def global_batch_size(self) -> int:
        """Returns the images per training batch over all devices, the DataModule's batch_size."""
        return global_batch_size(self.trainer)

    def accumulation(self) -> int:
        """Returns the batches per optimiser step under the nominal-batch rule."""
        return nominal_accumulation(self.global_batch_size(), self.recipe.nominal_batch)

    def num_train_samples(self) -> int | None:
        """Returns the training set's image count if the DataModule tells; ``optimizer: auto`` needs it."""
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
            self.resolved_recipe, said = choose_recipe(
                self.recipe, global_batch, self.hparams.num_classes, self.num_train_samples(),
                self.trainer.max_epochs or 1,
            )  # fmt: skip
            rank_zero_info(said)
        else:  # a resumed run keeps what its start chose, whatever max_epochs or the world size are now
            rank_zero_info(f"optimizer kept from the checkpoint: {self.resolved_recipe.describe()}")
        return build_optimizer(self.model, self.resolved_recipe, global_batch)

    def configure_gradient_clipping(self, optimizer: torch.optim.Optimizer, gradient_clip_val=None,
                                    gradient_clip_algorithm=None) -> None:  # fmt: skip
        clip = gradient_clip_val if gradient_clip_val is not None else self.hparams.grad_clip_norm
        if not clip:
            return
        if not clip_fused_under_mixed_precision(self.trainer.precision_plugin, optimizer, clip):
            self.clip_gradients(optimizer, gradient_clip_val=clip, gradient_clip_algorithm="norm")

    # --------------------------------------------------------------------------------------- training
    def forward(self, images: Tensor) -> Any:
        """Runs the detector on float (B, 3, H, W) images in [0, 1]."""
        return self.model(images)

    @staticmethod
    def to_float(images: Tensor) -> Tensor:
        """Converts a uint8 (B, 3, H, W) batch to float in [0, 1] on the device it already is on."""
        # One kernel (the uint8 -> float cast happens inside the division): no float copy to divide again.
        return images / 255 if images.dtype == torch.uint8 else images

    def model_input(self, images: Tensor) -> Tensor:
        """Converts the batch's uint8 images to the detector's float input, in its memory layout.

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
        self.step_log.keep(items, images.shape[0])  # logged after the optimiser step, on log steps
        # The reference's gradient for the global batch (the normaliser is already global): recipe.py.
        return loss * self.loop_recipe.loss_scale(self.trainer, images.shape[0], self.task)

    def optimizer_step(
        self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None
    ) -> None:
        """Steps, unless a loss of this step's batches was NaN or inf on any rank: then every rank skips it.

        The guard lives in training.nonfinite_steps; ``train/skipped_steps`` counts the skipped steps.

        The closure (training_step + backward; DDP's gradient all-reduce runs there on every rank) is run
        first, so the decision comes between backward and the update.
        """
        loss = optimizer_closure() if optimizer_closure is not None else None
        step, warn = self.trainer.global_step, self.trainer.is_global_zero
        scaler = getattr(self.trainer.precision_plugin, "scaler", None)
        # The closure already ran: hand its loss back (mixed-precision plugins need a non-None result).
        if step_unless_nonfinite(self.step_guard, optimizer, scaler, lambda: loss):
            self.step_log.skipped(step, warn)
        self.loop_recipe.after_optimizer_step(self.trainer, optimizer, batch_idx)
        # The values exchanged at the previous step are read now (their copy has landed), this step's published.
        self.settle_step_exchange()
        if logs_this_batch(self.trainer):
            self.step_log.log_step(self.log, step, self.task.loss_items, warn)
        self.step_log.publish(step)

    def settle_step_exchange(self) -> None:
        """Reads what the last optimiser step published: warns about a skipped step, raises at the limit.

        The step published the flags summed over ranks and the guard's counters; at the limit it raises
        ``NonFiniteLossError``. Called at every step and before checkpoints and epoch ends
        (training.callbacks.checkpoints); reading a step twice does nothing more.
        """
        self.step_log.settle(self.trainer.is_global_zero)

    def on_train_epoch_start(self) -> None:
        self.step_log.start_epoch()

    def epoch_loss_means(self) -> dict[str, float]:
        """Returns this epoch's training loss items, averaged over the steps they were logged at.

        The items are ``train/<name>_loss``, logged every ``log_every_n_steps`` and on the epoch's last step;
        they are read back on those steps only.
        """
        return self.step_log.epoch_loss_means(self.task.loss_items)

    def on_train_start(self) -> None:
        self.step_log.start_fit()  # nothing exchanged yet in this fit

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["nonfinite_steps"] = self.step_guard.state_dict()
        if self.resolved_recipe is not None:
            checkpoint["optimizer_recipe"] = self.resolved_recipe.state_dict()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.step_guard.load_state_dict(checkpoint.get("nonfinite_steps", {}))
        if "optimizer_recipe" in checkpoint:  # restored before configure_optimizers runs
            self.resolved_recipe = OptimizerRecipe.from_state_dict(checkpoint["optimizer_recipe"])

    # ------------------------------------------------------------------------------------- evaluation
    def forward_with_nms(self, images: Tensor) -> list[Tensor]:
        """Detects on uint8 (B, 3, H, W) images by the task's NMS: (n, 6 + extra) per image, input pixels."""
        return self.task.nms(self, self.model(self.model_input(images)))

    def _evaluate(self, batch: DetectionBatch, metric: DetectionMAP) -> dict[str, Any]:
        return self.task.evaluate(self, batch, metric)  # {"detections": ...}: ValidationImages draws these

    def keep_evaluations(self) -> None:
        """Makes validation and test keep what they scored, for class_results.

        The result pictures and the closing summary ask for it on rank 0; other ranks keep nothing.
        """
        for metric in (self.val_map, self.test_map):
            metric.keep_evaluation = True

    def class_results(self, split: str) -> ClassResults | None:
        """Returns the per-class results of the newest val or test evaluation, computed once per evaluation.

        They come from metrics.class_results; None when no evaluation finished since keep_evaluations.
        """
        evaluation = (self.val_map if split == "val" else self.test_map).evaluation
        if evaluation is None:
            return None
        if self._class_results[0] is not evaluation:
            names = self.hparams.class_names or [str(i) for i in range(self.hparams.num_classes)]
            self._class_results = (evaluation, self.task.class_results(evaluation, names))
        return self._class_results[1]

    def on_validation_epoch_start(self) -> None:
        if self.trainer.state.fn == "fit" and self.trainer.world_size > 1:
            # Each validation shard scored by the one model the checkpoint holds (rank_zero_buffers.py).
            use_rank_zero_buffers(self.model, self.trainer.strategy)

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
        """Predicts one batch: per image, the task's predictions in original image pixels.

        For detection an (n, 6) tensor ``[x1, y1, x2, y2, score, class]``; for segmentation
        ``{"detections": (n, 6), "masks": (n, h0, w0) bool}`` (``tasks.SegmentTask.predict``).
        """
        return self.task.predict(self, batch)
