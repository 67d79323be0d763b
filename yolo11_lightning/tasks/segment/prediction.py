"""Segmentation's prediction and drawing hooks for tasks.base.prediction: results, json fields, pictures."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from torch import Tensor

from yolo11_lightning.plots.drawing import draw_masks
from yolo11_lightning.tasks.base.prediction import TaskPrediction
from yolo11_lightning.tasks.segment.mask_ops import encode_rle, image_target_masks, segment_image

__all__ = ["SegmentPrediction"]


class SegmentPrediction(TaskPrediction):
    """Segmentation's prediction and drawing hooks, listed in the module docstring."""

    def draw_evaluated(
        self, image: np.ndarray, outputs: dict[str, Any], index: int, keep: Tensor,
        names: Sequence[str] | None,
    ) -> np.ndarray:  # fmt: skip
        """Draws the predicted masks as a light colour overlay under the boxes."""
        det = outputs["detections"][index].detach().float().cpu()[keep]
        masks = outputs["masks"][index].detach().cpu()[keep]
        image = draw_masks(image, masks.numpy(), det[:, 5].numpy())
        return super().draw_evaluated(image, outputs, index, keep, names)

    def draw_targets(
        self, image: np.ndarray, batch: dict[str, Any], index: int, names: Sequence[str] | None
    ) -> np.ndarray:
        """Draws the ground-truth masks under the boxes."""
        targets = batch["targets"].detach().cpu()
        masks = image_target_masks(batch["masks"].detach().cpu(), batch["mask_overlap"], targets, index)
        image = draw_masks(image, masks.numpy(), targets[targets[:, 0] == index, 1].numpy())
        return super().draw_targets(image, batch, index, names)

    def predict(self, module: Any, batch: dict[str, Any]) -> list[dict[str, Tensor]]:
        """Predicts per image {"detections": (m, 6), "masks": (m, h0, w0) bool} in original image pixels.

        The masks are the reference predictor's (``mask_ops.segment_image``); empty masks are dropped.
        """
        rows, protos = self.segment(module, batch["images"])
        size = batch["images"].shape[-2:]
        out = []
        for i, r in enumerate(rows):
            boxes, masks = segment_image(
                r, protos[i], size, batch["orig_sizes"][i].tolist(), batch["scales"][i], batch["pads"][i]
            )
            out.append({"detections": boxes, "masks": masks})
        return out

    def split_result(self, result: Any) -> tuple[Tensor, dict[str, Any]]:
        return result["detections"], {"masks": result["masks"].detach().cpu().numpy()}

    def result_fields(self, extras: dict[str, Any], k: int) -> dict[str, Any]:
        """Returns the instance mask as COCO compressed RLE, {"size": [h, w], "counts"}."""
        return {"segmentation": encode_rle(extras["masks"][k])}

    def draw_under_boxes(self, image: np.ndarray, classes: np.ndarray, extras: dict[str, Any]) -> np.ndarray:
        masks = extras["masks"]
        return draw_masks(image, masks, classes) if len(masks) else image
