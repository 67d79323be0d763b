"""The reference trainer's loop recipe as a Lightning callback: warmup, accumulation ramp, loss scale.

``YOLO11Module`` keeps the science (model, loss, metrics, predict). How the reference *drives* the
optimiser lives here:

- the warmup of LR and momentum per parameter group, written into the optimiser before every batch
  (``optim.WarmupSchedule``, a pure function of the global batch index);
- the accumulation ramp: the reference steps once ``accumulation(index)`` batches have passed since its
  last step, a count that rises from 1 to ``nominal_batch / global_batch`` during warmup. Lightning's
  ``accumulate_grad_batches`` is set batch by batch so that it steps exactly then;
- the index of the last optimiser step (saved through this callback's state), which defines the windows;
- windows that cross an epoch boundary: Lightning forces an optimiser step on every epoch's last batch,
  the reference does not (its window carries on into the next epoch: about 8% fewer steps at the
  nominal batch). Lightning asks its epoch loop ``_should_accumulate()`` before every step decision
  (optimiser step, global step, DDP sync, logging, zeroing before validation); this callback answers
  "accumulate" for a last batch the reference would not step on, and Lightning's other answers are
  kept. At the epoch end the open window's gradient is averaged over ranks once (what DDP's next sync
  would do), so that it is the same on every rank and goes into checkpoints
  (``checkpoint["carried_gradients"]``): a resume at the epoch boundary, on any world size, continues
  the same window;
- ``loss_scale``: the factor that makes gradients the reference's for the same *global* batch.

The module calls ``zero_grad_before_batch``, ``loss_scale`` and ``after_optimizer_step`` from its
``optimizer_zero_grad``, ``training_step`` and ``optimizer_step`` hooks: those three are LightningModule
hooks, so the module has to forward them. Everything else is this callback's own hooks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from yolo11_lightning.training.optim import OptimizerRecipe, WarmupSchedule

if TYPE_CHECKING:
    from yolo11_lightning.tasks.base.model import TaskModel


def global_batch_size(trainer: L.Trainer) -> int:
    """Returns the images per batch over all devices: the DataModule's batch_size, else loader x world."""
    datamodule = getattr(trainer, "datamodule", None)
    if datamodule is not None and getattr(datamodule, "batch_size", None):
        return int(datamodule.batch_size)
    loader = trainer.train_dataloader
    per_device = getattr(loader, "batch_size", None) if loader is not None else None
    if not per_device:
        raise ValueError(
            "cannot tell the global batch size: use YOLODataModule or a DataLoader with batch_size"
        )
    return int(per_device) * trainer.world_size


class LoopRecipe(Callback):
    """Drive Lightning's optimisation loop the way the reference trainer drives its own.

    The schedule comes from ``pl_module.resolved_recipe`` (an ``OptimizerRecipe``, decided once at fit
    start). When the user fixes ``--trainer.accumulate_grad_batches`` (anything but 1), Lightning's own
    accumulation and zeroing are kept and only the LR/momentum warmup is applied.

    State in checkpoints: ``last_step_index``, the global batch index of the last optimiser step (-1: none).
    """

    def __init__(self) -> None:
        self.schedule: WarmupSchedule | None = None
        self.last_step_index = -1
        self.fixed_accumulation: int | None = None
        self.step_due = True  # does the reference step after the current batch?
        self.carrying = False  # after this batch, the parameters' .grad hold an open window
        self.carried_is_global = False  # that gradient is the same on every rank (averaged at epoch end)
        self._restored_gradients: dict[str, torch.Tensor] | None = None

    # ------------------------------------------------------------------------------- set-up
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        # Before any batch rewrote it: a value other than 1 is the user's choice.
        fixed = trainer.accumulate_grad_batches
        self.fixed_accumulation = fixed if fixed != 1 else None
        self.step_due, self.carrying = True, False
        if self.fixed_accumulation is None:
            epoch_loop = trainer.fit_loop.epoch_loop
            lightning_rule = type(epoch_loop)._should_accumulate.__get__(epoch_loop)
            epoch_loop._should_accumulate = lambda: self._should_accumulate(lightning_rule)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        trainer.fit_loop.epoch_loop.__dict__.pop("_should_accumulate", None)

    def _should_accumulate(self, lightning_rule: Any) -> bool:
        """Decides whether to accumulate, by Lightning's rule with one exception.

        On an epoch's last batch that the reference would not step on, it accumulates.
        """
        if self.schedule is not None and not self.step_due:
            return True
        return lightning_rule()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Batches per epoch are known once the train loader exists; len() is the full epoch even when
        # resuming mid-epoch, and the same on every world size (global batches).
        recipe: OptimizerRecipe = pl_module.resolved_recipe
        max_epochs = max(trainer.max_epochs or 1, 1)
        self.schedule = WarmupSchedule(recipe, max_epochs, int(trainer.num_training_batches))
        if self._restored_gradients is not None:  # after the strategy moved the model to its device
            self._restore_gradients(trainer, pl_module, self._restored_gradients)
            self._restored_gradients = None

    # ------------------------------------------------------------------------------- per batch
    def global_batch_index(self, trainer: L.Trainer, batch_idx: int) -> int:
        """Counts the batches since the run's start: epochs x batches per epoch + this epoch's index."""
        return trainer.current_epoch * self.schedule.batches_per_epoch + batch_idx

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.schedule is None:
            return
        index = self.global_batch_index(trainer, batch_idx)
        for optimizer in trainer.optimizers:
            self.schedule.apply(optimizer, index, trainer.current_epoch)
        if self.fixed_accumulation is None:
            self._set_accumulation(trainer, index)

    def _set_accumulation(self, trainer: L.Trainer, index: int) -> None:
        """Make Lightning step after this batch exactly when the reference would.

        Lightning steps when ``ready % accumulate_grad_batches == 0`` (``ready`` counts this epoch's batches
        including this one), so it gets 1 for a step and ``ready + 1`` (never a divisor) otherwise; it also
        keeps DDP's gradient all-reduce for the stepping batch only. ``loss_scale`` cancels Lightning's
        division by the same number, and gradients are zeroed right after each step, not by Lightning.
        """
        due = index - self.last_step_index >= self.schedule.accumulation(index, global_batch_size(trainer))
        ready = trainer.fit_loop.epoch_loop.batch_progress.current.ready
        trainer.accumulate_grad_batches = 1 if due else ready + 1
        self.step_due = due

    def loss_scale(self, trainer: L.Trainer, local_batch: int, task: TaskModel | None = None) -> int:
        """Returns the factor on the globally normalised loss that makes the gradients the reference's.

        The reference's gradient is d(loss x ``task.reference_loss_factor(global batch)``): the global batch for
        detection (the default), 1 for classification (its mean cross-entropy). DDP averages gradients over the
        R ranks and Lightning divides the loss by ``accumulate_grad_batches``, so both are multiplied back:
        ``factor x R (DDP mean) x accumulate_grad_batches``.
        """
        world = trainer.world_size
        global_batch = local_batch * world
        factor = global_batch if task is None else task.reference_loss_factor(global_batch)
        return factor * world * trainer.accumulate_grad_batches

    def zero_grad_before_batch(self, optimizer: torch.optim.Optimizer) -> None:
        """Zeroes the gradients at Lightning's zero_grad point, only with a fixed accumulation.

        Otherwise they are zeroed after each step.
        """
        if self.fixed_accumulation is not None:
            optimizer.zero_grad(set_to_none=True)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.carrying = self.fixed_accumulation is None and self.schedule is not None and not self.step_due
        self.carried_is_global = False

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Averages an open window's gradient over ranks; every rank carries one, or none, alike.

        Before the checkpoint callbacks' own epoch-end saves (Lightning runs those last).
        """
        if not self.carrying:
            return
        gradients = [p.grad for p in pl_module.parameters() if p.grad is not None]
        if trainer.world_size > 1 and gradients:
            flat = trainer.strategy.reduce(_flatten_dense_tensors(gradients), reduce_op="mean")
            for gradient, averaged in zip(gradients, _unflatten_dense_tensors(flat, gradients)):
                gradient.copy_(averaged)
        self.carried_is_global = True

    def after_optimizer_step(
        self, trainer: L.Trainer, optimizer: torch.optim.Optimizer, batch_idx: int
    ) -> None:
        """Closes the accumulation window after the optimiser step of ``batch_idx``, taken or skipped."""
        if self.fixed_accumulation is None:
            optimizer.zero_grad(set_to_none=True)
        if self.schedule is not None:
            self.last_step_index = self.global_batch_index(trainer, batch_idx)

    # ------------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        return {"last_step_index": self.last_step_index}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.last_step_index = int(state_dict["last_step_index"])

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if self.carrying and self.carried_is_global:  # the open window's gradient, the same on every rank
            # Unscaled (the true gradient): under 16-mixed the parameters' .grad hold it times the GradScaler's
            # scale, and a resume under another precision or scale must not apply that factor.
            scale = _gradient_scale(trainer)
            checkpoint["carried_gradients"] = {
                name: (param.grad.detach().float() / scale).cpu()
                for name, param in pl_module.named_parameters()
                if param.grad is not None
            }

    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self._restored_gradients = checkpoint.get("carried_gradients")

    def _restore_gradients(
        self, trainer: L.Trainer, pl_module: L.LightningModule, gradients: dict[str, torch.Tensor]
    ) -> None:
        """Puts a checkpoint's unscaled carried gradients back, times this run's GradScaler scale if any."""
        parameters = dict(pl_module.named_parameters())
        scale = _gradient_scale(trainer)
        unknown = sorted(set(gradients) - set(parameters))
        if unknown:
            raise ValueError(
                f"the checkpoint's carried gradients name parameters this model lacks: {unknown[:5]}"
            )
        for name, gradient in gradients.items():
            param = parameters[name]
            if gradient.shape != param.shape:
                raise ValueError(
                    f"carried gradient of {name} has shape {tuple(gradient.shape)}, not {tuple(param.shape)}"
                )
            # empty_like keeps the parameter's memory layout (channels-last), as autograd's own gradients do.
            param.grad = torch.empty_like(param).copy_(gradient * scale)
        self.carrying = self.carried_is_global = bool(gradients)


def _gradient_scale(trainer: L.Trainer) -> float:
    """Returns the factor the parameters' gradients carry: the GradScaler's scale under 16-mixed, else 1.

    It is a host read.
    """
    scaler = getattr(trainer.precision_plugin, "scaler", None)
    return float(scaler.get_scale()) if scaler is not None and scaler.is_enabled() else 1.0
