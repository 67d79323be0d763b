"""ValidationImages: predictions and ground truth drawn on the first validation images each epoch."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_only

from yolo11_lightning.plots.drawing import image_grid
from yolo11_lightning.training.callbacks._pictures import save_and_log

log = logging.getLogger(__name__)


class ValidationImages(Callback):
    """Each validation epoch, draw predictions (coloured) and ground truth (white) on the first images.

    The module's task draws the ground truth (``Task.draw_ground_truth``: boxes, or rotated outlines) and its
    evaluation outputs (``Task.draw_evaluated``: a segmenter's masks as a light colour overlay under the predicted
    boxes).

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
        names = getattr(pl_module.hparams, "class_names", None)
        drawn = []
        for i, image in enumerate(images):
            image = pl_module.task.draw_ground_truth(image, batch, i)
            keep = outputs["detections"][i].detach().float().cpu()[:, 4] >= self.min_score
            drawn.append(pl_module.task.draw_evaluated(image, outputs, i, keep, names))
        grid = image_grid(drawn)
        out_dir = self.out_dir or Path(trainer.default_root_dir) / "val_images"
        save_and_log(trainer, out_dir / f"epoch_{trainer.current_epoch:03d}.png", grid, "val/predictions")
