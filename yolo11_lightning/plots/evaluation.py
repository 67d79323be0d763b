"""An evaluation's pictures: the confusion matrix, and per class the precision-recall, F1, precision and recall
curves (``metrics.class_results``). Up to 20 classes each curve has its own colour and legend entry;
beyond, the classes are thin grey lines. The thick line is the mean over the classes with truths."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from yolo11_lightning.metrics.class_results import CONFIDENCES, RECALLS, KindResults
from yolo11_lightning.plots._canvas import new_figure, to_rgb

_LEGEND_CLASSES = 20


def confusion_matrix_image(matrix: np.ndarray, names: Sequence[str], normalize: bool) -> np.ndarray:
    """Draws a (K + 1, K + 1) [predicted, true] count matrix, the background last, as an RGB image.

    The image is (H, W, 3) uint8.

    ``normalize``: each true class's column divided by its sum (the share of its truths predicted as each row)."""
    k = len(names)
    values = matrix.astype(np.float64)
    if normalize:
        sums = values.sum(0, keepdims=True)
        values = np.divide(values, sums, out=np.zeros_like(values), where=sums > 0)
    labels = [*names, "background"]
    side = float(np.clip(0.45 * (k + 1) + 3, 5, 24))
    figure = new_figure(side + 1.5, side)
    axes = figure.add_subplot(1, 1, 1)
    shown = np.where(values > 0, values, np.nan)  # empty cells stay white
    image = axes.imshow(shown, cmap="Blues", vmin=0, vmax=1 if normalize else max(values.max(), 1))
    figure.colorbar(image, ax=axes, shrink=0.8)
    if k + 1 <= 30:
        ticks = np.arange(k + 1)
        axes.set_xticks(ticks, labels, rotation=90, fontsize=8)
        axes.set_yticks(ticks, labels, fontsize=8)
        threshold = (1 if normalize else max(values.max(), 1)) * 0.6
        for (row, column), value in np.ndenumerate(values):
            if value > 0:
                text = f"{value:.2f}" if normalize else str(int(value))
                color = "white" if value > threshold else "black"
                axes.text(column, row, text, ha="center", va="center", fontsize=7, color=color)
    axes.set_xlabel("true")
    axes.set_ylabel("predicted")
    axes.set_title("confusion matrix" + (", normalised per true class" if normalize else " (counts)"))
    return to_rgb(figure)


def pr_curve_image(results: KindResults, names: Sequence[str], kind: str = "box") -> np.ndarray:
    """Draws precision against recall at IoU 0.5 per class, AP50 in the legend, as an RGB image.

    The image is (H, W, 3) uint8.
    """
    figure = new_figure(8, 6)
    axes = figure.add_subplot(1, 1, 1)
    _per_class(axes, RECALLS, results.pr_curve, results.ap50, names, "{:.3f}")
    mean = np.nanmean(results.pr_curve, 0) if _present(results).any() else np.zeros(len(RECALLS))
    axes.plot(RECALLS, mean, color="tab:blue", linewidth=3, label=f"all classes {results.map50:.3f} mAP50")
    _finish(axes, "recall", "precision", f"{kind} precision-recall (IoU 0.5)")
    return to_rgb(figure)


def confidence_curve_image(
    results: KindResults, names: Sequence[str], which: str, kind: str = "box"
) -> np.ndarray:
    """Draws f1, precision or recall against the confidence threshold per class as an RGB image.

    ``which`` picks the measure; the mean's best F1 threshold is marked. The image is (H, W, 3) uint8.
    """
    curves = getattr(results, which)
    figure = new_figure(8, 6)
    axes = figure.add_subplot(1, 1, 1)
    _per_class(axes, CONFIDENCES, curves, None, names, "")
    mean = np.nanmean(curves, 0) if _present(results).any() else np.zeros(len(CONFIDENCES))
    best = results.best_confidence
    at_best = float(np.interp(best, CONFIDENCES, mean))
    label = {"f1": "F1", "precision": "precision", "recall": "recall"}[which]
    axes.plot(
        CONFIDENCES, mean, color="tab:blue", linewidth=3, label=f"all classes {at_best:.2f} at {best:.3f}"
    )
    axes.axvline(best, color="tab:red", linestyle="--", linewidth=1)
    _finish(axes, "confidence", label, f"{kind} {label} against confidence (IoU 0.5)")
    return to_rgb(figure)


def _present(results: KindResults) -> np.ndarray:
    return ~np.isnan(results.ap50)


def _per_class(axes, x: np.ndarray, curves: np.ndarray, scores: np.ndarray | None, names: Sequence[str],
               score_format: str) -> None:  # fmt: skip
    """Draws one line per class with truths: coloured with a legend entry to 20 classes, thin grey beyond."""
    present = [i for i in range(len(curves)) if not np.isnan(curves[i]).all()]
    legend = len(present) <= _LEGEND_CLASSES
    for i in present:
        name = names[i] if i < len(names) else str(i)
        if legend:
            label = f"{name} {score_format.format(scores[i])}" if scores is not None else name
            axes.plot(x, curves[i], linewidth=1, label=label)
        else:
            axes.plot(x, curves[i], linewidth=0.5, color="grey")


def _finish(axes, xlabel: str, ylabel: str, title: str) -> None:
    axes.set_xlim(0, 1)
    axes.set_ylim(0, 1.02)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=7)
