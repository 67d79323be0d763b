"""Training callbacks: validation images and the unreadable-image account."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_only
from torchvision.ops import box_convert

from yolo11_lightning.training.step_exchange import StepExchange
from yolo11_lightning.visualize import draw_boxes, draw_masks, image_grid, save_rgb

log = logging.getLogger(__name__)


class ValidationImages(Callback):
    """Each validation epoch, draw predictions (coloured) and ground truth (white) on the first images.

    Segmentation outputs (a ``masks`` entry, per image (n, h, w) bool) are drawn as a light colour overlay
    under the predicted boxes.

    Rank 0 only. The picture is saved as ``<log_dir>/val_images/epoch_XXX.png`` and sent to the logger when it
    takes images (TensorBoard ``add_image``, W&B ``log_image``).
    """

    def __init__(self, num_images: int = 4, min_score: float = 0.25) -> None:
        self.num_images = num_images
        self.min_score = min_score
        self.out_dir: Path | None = None
        self._warned = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # trainer.log_dir broadcasts from rank 0: every rank must ask, never rank 0 alone (it would hang).
        self.out_dir = Path(trainer.log_dir or trainer.default_root_dir) / "val_images"

    @rank_zero_only
    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: dict[str, Any],
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if batch_idx != 0 or trainer.sanity_checking or not isinstance(outputs, dict):
            return
        if len(batch["images"]) == 0:  # every image of the batch was unreadable
            return
        # Side work of rank 0 alone: a failure here (a full disk, a logger error) must never end the run,
        # nor make rank 0 leave the others waiting in a collective.
        try:
            self._draw_and_save(trainer, pl_module, outputs, batch)
        except Exception as e:  # any failure of optional output is only reported
            if not self._warned:
                log.warning(
                    "ValidationImages: could not draw or save the validation images (%s: %s); training "
                    "goes on, later failures are not reported", type(e).__name__, e,
                )  # fmt: skip
                self._warned = True

    def _draw_and_save(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: dict, batch: dict[str, Any]
    ) -> None:
        images = batch["images"][: self.num_images].permute(0, 2, 3, 1).cpu().numpy()
        height, width = images.shape[1:3]
        targets = batch["targets"].detach().cpu()
        names = getattr(pl_module.hparams, "class_names", None)
        drawn = []
        for i, image in enumerate(images):
            gt = targets[targets[:, 0] == i]
            gt_boxes = box_convert(
                gt[:, 2:6] * gt.new_tensor([width, height, width, height]), "cxcywh", "xyxy"
            )
            image = draw_boxes(image, gt_boxes.numpy(), gt[:, 1].numpy(), color=(255, 255, 255))
            det = outputs["detections"][i].detach().float().cpu()
            keep = det[:, 4] >= self.min_score
            det = det[keep]
            if outputs.get("masks") is not None:
                masks = outputs["masks"][i].detach().cpu()[keep]
                image = draw_masks(image, masks.numpy(), det[:, 5].numpy())
            drawn.append(draw_boxes(image, det[:, :4].numpy(), det[:, 5].numpy(), det[:, 4].numpy(), names))
        grid = image_grid(drawn)
        out_dir = self.out_dir or Path(trainer.default_root_dir) / "val_images"
        out_dir.mkdir(parents=True, exist_ok=True)
        save_rgb(str(out_dir / f"epoch_{trainer.current_epoch:03d}.png"), grid)
        self._send_to_logger(trainer, grid)

    @staticmethod
    def _send_to_logger(trainer: L.Trainer, grid: Any) -> None:
        for logger in trainer.loggers:
            if hasattr(logger, "log_image"):  # W&B
                logger.log_image(key="val/predictions", images=[grid], step=trainer.global_step)
            elif hasattr(getattr(logger, "experiment", None), "add_image"):  # TensorBoard
                logger.experiment.add_image("val/predictions", grid, trainer.global_step, dataformats="HWC")


class SubstitutionLimitError(RuntimeError):
    """Too many training images could not be read: the run stops (on every rank together)."""


class UnreadableImages(Callback):
    """Counts, logs and limits the images the loaders could not read; names each file once.

    Training batches carry ``substitutes`` (a sample's own unreadable image was replaced) and
    ``unreadable`` ((path, reason) pairs); evaluation batches carry ``missing`` (images left out of the
    metric, logged per validation as ``val/missing_images``, summed over ranks). Under DDP the substitution
    counts travel with the training step's all-reduce (``step_exchange.StepExchange``: no collective of their
    own, every rank sees the same sum one optimiser step later) and are summed once more at each epoch end;
    they are logged as the run total ``train/substituted_samples``. (With a module that has no step exchange,
    they are summed every ``trainer.log_every_n_steps`` batches and at each epoch's last batch.) When
    more samples of one epoch were substituted than ``max_substituted_fraction`` of the training set
    (at least ``min_limit``), every rank raises ``SubstitutionLimitError`` at the same batch: no hang.

    The limit comes from the DataModule (``max_substituted_fraction``) when it has one.
    """

    def __init__(self, max_substituted_fraction: float | None = None, min_limit: int = 8) -> None:
        self.max_substituted_fraction = max_substituted_fraction
        self.min_limit = min_limit
        self.total = 0
        self.epoch = -1
        self.epoch_count = 0
        self._pending = (
            0  # this rank's substitutions since the last sum over ranks (modules without an exchange)
        )
        self._sent = 0  # this rank's substitutions in this fit, sent through the step exchange
        self._received = 0  # every rank's, as the exchange last agreed
        self._exchange: StepExchange | None = None  # the module's, under DDP
        self._logged_total = 0
        self._named: set[str] = set()
        self._missing = 0

    def fraction(self, trainer: L.Trainer) -> float | None:
        """The share of the training set that may be substituted per epoch (None or >= 1: no limit)."""
        if self.max_substituted_fraction is not None:
            return self.max_substituted_fraction
        return getattr(trainer.datamodule, "max_substituted_fraction", 0.01)

    def limit(self, trainer: L.Trainer) -> int | None:
        """Most substituted samples one epoch may have; None: no limit."""
        fraction = self.fraction(trainer)
        if fraction is None or fraction >= 1:
            return None
        datamodule = trainer.datamodule
        train = getattr(datamodule, "datasets", {}).get("train") if datamodule is not None else None
        return max(self.min_limit, math.floor(fraction * (len(train) if train is not None else 0)))

    def _name(self, unreadable: list[tuple[str, str]], what: str) -> None:
        for path, reason in unreadable:
            if path not in self._named:
                self._named.add(path)
                log.warning("unreadable image %s (%s): %s", path, reason, what)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._sent = self._received = 0  # the step exchange starts afresh with every fit
        exchange = getattr(pl_module, "step_exchange", None)
        self._exchange = exchange if trainer.world_size > 1 and isinstance(exchange, StepExchange) else None

    def _newly_agreed(self) -> int:
        """Substitutions of every rank the step exchange agreed on since the last call."""
        if self._exchange is None:
            return 0
        summed = int(self._exchange.agreed.get("substituted", 0.0))
        # The epoch-end sum may have counted further than the exchange has agreed yet.
        count, self._received = max(summed - self._received, 0), max(summed, self._received)
        return count

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        exchange = getattr(pl_module, "step_exchange", None)
        if trainer.world_size > 1 and isinstance(exchange, StepExchange) and isinstance(batch, dict):
            # Counted before the batch's training step, so that its exchange carries them to every rank.
            self._sent += self._local_count(batch)
            exchange.set("substituted", float(self._sent))

    @staticmethod
    def _local_count(batch: dict) -> int:
        local = batch.get("substituted")
        if local is None and "substitutes" in batch:
            local = int((batch["substitutes"] != -1).sum())
        return int(local or 0)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not isinstance(batch, dict) or "substitutes" not in batch:
            return
        self._name(batch.get("unreadable", []), "training uses a substitute image in its place")
        if self._exchange is not None:
            # Every rank's count as the step exchange agreed it (one optimiser step late): no extra collective.
            count = self._newly_agreed()
        elif trainer.world_size > 1:
            self._pending += self._local_count(batch)
            # The same batches on every rank: a batch-index interval and the epoch's last batch.
            every = max(int(trainer.log_every_n_steps or 1), 1)
            if (batch_idx + 1) % every and not trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
                return
            summed = trainer.strategy.reduce(
                torch.tensor(float(self._pending), device=pl_module.device), reduce_op="sum"
            )
            count, self._pending = round(float(summed)), 0
        else:
            count = self._local_count(batch)
        self._add(trainer, pl_module, count)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        exchange = getattr(pl_module, "step_exchange", None)
        if trainer.world_size > 1 and isinstance(exchange, StepExchange):
            # The epoch's last batches have not travelled with a step exchange yet: count them now, one
            # all-reduce per epoch, so that the epoch's limit sees every substitution of the epoch.
            summed = round(float(trainer.strategy.reduce(
                torch.tensor(float(self._sent), device=pl_module.device), reduce_op="sum"
            )))  # fmt: skip
            count, self._received = max(summed - self._received, 0), max(summed, self._received)
            self._add(trainer, pl_module, count)

    def _add(self, trainer: L.Trainer, pl_module: L.LightningModule, count: int) -> None:
        """Count ``count`` more substituted samples (summed over ranks); log a changed total; stop at the limit."""
        if trainer.current_epoch != self.epoch:
            self.epoch, self.epoch_count = trainer.current_epoch, 0
        self.total += count
        self.epoch_count += count
        if self.total != self._logged_total:  # also counts taken in by a checkpoint save since the last batch
            self._logged_total = self.total
            pl_module.log(
                "train/substituted_samples",
                torch.tensor(float(self.total)),
                rank_zero_only=True,
                batch_size=1,
            )
        limit = self.limit(trainer)
        if limit is not None and self.epoch_count > limit:
            raise SubstitutionLimitError(
                f"{self.epoch_count} training samples of epoch {self.epoch} had an unreadable image and were "
                f"replaced by substitutes, more than the limit of {limit} (data.max_substituted_fraction="
                f"{self.fraction(trainer)} of the training set, at least {self.min_limit}): the data is "
                "going away under the run; check its storage (the warnings above name the files)"
            )

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._missing = 0

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if isinstance(batch, dict) and batch.get("unreadable"):
            self._name(batch["unreadable"], "left out of the validation metric")
            self._missing += int(batch.get("missing", 0))

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Log ``val/missing_images`` (summed over ranks) when an image could not be scored."""
        if trainer.sanity_checking:
            return
        count = self._missing
        if trainer.world_size > 1:  # every rank runs this hook: the collective is matched
            summed = trainer.strategy.reduce(
                torch.tensor(float(count), device=pl_module.device), reduce_op="sum"
            )
            count = round(float(summed))
        if count:
            pl_module.log("val/missing_images", float(count), rank_zero_only=True)

    def state_dict(self) -> dict[str, Any]:
        # The checkpoint callbacks read the last step's exchange before saving: its count belongs in here.
        count = self._newly_agreed()
        self.total += count
        self.epoch_count += count
        return {"total": self.total, "epoch": self.epoch, "epoch_count": self.epoch_count}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.total = int(state_dict.get("total", 0))
        self.epoch = int(state_dict.get("epoch", -1))
        self.epoch_count = int(state_dict.get("epoch_count", 0))
        self._logged_total = self.total
