"""Detection mAP on torchmetrics, fed with the DataModule's batches and the post-processed detections."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torchmetrics.detection import MeanAveragePrecision
from torchvision.ops import box_convert

from yolo11_lightning.ops.postprocess import letterbox_to_original


class DetectionMAP(nn.Module):
    """COCO-style mAP (IoU 0.50:0.05:0.95, 101-point) in original image pixels.

    Wraps ``torchmetrics.detection.MeanAveragePrecision`` (faster-coco-eval backend). Under DDP,
    ``compute()`` gathers every rank's images; with unpadded eval sharding each image counts once, so the
    distributed value equals the single-process value.
    """

    def __init__(self, class_names: list[str] | None = None, max_detections: int = 300) -> None:
        super().__init__()
        self.class_names = class_names
        self.metric = MeanAveragePrecision(
            box_format="xyxy",
            iou_type="bbox",
            class_metrics=True,
            backend="faster_coco_eval",
            max_detection_thresholds=[1, 10, max_detections],
        )

    @staticmethod
    def to_original(detections: list[Tensor], batch: dict[str, Any]) -> list[Tensor]:
        """Map (n, 6) detections from letterboxed-input pixels to original image pixels."""
        out = []
        for i, det in enumerate(detections):
            det = det.clone()
            det[:, :4] = letterbox_to_original(
                det[:, :4], batch["scales"][i], batch["pads"][i], batch["orig_sizes"][i]
            )
            out.append(det)
        return out

    @staticmethod
    def targets_to_original(batch: dict[str, Any]) -> list[dict[str, Tensor]]:
        """Ground truth of each image as {"boxes": (m, 4) xyxy original pixels, "labels": (m,)}."""
        targets, images = batch["targets"], batch["images"]
        height, width = images.shape[-2:]
        size = torch.tensor([width, height, width, height], device=targets.device, dtype=targets.dtype)
        boxes = box_convert(targets[:, 2:6] * size, "cxcywh", "xyxy")
        out = []
        for i in range(images.shape[0]):
            mine = targets[:, 0] == i
            original = letterbox_to_original(
                boxes[mine], batch["scales"][i], batch["pads"][i], batch["orig_sizes"][i]
            )
            out.append({"boxes": original, "labels": targets[mine, 1].long()})
        return out

    def update(self, detections: list[Tensor], batch: dict[str, Any]) -> None:
        preds = [
            {"boxes": d[:, :4].float(), "scores": d[:, 4].float(), "labels": d[:, 5].long()}
            for d in self.to_original(detections, batch)
        ]
        self.metric.update(preds, self.targets_to_original(batch))

    def compute(self) -> dict[str, Tensor]:
        """{"mAP50-95", "mAP50", "mAP75", "AP/<class name>"...}; classes absent from the data are left out."""
        result = self.metric.compute()
        out = {"mAP50-95": result["map"], "mAP50": result["map_50"], "mAP75": result["map_75"]}
        classes = result.get("classes")
        per_class = result.get("map_per_class")
        if classes is not None and per_class is not None and per_class.numel() == classes.numel():
            for cls, ap in zip(classes.reshape(-1).tolist(), per_class.reshape(-1)):
                name = self.class_names[cls] if self.class_names and cls < len(self.class_names) else str(cls)
                out[f"AP/{name}"] = ap
        return out

    def reset(self) -> None:
        self.metric.reset()
