"""Label statistics drawn with OpenCV: class histogram and box scatter plots (``check-data``, the fit start).

All functions return (H, W, 3) uint8 RGB images; ``save_rgb`` from ``yolo11_lightning.plots.drawing``
writes them.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

from yolo11_lightning.plots.drawing import class_color

_WHITE, _BLACK, _GREY = (255, 255, 255), (0, 0, 0), (200, 200, 200)
_FONT = cv2.FONT_HERSHEY_SIMPLEX


def _text(img: np.ndarray, text: str, org: tuple[int, int], scale: float = 0.4, color=_BLACK) -> None:
    cv2.putText(img, text, org, _FONT, scale, color, 1, cv2.LINE_AA)


def _vertical_text(text: str, scale: float = 0.35) -> np.ndarray:
    """Renders ``text`` on a white background, rotated 90° clockwise to read top to bottom."""
    (w, h), base = cv2.getTextSize(text, _FONT, scale, 1)
    tile = np.full((h + base + 2, w + 2, 3), 255, np.uint8)
    _text(tile, text, (1, h + 1), scale)
    return cv2.rotate(tile, cv2.ROTATE_90_CLOCKWISE)


def class_histogram(counts: Sequence[int], names: Sequence[str], title: str = "") -> np.ndarray:
    """Draws a bar chart of boxes per class, the class names written vertically under the bars."""
    counts = np.asarray(counts, np.int64)
    n = max(len(counts), 1)
    bar = int(np.clip(640 // n, 10, 40)) if n <= 150 else max(2, 1500 // n)  # names need >= 10 px
    left, top, plot_h = 60, 30, 260
    label_h = min(max((cv2.getTextSize(s, _FONT, 0.35, 1)[0][0] for s in names), default=0) + 8, 160)
    width = max(left + n * bar + 20, 320)
    img = np.full((top + plot_h + label_h + 10, width, 3), 255, np.uint8)
    peak = max(int(counts.max(initial=0)), 1)
    base_y = top + plot_h
    cv2.line(img, (left, base_y), (left + n * bar, base_y), _BLACK, 1)
    cv2.line(img, (left, top), (left, base_y), _BLACK, 1)
    for frac in (0.5, 1.0):  # y ticks
        y = base_y - int(frac * plot_h)
        cv2.line(img, (left - 3, y), (left + n * bar, y), _GREY, 1)
        _text(img, f"{frac * peak:g}", (4, y + 4))
    for i, c in enumerate(counts):
        x = left + i * bar
        y = base_y - round(int(c) / peak * plot_h)
        cv2.rectangle(img, (x + 1, y), (x + bar - 2, base_y - 1), class_color(i), -1)
        if bar >= 24:
            _text(img, str(int(c)), (x + 2, max(y - 3, top - 2)), 0.33)
        if i < len(names) and bar >= 10:
            tile = _vertical_text(names[i])[:label_h, : bar - 1]
            img[base_y + 4 : base_y + 4 + tile.shape[0], x + 1 : x + 1 + tile.shape[1]] = tile
    _text(img, title or "boxes per class", (left, 18), 0.45)
    return img


def _scatter_panel(
    x: np.ndarray, y: np.ndarray, classes: np.ndarray, xlabel: str, ylabel: str, y_down: bool, size: int = 300
) -> np.ndarray:
    """Draws points in [0, 1]^2 on a square panel with axes, coloured by class; y grows down if y_down."""
    pad = 36
    img = np.full((size + 2 * pad, size + 2 * pad, 3), 255, np.uint8)
    cv2.rectangle(img, (pad, pad), (pad + size, pad + size), _BLACK, 1)
    for t in (0.0, 0.5, 1.0):
        p = pad + int(t * size)
        _text(img, f"{t:g}", (p - 6, pad + size + 14), 0.35)
        _text(img, f"{t:g}", (4, pad + (int(t * size) if y_down else size - int(t * size)) + 4), 0.35)
    px = (pad + np.clip(x, 0, 1) * size).astype(np.int32)
    py = (pad + (np.clip(y, 0, 1) if y_down else 1 - np.clip(y, 0, 1)) * size).astype(np.int32)
    if len(px) <= 20000:  # few boxes: visible dots
        for cx, cy, cls in zip(px, py, classes):
            cv2.circle(img, (int(cx), int(cy)), 2, class_color(int(cls)), -1, cv2.LINE_AA)
    else:  # many boxes: one pixel each, vectorised
        img[py, px] = np.array([class_color(int(c)) for c in range(int(classes.max()) + 1)], np.uint8)[
            classes
        ]
    cv2.rectangle(img, (pad, pad), (pad + size, pad + size), _BLACK, 1)
    _text(img, xlabel, (pad + size // 2 - 20, pad + size + 30), 0.4)
    _text(img, ylabel, (pad, pad - 10), 0.4)
    return img


def box_scatter(boxes: np.ndarray, classes: np.ndarray, title: str = "") -> np.ndarray:
    """Draws two panels: box width against height, and centre x against y, all normalised to the image."""
    boxes = np.asarray(boxes, np.float32).reshape(-1, 4)
    classes = np.asarray(classes, np.int64).reshape(-1)
    left = _scatter_panel(boxes[:, 2], boxes[:, 3], classes, "width", "height", y_down=False)
    right = _scatter_panel(
        boxes[:, 0], boxes[:, 1], classes, "centre x", "centre y (image rows)", y_down=True
    )
    img = np.concatenate([left, right], 1)
    head = np.full((24, img.shape[1], 3), 255, np.uint8)
    _text(head, title or f"{len(boxes)} boxes", (8, 17), 0.45)
    return np.concatenate([head, img], 0)
