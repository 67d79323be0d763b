"""ResultPictures: the pictures people look at first, in the run folder and in the loggers that take images.

Into ``<log_dir>/pictures/`` (rank 0 only; each group can be turned off):

* ``curves``: ``results.png``, the training losses, the validation metrics and the learning rates per epoch,
  redrawn at epoch ends (when the last drawing is 20 drawing-times old: short epochs are not slowed) and at the
  end of fit, when it also goes to the loggers. The history is kept in checkpoints, so a resumed run, on any
  world size, goes on drawing the same curves;
* ``labels``: at the start of fit, ``labels_per_class.png`` and ``labels_boxes.png``, the training labels'
  statistics (``plots.labels``);
* ``train_batches``: the first N training batches of a fit as they enter the model, augmented, with their
  labels (``train_batch<i>.jpg``);
* ``evaluation``: at the end of fit (the last validation), of ``validate`` and of ``test``, in ``val/`` or
  ``test/``: ``confusion_matrix.png`` (counts; also ``confusion_matrix.csv``, rows predicted, columns true) and
  ``confusion_matrix_normalized.png``, and per kind of
  prediction (``box``, and ``mask`` for segmentation) ``<kind>_PR_curve.png``, ``<kind>_F1_curve.png``,
  ``<kind>_P_curve.png`` and ``<kind>_R_curve.png`` (``plots.evaluation``; the numbers are
  ``metrics.class_results``, drawn from what validation already scored).

Drawing never fails a run: a picture that cannot be drawn or saved is reported once, and training goes on.
"""

from __future__ import annotations

import csv
import logging
import time
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
from lightning.pytorch.callbacks import Callback

from yolo11_lightning.plots.drawing import image_grid
from yolo11_lightning.training.callbacks._pictures import save, save_and_log

log = logging.getLogger(__name__)

_CURVES_SPACING = 20  # the curves are redrawn once at least 20 times their drawing time has passed

# Per-epoch validation values drawn in the curves (``val/<name>``); the per-class APs are not.
_CURVE_METRICS = (
    "mAP50-95", "mAP50", "mask_mAP50-95", "mask_mAP50", "pose_mAP50-95", "pose_mAP50", "top1", "top5", "loss",
    "fitness",
)  # fmt: skip


class ResultPictures(Callback):
    """Result pictures of a run; see the module docstring.

    Args:
        curves: draw ``results.png`` at epoch ends (at most 1/20 of the run's time) and at the end of fit.
        evaluation: draw the confusion matrices and per-class curves at the end of fit, validate and test.
        labels: draw the training labels' statistics at the start of fit.
        train_batches: how many of the first training batches to draw (0: none).
    """

    def __init__(
        self, curves: bool = True, evaluation: bool = True, labels: bool = True, train_batches: int = 3
    ) -> None:
        self.curves = curves
        self.evaluation = evaluation
        self.labels = labels
        self.train_batches = train_batches
        self.history: dict[str, dict[int, float]] = {}  # series -> {epoch: value}
        self.out_dir: Path | None = None
        self._batches_drawn = 0
        self._curves_drawn_at = -float("inf")  # time.monotonic() of the last drawing of the curves
        self._curves_seconds = 0.0  # how long it took
        self._curves: tuple[dict, np.ndarray] | None = None  # the history last drawn, and its picture
        self._warned: set[str] = set()

    # ------------------------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {"history": {name: dict(points) for name, points in self.history.items()}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = {
            str(name): {int(e): float(v) for e, v in points.items()}
            for name, points in state_dict.get("history", {}).items()
        }

    # ------------------------------------------------------------------------------------ hooks
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # trainer.log_dir broadcasts from rank 0: every rank must ask, never rank 0 alone (it would hang).
        self.out_dir = Path(trainer.log_dir or trainer.default_root_dir) / "pictures"
        if self.evaluation and trainer.is_global_zero and hasattr(pl_module, "keep_evaluations"):
            pl_module.keep_evaluations()

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._batches_drawn = 0
        if self.labels and trainer.is_global_zero:
            self._guarded("labels", self._draw_labels, trainer, pl_module)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._batches_drawn >= self.train_batches or not trainer.is_global_zero:
            return
        self._batches_drawn += 1
        self._guarded("train_batches", self._draw_batch, trainer, pl_module, batch, self._batches_drawn - 1)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        if trainer.state.fn == "fit":
            epoch = trainer.current_epoch
            for name in _CURVE_METRICS:
                value = trainer.callback_metrics.get(f"val/{name}")
                if value is not None:
                    self.history.setdefault(f"val/{name}", {})[epoch] = float(value)
        elif trainer.state.fn == "validate" and self.evaluation and trainer.is_global_zero:
            self._guarded("evaluation", self._draw_evaluation, trainer, pl_module, "val")

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        epoch = trainer.current_epoch
        means = pl_module.epoch_loss_means() if hasattr(pl_module, "epoch_loss_means") else {}
        for name, value in means.items():
            self.history.setdefault(name, {})[epoch] = value
        for o, optimizer in enumerate(trainer.optimizers):
            for g, group in enumerate(optimizer.param_groups):
                name = f"lr/pg{g}" if len(trainer.optimizers) == 1 else f"lr/opt{o}_pg{g}"
                self.history.setdefault(name, {})[epoch] = float(group["lr"])
        if self.curves and trainer.is_global_zero and self._curves_due():
            self._guarded("curves", self._draw_curves, trainer, False)

    def _curves_due(self) -> bool:
        """Tells whether to redraw at an epoch end: not when the last drawing was recent.

        Drawing takes about 0.4 s and at most 1/20 of the time between drawings, so short epochs are not
        slowed; the end of fit always draws.
        """
        return time.monotonic() - self._curves_drawn_at >= _CURVES_SPACING * self._curves_seconds

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        if self.curves and self.history:
            self._guarded("curves", self._draw_curves, trainer, True)
        if self.evaluation:
            self._guarded("evaluation", self._draw_evaluation, trainer, pl_module, "val")

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.evaluation and trainer.is_global_zero:
            self._guarded("evaluation", self._draw_evaluation, trainer, pl_module, "test")

    # ------------------------------------------------------------------------------------ drawing
    def _guarded(self, what: str, draw: Any, *args: Any) -> None:
        """Runs ``draw``, rank 0's optional output, which must never end the run nor keep the others waiting.

        Waiting here means in a collective.
        """
        try:
            draw(*args)
        except Exception as e:  # any failure of optional output is only reported
            if what not in self._warned:
                log.warning(
                    "ResultPictures: could not draw or save the %s pictures (%s: %s); training goes on, later "
                    "failures of these are not reported", what, type(e).__name__, e,
                )  # fmt: skip
                self._warned.add(what)

    def _path(self, trainer: L.Trainer, name: str) -> Path:
        return (self.out_dir or Path(trainer.default_root_dir) / "pictures") / name

    def _draw_curves(self, trainer: L.Trainer, to_loggers: bool) -> None:
        """Draws results.png from the history; sends it to the loggers at the end of fit only.

        The loggers plot the same scalars per step themselves.
        """
        from yolo11_lightning.plots.training_curves import training_curves

        start = time.monotonic()
        order = sorted(self.history, key=lambda n: (not n.startswith("train/"), n.startswith("lr/"), n))
        drawn = {name: dict(self.history[name]) for name in order}
        if self._curves is None or self._curves[0] != drawn:  # unchanged since the last drawing: reused
            self._curves = (drawn, training_curves(drawn))
        image = self._curves[1]
        path = self._path(trainer, "results.png")
        if not to_loggers:
            save(path, image)
        else:
            save_and_log(trainer, path, image, "pictures/results")
        self._curves_drawn_at = time.monotonic()
        self._curves_seconds = self._curves_drawn_at - start

    def _draw_labels(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        from yolo11_lightning.plots.labels import box_scatter, class_histogram

        datasets = getattr(getattr(trainer, "datamodule", None), "datasets", None) or {}
        records = getattr(datasets.get("train"), "records", None)
        if records is None or not hasattr(records, "all_classes"):
            return
        classes, boxes = records.all_classes(), records.all_boxes()
        names = list(
            pl_module.hparams.get("class_names") or [str(i) for i in range(int(classes.max(initial=0)) + 1)]
        )
        counts = np.bincount(classes, minlength=len(names))
        title = f"training labels: boxes per class ({len(records)} images)"
        save_and_log(trainer, self._path(trainer, "labels_per_class.png"), class_histogram(counts, names, title),
                     "pictures/labels_per_class")  # fmt: skip
        scatter = box_scatter(boxes, classes, f"training labels: {len(boxes)} boxes, size and centre")
        save_and_log(trainer, self._path(trainer, "labels_boxes.png"), scatter, "pictures/labels_boxes")

    def _draw_batch(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, index: int) -> None:
        images = batch["images"][:16].permute(0, 2, 3, 1).cpu().numpy()
        if not len(images):
            return
        names = pl_module.hparams.get("class_names")
        task = getattr(pl_module, "task", None)
        drawn = [
            task.draw_targets(image, batch, i, names) if task else image for i, image in enumerate(images)
        ]
        grid = image_grid(drawn, columns=4)
        save_and_log(
            trainer, self._path(trainer, f"train_batch{index}.jpg"), grid, f"pictures/train_batch{index}"
        )

    def _draw_evaluation(self, trainer: L.Trainer, pl_module: L.LightningModule, split: str) -> None:
        results = pl_module.class_results(split) if hasattr(pl_module, "class_results") else None
        if results is None:
            return
        from yolo11_lightning.plots.evaluation import (
            confidence_curve_image,
            confusion_matrix_image,
            pr_curve_image,
        )

        pictures = {
            "confusion_matrix": confusion_matrix_image(results.confusion, results.names, normalize=False),
            "confusion_matrix_normalized": confusion_matrix_image(results.confusion, results.names, normalize=True),
        }  # fmt: skip
        for kind, kind_results in results.kinds.items():
            pictures[f"{kind}_PR_curve"] = pr_curve_image(kind_results, results.names, kind)
            for which, short in (("f1", "F1"), ("precision", "P"), ("recall", "R")):
                pictures[f"{kind}_{short}_curve"] = confidence_curve_image(
                    kind_results, results.names, which, kind
                )
        for name, image in pictures.items():
            save_and_log(
                trainer, self._path(trainer, f"{split}/{name}.png"), image, f"pictures/{split}/{name}"
            )
        labels = [*results.names, "background"]
        with open(self._path(trainer, f"{split}/confusion_matrix.csv"), "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["predicted \\ true", *labels])
            writer.writerows([label, *row] for label, row in zip(labels, results.confusion.tolist()))
