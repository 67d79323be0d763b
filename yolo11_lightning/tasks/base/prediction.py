"""What prediction and the pictures ask of a task, with detection's answers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from yolo11_lightning.ops.letterbox import detections_to_original
from yolo11_lightning.plots.drawing import draw_boxes
from yolo11_lightning.tasks.base.module_view import ModuleView

__all__ = ["TaskPrediction"]


def _target_boxes(image: np.ndarray, batch: dict[str, Any], index: int) -> tuple[np.ndarray, np.ndarray]:
    """Returns image ``index``'s target rows as (n, 4) xyxy boxes in the image's pixels and (n,) classes."""
    targets = batch["targets"].detach().float().cpu()
    rows = targets[targets[:, 0] == index]
    height, width = image.shape[:2]
    scale = rows.new_tensor([width, height])
    centre, size = rows[:, 2:4] * scale, rows[:, 4:6] * scale
    return torch.cat((centre - size / 2, centre + size / 2), 1).numpy(), rows[:, 1].numpy()


class TaskPrediction:
    """Prediction and the pictures: the task's hooks, listed in the module docstring."""

    def draw_evaluated(
        self, image: np.ndarray, outputs: dict[str, Any], index: int, keep: Tensor,
        names: Sequence[str] | None,
    ) -> np.ndarray:  # fmt: skip
        """Draws image ``index`` of an evaluate result on ``image``, the detections where ``keep``."""
        det = outputs["detections"][index].detach().float().cpu()[keep]
        return draw_boxes(image, det[:, :4].numpy(), det[:, 5].numpy(), det[:, 4].numpy(), names)

    def draw_targets(
        self, image: np.ndarray, batch: dict[str, Any], index: int, names: Sequence[str] | None
    ) -> np.ndarray:
        """Draws the labels of image ``index`` of a training batch on ``image``: boxes in their class colours.

        ``image`` is (H, W, 3) uint8 RGB in the batch's pixels.
        """
        boxes, classes = _target_boxes(image, batch, index)
        return draw_boxes(image, boxes, classes, names=names)

    def draw_ground_truth(self, image: np.ndarray, batch: dict[str, Any], index: int) -> np.ndarray:
        """Draws the labels of image ``index`` of an evaluation batch in white: boxes with their class ids.

        ``image`` is (H, W, 3) uint8 RGB in the batch's pixels; the labels go under the predictions of the
        validation images.
        """
        boxes, classes = _target_boxes(image, batch, index)
        return draw_boxes(image, boxes, classes, color=(255, 255, 255))

    def predict(self, module: ModuleView, batch: dict[str, Any]) -> list[Any]:
        """Predicts per image an (n, 6) tensor [x1, y1, x2, y2, score, class] in original image pixels."""
        return detections_to_original(
            module.forward_with_nms(batch["images"]), batch["scales"], batch["pads"], batch["orig_sizes"]
        )

    def split_result(self, result: Any) -> tuple[Tensor, dict[str, Any]]:
        """Splits one image's predict result into (n, 6) detections and per-detection host-array extras."""
        return result, {}

    def result_fields(self, extras: dict[str, Any], k: int) -> dict[str, Any]:
        """Returns the json fields of detection ``k`` beyond its box, score and class."""
        return {}

    def image_fields(self, extras: dict[str, Any]) -> dict[str, Any]:
        """Returns the json row of the whole image from split_result's extras, such as a classifier's top 5.

        Empty, so no row, for a task whose answers are its detections.
        """
        return {}

    def draw_under_boxes(self, image: np.ndarray, classes: np.ndarray, extras: dict[str, Any]) -> np.ndarray:
        """Draws what an annotated copy shows under the boxes; draw_prediction draws the boxes over it."""
        return image

    def draw_prediction(
        self, image: np.ndarray, detections: np.ndarray, extras: dict[str, Any], names: Sequence[str] | None,
        thickness: int,
    ) -> np.ndarray:  # fmt: skip
        """Draws the annotated copy of one predicted image, the boxes labelled with their names and scores.

        ``draw_under_boxes``'s picture lies under the boxes of the (n, 6) ``detections`` ``[x1, y1, x2, y2,
        score, class]``.
        """
        image = self.draw_under_boxes(image, detections[:, 5], extras)
        boxes, classes, scores = detections[:, :4], detections[:, 5], detections[:, 4]
        return draw_boxes(image, boxes, classes, scores, names, thickness=thickness)
