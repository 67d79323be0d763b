"""Writing a classifier's answer on an image: its top-5 classes and probabilities, or a label (OpenCV)."""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np
from torch import Tensor

from yolo11_lightning.plots.drawing import class_color
from yolo11_lightning.tasks.classify.metric import top_classes

__all__ = ["draw_top_classes"]


def draw_top_classes(
    image: np.ndarray, probabilities: Tensor | None, names: Sequence[str] | None, label: int | None = None
) -> np.ndarray:
    """Writes one line per class at the top left of a copy of an (H, W, 3) uint8 RGB image.

    The lines are the top 5 of ``probabilities`` (nc,) with their values, or the class ``label`` alone.
    """

    def name(c: int) -> str:
        return names[c] if names is not None and c < len(names) else str(c)

    if probabilities is not None:
        classes = top_classes(probabilities[None])[0].tolist()
        lines = [(c, f"{name(c)} {float(probabilities[c]):.2f}") for c in classes]
    else:
        lines = [(int(label), name(int(label)))] if label is not None else []
    out = np.ascontiguousarray(image.copy())
    scale = max(0.3, min(out.shape[:2]) / 640)
    step = max(10, round(22 * scale))
    for i, (c, text) in enumerate(lines):
        y = step * (i + 1)
        cv2.putText(out, text, (4, y), cv2.FONT_HERSHEY_SIMPLEX, scale, (0, 0, 0), 3, cv2.LINE_AA)
        cv2.putText(out, text, (4, y), cv2.FONT_HERSHEY_SIMPLEX, scale, class_color(c), 1, cv2.LINE_AA)
    return out
