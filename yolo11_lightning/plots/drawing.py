"""Drawing boxes and masks on images (OpenCV) for previews, validation images and predictions."""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

_PALETTE = np.array(
    [(255, 56, 56), (72, 249, 10), (0, 194, 255), (255, 157, 151), (146, 204, 23), (187, 212, 0),
     (255, 178, 29), (52, 69, 147), (207, 210, 49), (100, 115, 255), (255, 112, 31), (132, 56, 255)],
    dtype=np.uint8,
)  # fmt: skip


def class_color(class_id: int) -> tuple[int, int, int]:
    """Returns a stable RGB colour per class."""
    return tuple(int(c) for c in _PALETTE[int(class_id) % len(_PALETTE)])


def draw_boxes(
    image: np.ndarray,
    boxes_xyxy: np.ndarray,
    classes: np.ndarray,
    scores: np.ndarray | None = None,
    names: Sequence[str] | None = None,
    thickness: int = 1,
    color: tuple[int, int, int] | None = None,
) -> np.ndarray:
    """Draws labelled xyxy pixel boxes on a copy of an (H, W, 3) uint8 RGB image."""
    out = np.ascontiguousarray(image.copy())
    for i, (box, cls) in enumerate(
        zip(np.asarray(boxes_xyxy).reshape(-1, 4), np.asarray(classes).reshape(-1))
    ):
        x1, y1, x2, y2 = (round(float(v)) for v in box)
        box_color = color or class_color(int(cls))
        cv2.rectangle(out, (x1, y1), (x2, y2), box_color, thickness, cv2.LINE_AA)
        write_label(out, (x1, y1), int(cls), None if scores is None else float(scores[i]), names, box_color)
    return out


def write_label(
    image: np.ndarray,
    corner: tuple[int, int],
    class_id: int,
    score: float | None,
    names: Sequence[str] | None,
    color: tuple[int, int, int],
) -> None:
    """Writes a box's label just above ``corner``, in place on the image.

    The label is the class name, else its id, and the score; ``corner`` is (x, y) pixels and the image a
    contiguous (H, W, 3) uint8 RGB array.
    """
    label = names[class_id] if names is not None and class_id < len(names) else str(class_id)
    if score is not None:
        label = f"{label} {score:.2f}"
    x, y = corner
    cv2.putText(image, label, (x, max(y - 2, 8)), cv2.FONT_HERSHEY_SIMPLEX, 0.3, color, 1, cv2.LINE_AA)


def draw_masks(image: np.ndarray, masks: np.ndarray, classes: np.ndarray, alpha: float = 0.4) -> np.ndarray:
    """Blends binary (n, h, w) masks in their class colours into a copy of an (H, W, 3) uint8 RGB image.

    Masks of another size than the image (e.g. 1/4-resolution validation masks) are resized nearest-neighbour;
    later masks are drawn over earlier ones.
    """
    out = np.ascontiguousarray(image.copy())
    masks = np.asarray(masks).astype(bool).reshape(-1, *np.asarray(masks).shape[-2:])
    height, width = out.shape[:2]
    for mask, cls in zip(masks, np.asarray(classes).reshape(-1)):
        if mask.shape != (height, width):
            mask = cv2.resize(mask.astype(np.uint8), (width, height), interpolation=cv2.INTER_NEAREST) > 0
        color = np.array(class_color(int(cls)), dtype=np.float32)
        out[mask] = (out[mask] * (1 - alpha) + color * alpha).round().astype(np.uint8)
    return out


def image_grid(images: Sequence[np.ndarray], columns: int = 4, fill: int = 114) -> np.ndarray:
    """Tiles equally sized (H, W, 3) images into one mosaic, ``columns`` wide."""
    if not images:
        raise ValueError("image_grid needs at least one image")
    h, w = images[0].shape[:2]
    columns = min(columns, len(images))
    rows = -(-len(images) // columns)
    grid = np.full((rows * h, columns * w, 3), fill, dtype=np.uint8)
    for i, img in enumerate(images):
        r, c = divmod(i, columns)
        grid[r * h : (r + 1) * h, c * w : (c + 1) * w] = img[:h, :w]
    return grid


def save_rgb(path: str, image: np.ndarray) -> None:
    """Writes an RGB image; OpenCV expects BGR."""
    if not cv2.imwrite(str(path), cv2.cvtColor(image, cv2.COLOR_RGB2BGR)):
        raise OSError(f"could not write image {path}")
