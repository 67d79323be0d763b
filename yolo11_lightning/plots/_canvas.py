"""Matplotlib without pyplot: figures that belong to no global state (safe beside any user's pyplot)."""

from __future__ import annotations

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

DPI = 100


def new_figure(width: float, height: float, constrained: bool = True) -> Figure:
    """Returns a figure of width x height inches on its own Agg canvas.

    ``constrained`` lays it out to fit its labels and legends, at about twice the drawing time of a fixed
    layout.
    """
    figure = Figure(figsize=(width, height), dpi=DPI, layout="constrained" if constrained else None)
    FigureCanvasAgg(figure)
    return figure


def to_rgb(figure: Figure) -> np.ndarray:
    """Renders the figure as an (H, W, 3) uint8 RGB image."""
    canvas = figure.canvas
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()
