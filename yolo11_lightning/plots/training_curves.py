"""Training curves: one panel per logged series (losses, validation metrics, learning rates) against the epoch."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from matplotlib.ticker import MaxNLocator

from yolo11_lightning.plots._canvas import new_figure, to_rgb


def training_curves(history: Mapping[str, Mapping[int, float]], columns: int = 5) -> np.ndarray:
    """Draws one panel per series of ``history`` {series name: {epoch: value}}, in its order, as an RGB image.

    The image is (H, W, 3) uint8.

    Each panel draws the values with markers and, from 10 epochs on, a moving average over 5 epochs."""
    names = [name for name, points in history.items() if points]
    rows = max(1, -(-len(names) // columns))
    height = 2.5 * rows
    figure = new_figure(3.0 * min(columns, max(len(names), 1)), height, constrained=False)
    figure.subplots_adjust(
        left=0.06, right=0.99, bottom=0.45 / height, top=1 - 0.3 / height, wspace=0.3, hspace=0.55
    )
    if not names:
        axes = figure.add_subplot(1, 1, 1)
        axes.text(0.5, 0.5, "nothing logged yet", ha="center", va="center")
        axes.set_axis_off()
        return to_rgb(figure)
    for i, name in enumerate(names):
        epochs = np.array(sorted(history[name]), dtype=np.int64)
        values = np.array([history[name][e] for e in epochs], dtype=np.float64)
        axes = figure.add_subplot(rows, min(columns, len(names)), i + 1)
        axes.plot(epochs, values, marker="o", markersize=3, linewidth=1.5, label="value")
        if len(values) >= 10:
            kernel = np.ones(5) / 5
            axes.plot(
                epochs[2:-2], np.convolve(values, kernel, mode="valid"), ":", linewidth=2, label="smooth"
            )
        axes.set_title(name, fontsize=9)
        axes.set_xlabel("epoch", fontsize=8)
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        if len(epochs) == 1:
            axes.set_xticks(epochs)
        axes.tick_params(labelsize=7)
        axes.grid(alpha=0.3)
        if name.startswith("lr"):
            axes.ticklabel_format(axis="y", style="sci", scilimits=(-2, 2))
    return to_rgb(figure)
