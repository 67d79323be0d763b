"""Refuse Lightning's tuners, which change a setting during a run that this recipe fixes."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import BatchSizeFinder, LearningRateFinder

from yolo11_lightning.errors import UserInputError


def refuse_tuners(trainer: L.Trainer) -> None:
    """Refuses Lightning's tuners, naming what to set.

    The tuners are ``LearningRateFinder``, ``BatchSizeFinder`` and ``Tuner``.

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
