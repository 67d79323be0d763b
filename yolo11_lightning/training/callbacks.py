"""Training callbacks: close-mosaic and validation images."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_only
from torchvision.ops import box_convert

from yolo11_lightning.visualize import draw_boxes, image_grid, save_rgb

log = logging.getLogger(__name__)


class CloseMosaic(Callback):
    """Train the last ``epochs`` epochs without mosaic/mixup (the reference's close_mosaic).

    The switch is an epoch number handed to the DataModule before any worker starts, so persistent
    workers, every rank and a resumed run all agree on it without messages between processes.
    """

    def __init__(self, epochs: int = 10) -> None:
        self.epochs = epochs

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        datamodule = trainer.datamodule
        if self.epochs <= 0 or not trainer.max_epochs or trainer.max_epochs < 0:
            return
        if datamodule is None or not hasattr(datamodule, "set_close_mosaic_epoch"):
            log.warning("CloseMosaic: the datamodule has no set_close_mosaic_epoch(); mosaic stays on")
            return
        datamodule.set_close_mosaic_epoch(max(trainer.max_epochs - self.epochs, 0))


class ValidationImages(Callback):
    """Each validation epoch, draw predictions (coloured) and ground truth (white) on the first images.

    Rank 0 only. The picture is saved as ``<log_dir>/val_images/epoch_XXX.png`` and sent to the logger when it
    takes images (TensorBoard ``add_image``, W&B ``log_image``).
    """

    def __init__(self, num_images: int = 4, min_score: float = 0.25) -> None:
        self.num_images = num_images
        self.min_score = min_score
        self.out_dir: Path | None = None

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
            det = det[det[:, 4] >= self.min_score]
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
