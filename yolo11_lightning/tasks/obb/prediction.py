"""Oriented-box prediction and drawing hooks for tasks.base.prediction: results, json fields, pictures."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import cv2
import numpy as np
import torch
from torch import Tensor

from yolo11_lightning.plots.drawing import class_color, write_label
from yolo11_lightning.tasks.base.prediction import TaskPrediction
from yolo11_lightning.tasks.obb.rotated import corners

__all__ = ["ObbPrediction"]


def _target_boxes(image: np.ndarray, batch: dict[str, Any], index: int) -> tuple[np.ndarray, np.ndarray]:
    """Returns image ``index``'s (N, 7) target rows as (n, 5) xywhr in the image's pixels and (n,) classes."""
    targets = batch["targets"].detach().float().cpu()
    rows = targets[targets[:, 0] == index]
    height, width = image.shape[:2]
    boxes = rows[:, 2:7] * rows.new_tensor([width, height, width, height, 1])
    return boxes.numpy(), rows[:, 1].numpy()


def regularize(rboxes: Tensor) -> Tensor:
    """Turns (n, 5) xywhr boxes to r in [0, π/2): a box turned by a further quarter swaps w and h."""
    swap = rboxes[:, 4] % math.pi >= math.pi / 2
    out = rboxes.clone()
    out[:, 2] = torch.where(swap, rboxes[:, 3], rboxes[:, 2])
    out[:, 3] = torch.where(swap, rboxes[:, 2], rboxes[:, 3])
    out[:, 4] = rboxes[:, 4] % (math.pi / 2)
    return out


def draw_rotated(
    image: np.ndarray,
    rboxes: np.ndarray,
    classes: np.ndarray,
    thickness: int = 1,
    scores: np.ndarray | None = None,
    names: Sequence[str] | None = None,
    color: tuple[int, int, int] | None = None,
    labels: bool = False,
) -> np.ndarray:
    """Outlines (n, 5) xywhr pixel boxes on a copy of an (H, W, 3) uint8 RGB image.

    The outlines are in ``color``, or their class colours when it is None. With ``labels`` each box's label
    (``visualize.write_label``: name or id, score) goes above its topmost corner.
    """
    out = np.ascontiguousarray(image.copy())
    pts = corners(torch.as_tensor(np.asarray(rboxes, np.float32)).reshape(-1, 5)).numpy()
    for i, (outline, cls) in enumerate(zip(pts, np.asarray(classes).reshape(-1))):
        box_color = color or class_color(int(cls))
        polygon = np.round(outline).astype(np.int32)
        cv2.polylines(out, [polygon], True, box_color, thickness, cv2.LINE_AA)
        if labels:
            x, y = min(polygon.tolist(), key=lambda p: (p[1], p[0]))
            score = None if scores is None else float(np.asarray(scores).reshape(-1)[i])
            write_label(out, (x, y), int(cls), score, names, box_color)
    return out


class ObbPrediction(TaskPrediction):
    """Oriented-box detection's prediction and drawing hooks, listed in the module docstring."""

    def draw_evaluated(
        self, image: np.ndarray, outputs: dict[str, Any], index: int, keep: Tensor,
        names: Sequence[str] | None,
    ) -> np.ndarray:  # fmt: skip
        det = outputs["detections"][index].detach().float().cpu()[keep]
        return draw_rotated(image, torch.cat((det[:, :4], det[:, 6:7]), 1).numpy(), det[:, 5].numpy())

    def draw_targets(
        self, image: np.ndarray, batch: dict[str, Any], index: int, names: Sequence[str] | None
    ) -> np.ndarray:
        boxes, classes = _target_boxes(image, batch, index)
        return draw_rotated(image, boxes, classes)

    def draw_ground_truth(self, image: np.ndarray, batch: dict[str, Any], index: int) -> np.ndarray:
        """Outlines the rotated boxes of image ``index`` in white, labelled with their class ids."""
        boxes, classes = _target_boxes(image, batch, index)
        return draw_rotated(image, boxes, classes, color=(255, 255, 255), labels=True)

    def predict(self, module: Any, batch: dict[str, Any]) -> list[dict[str, Tensor]]:
        """Predicts per image {"detections": (n, 6), "rboxes": (n, 5)} in original image pixels.

        The rotated boxes are ``cx, cy, w, h, r`` (r in [0, π/2), w and h swapped where the angle is turned by
        a quarter, as the reference's predictor regularises them); the detections are ``[x1, y1, x2, y2,
        score, class]`` with each box's axis-aligned extent clipped to the image.
        """
        out = []
        for i, det in enumerate(module.forward_with_nms(batch["images"])):
            rboxes = regularize(torch.cat((det[:, :4], det[:, 6:7]), 1).float())
            scale = batch["scales"][i].to(rboxes)
            scale = scale.reshape(-1).repeat(2)[:2] if scale.numel() > 1 else scale.expand(2)
            rboxes[:, :2] = (rboxes[:, :2] - batch["pads"][i].to(rboxes)) / scale
            rboxes[:, 2:4] /= scale
            h0, w0 = (float(v) for v in batch["orig_sizes"][i])
            pts = corners(rboxes)
            extent = torch.cat((pts.amin(1), pts.amax(1)), 1)
            extent[:, 0::2] = extent[:, 0::2].clamp(0, w0)
            extent[:, 1::2] = extent[:, 1::2].clamp(0, h0)
            out.append({"detections": torch.cat((extent, det[:, 4:6].float()), 1), "rboxes": rboxes})
        return out

    def split_result(self, result: Any) -> tuple[Tensor, dict[str, Any]]:
        return result["detections"], {"rboxes": result["rboxes"].detach().float().cpu()}

    def result_fields(self, extras: dict[str, Any], k: int) -> dict[str, Any]:
        """Returns the rotated box xywhr in original pixels, r in radians, and its corners [[x, y], ...]."""
        box = extras["rboxes"][k]
        return {
            "xywhr": [round(float(v), 6 if j == 4 else 3) for j, v in enumerate(box)],
            "corners": [[round(float(x), 3), round(float(y), 3)] for x, y in corners(box).tolist()],
        }

    def draw_prediction(
        self, image: np.ndarray, detections: np.ndarray, extras: dict[str, Any], names: Sequence[str] | None,
        thickness: int,
    ) -> np.ndarray:  # fmt: skip
        """Draws the rotated boxes in their class colours, each labelled at its topmost corner.

        Not their axis-aligned extents, which only the json's ``bbox`` holds.
        """
        rboxes, classes, scores = extras["rboxes"].numpy(), detections[:, 5], detections[:, 4]
        return draw_rotated(image, rboxes, classes, thickness, scores, names, labels=True)
