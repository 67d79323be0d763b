"""The benchmark's picture: latency per image against the metric, one labelled point per format."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from yolo11_lightning.plots._canvas import new_figure, to_rgb

__all__ = ["latency_accuracy"]


def latency_accuracy(
    labels: Sequence[str], latency_ms: Sequence[float], metric: Sequence[float], metric_name: str, title: str
) -> np.ndarray:
    """An (H, W, 3) RGB scatter of ``latency_ms`` (x, log scale) against ``metric`` (y), each point labelled."""
    figure = new_figure(6.4, 4.4)
    ax = figure.add_subplot()
    ax.scatter(latency_ms, metric, color="tab:blue", zorder=2)
    for label, x, y in zip(labels, latency_ms, metric):
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    if len(latency_ms) and min(latency_ms) > 0:
        ax.set_xscale("log")
    ax.set_xlabel("latency per image at batch 1 (ms)")
    ax.set_ylabel(metric_name)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    return to_rgb(figure)
