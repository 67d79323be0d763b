"""Pictures out of a callback: saved in the run folder and sent to the loggers that take images."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import numpy as np

from yolo11_lightning.plots.drawing import save_rgb


def save(path: Path, image: np.ndarray) -> None:
    """Writes an (H, W, 3) uint8 RGB image to ``path``, making its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    save_rgb(str(path), image)


def save_and_log(trainer: L.Trainer, path: Path, image: np.ndarray, key: str) -> None:
    """Saves an image to ``path`` and sends it under ``key`` to every logger that takes images.

    Those are TensorBoard (add_image) and W&B (log_image), at the current global step.
    """
    save(path, image)
    for logger in trainer.loggers:
        if hasattr(logger, "log_image"):  # W&B
            logger.log_image(key=key, images=[image], step=trainer.global_step)
        elif hasattr(getattr(logger, "experiment", None), "add_image"):  # TensorBoard
            logger.experiment.add_image(key, image, trainer.global_step, dataformats="HWC")
