"""Drawing keypoints and their skeleton (OpenCV), and mapping predicted keypoints back to original pixels.

Keypoints are drawn as small discs in a colour per keypoint index, joined by the skeleton's limbs in their
instance's class colour: COCO's 19 limbs for 17 keypoints (the reference draws those only), otherwise each
keypoint to the next (a chain), which shows a figure's order. A keypoint whose visibility (a label's 0/1/2 or a
prediction's score) is below ``VISIBLE`` is not drawn, nor are its limbs.
"""

from __future__ import annotations

import cv2
import numpy as np
import torch
from torch import Tensor

from yolo11_lightning.ops.letterbox import letterbox_to_original
from yolo11_lightning.plots.drawing import class_color

__all__ = ["COCO_SKELETON", "VISIBLE", "draw_keypoints", "keypoints_to_original", "skeleton"]

VISIBLE = 0.5  # the reference's drawing threshold on a keypoint's visibility score
# COCO's person skeleton, 0-based (ankle-knee-hip, torso, arms, face), as the reference draws it.
COCO_SKELETON = (
    (15, 13), (13, 11), (16, 14), (14, 12), (11, 12), (5, 11), (6, 12), (5, 6), (5, 7), (6, 8), (7, 9),
    (8, 10), (1, 2), (0, 1), (0, 2), (1, 3), (2, 4), (3, 5), (4, 6),
)  # fmt: skip


def skeleton(num_keypoints: int) -> tuple[tuple[int, int], ...]:
    """Returns the limbs drawn for K keypoints: COCO's for 17, else a chain 0-1, 1-2, ..."""
    if num_keypoints == 17:
        return COCO_SKELETON
    return tuple((k, k + 1) for k in range(num_keypoints - 1))


def keypoints_to_original(points: Tensor, scale: Tensor | float, pad: Tensor, orig_size: Tensor) -> Tensor:
    """Maps (n, K, D) keypoints from letterboxed-input to original pixels, clipped to the image.

    Any values after x, y are kept.
    """
    n, k = points.shape[:2]
    xy = points[..., :2].reshape(-1, 2)
    out = letterbox_to_original(torch.cat((xy, xy), 1), scale, pad, orig_size)[:, :2]
    return torch.cat((out.reshape(n, k, 2), points[..., 2:]), -1)


def draw_keypoints(
    image: np.ndarray, keypoints: np.ndarray, classes: np.ndarray, radius: int = 2
) -> np.ndarray:
    """Draws (n, K, D) pixel keypoints and their skeleton on a copy of an (H, W, 3) uint8 RGB image.

    No instance (n = 0, an image with nothing detected or labelled) or no keypoint (K = 0) draws nothing.
    """
    out = np.ascontiguousarray(image.copy())
    points = np.asarray(keypoints, np.float64)
    if points.size == 0:
        return out
    points = points.reshape(len(points), -1, points.shape[-1])
    limbs = skeleton(points.shape[1])
    for person, cls in zip(points, np.asarray(classes).reshape(-1)):
        shown = person[:, 2] >= VISIBLE if person.shape[1] > 2 else np.ones(len(person), bool)
        xy = np.round(person[:, :2]).astype(int).tolist()
        for a, b in limbs:
            if shown[a] and shown[b]:
                cv2.line(out, tuple(xy[a]), tuple(xy[b]), class_color(int(cls)), 1, cv2.LINE_AA)
        for k, (x, y) in enumerate(xy):
            if shown[k]:
                cv2.circle(out, (x, y), radius, class_color(k + 7), -1, cv2.LINE_AA)
    return out
