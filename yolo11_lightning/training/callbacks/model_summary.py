"""The model summary ``fit`` prints, with the detector's FLOPs counted instead of ``0``.

Lightning's ``ModelSummary`` counts FLOPs only by running ``example_input_array`` through the module, which
``YOLO11Module`` does not set (a real forward at fit start would cost a compile with ``--machine.compile`` and
the device's time); its table then shows ``FLOPs 0`` for every layer and ``0 Total Flops``. ``FlopsSummary``
counts them the way ``yolo11-lightning info`` does (``cli.info.count_flops``): one image at the data's
``image_size`` through a copy of the detector on the meta device (shapes only, no memory, no compute), in
eval mode, so per layer and in total the figures are those of one image at the training size.
``count_flops_in_summary`` puts it in place of the Trainer's ``ModelSummary`` (the CLI does this), with the
same settings, and ``RichFlopsSummary`` in place of a ``RichModelSummary`` (Lightning's default when ``rich`` is
installed, as the ``int8`` extra installs it); a summary of another class, and a Trainer without one, stay as they are.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelSummary, RichModelSummary
from lightning.pytorch.utilities.model_summary import ModelSummary as Summary
from torch.utils.flop_counter import FlopCounterMode

from yolo11_lightning.nn.yolo11 import YOLO11
from yolo11_lightning.tasks import create_model, get_task

__all__ = ["FlopsSummary", "RichFlopsSummary", "count_flops_in_summary"]

_DETECTOR = "model"  # the attribute of YOLO11Module that holds the detector


class _CountedSummary(Summary):
    """Lightning's summary of ``module`` with the FLOPs of one ``image_size`` image through its detector."""

    def __init__(self, module: L.LightningModule, max_depth: int, image_size: int) -> None:
        detector: YOLO11 = getattr(module, _DETECTOR)
        with torch.device("meta"):
            copy = create_model(
                detector.scale,
                detector.num_classes,
                task=detector.task,
                **get_task(detector.task).model_options(detector),
            )
        copy.eval()
        self._counter = FlopCounterMode(display=False, depth=None)
        with self._counter, torch.no_grad():
            copy(torch.zeros(1, 3, image_size, image_size, device="meta"))
        super().__init__(module, max_depth)

    @property
    def total_flops(self) -> int:
        return self._counter.get_total_flops()

    @property
    def flop_counts(self) -> dict[str, dict[Any, int]]:
        counts = self._counter.get_flop_counts()
        return {name: _layer_counts(counts, _counter_key(name)) for name in self.layer_names}


def _layer_counts(counts: dict[str, dict[Any, int]], key: str) -> dict[Any, int]:
    """Returns the counter's op counts of module ``key``.

    A container that is never called itself, such as the ``ModuleList`` of layers, sums those of its direct
    children.
    """
    if key in counts or not key:
        return counts.get(key, {})
    total: dict[Any, int] = {}
    for child, ops in counts.items():
        if child.startswith(f"{key}.") and "." not in child[len(key) + 1 :]:
            for op, n in ops.items():
                total[op] = total.get(op, 0) + n
    return total


def _counter_key(layer_name: str) -> str:
    """Names a summary layer as the counter does from the detector: model.layers.3 -> YOLO11.layers.3."""
    if layer_name == _DETECTOR:
        return YOLO11.__name__
    if layer_name.startswith(f"{_DETECTOR}."):
        return f"{YOLO11.__name__}.{layer_name[len(_DETECTOR) + 1 :]}"
    return ""


class FlopsSummary(ModelSummary):
    """ModelSummary whose FLOPs are those of one image at the datamodule's ``image_size`` (the detector's
    layers; the loss and metrics count none). Without a detector or an image size, Lightning's own."""

    def _summary(self, trainer: L.Trainer, pl_module: L.LightningModule) -> Any:
        image_size = getattr(getattr(trainer, "datamodule", None), "image_size", None)
        if not isinstance(getattr(pl_module, _DETECTOR, None), YOLO11) or not isinstance(image_size, int):
            return super()._summary(trainer, pl_module)
        return _CountedSummary(pl_module, self._max_depth, image_size)


class RichFlopsSummary(FlopsSummary, RichModelSummary):
    """RichModelSummary (the table drawn with ``rich``) with the FLOPs of ``FlopsSummary``."""


def count_flops_in_summary(trainer: L.Trainer) -> None:
    """Replaces the Trainer's ModelSummary or RichModelSummary by the class that counts FLOPs; others stay.

    Only exactly those classes are replaced, with their settings.
    """
    replaced = {ModelSummary: FlopsSummary, RichModelSummary: RichFlopsSummary}
    trainer.callbacks = [
        replaced[type(c)](c._max_depth, **c._summarize_kwargs) if type(c) in replaced else c
        for c in trainer.callbacks
    ]
