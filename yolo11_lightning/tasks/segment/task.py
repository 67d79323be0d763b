"""``SegmentTask``: instance segmentation (YOLO11-seg), what every layer asks of it (``tasks.base``).

Detection plus one mask per instance: the labels carry a polygon per box (``structures``), a sample carries its
masks at 1/4 of the image side (``masks.rasterize``), the head adds 32 mask coefficients per anchor and 32
prototype masks per image (``head.Segment``), the loss a mask BCE (``loss.SegmentationLoss``), the metric the mask
mAP (``metric.SegmentationMAP``), and predictions their masks in original pixels (``mask_ops.segment_image``),
written as COCO RLE.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from yolo11_lightning.nn.scales import scaled_channels
from yolo11_lightning.plots.drawing import draw_masks
from yolo11_lightning.structures.polygons import Polygons
from yolo11_lightning.tasks.detect import DetectTask
from yolo11_lightning.tasks.segment.batch import collate_segmentation
from yolo11_lightning.tasks.segment.head import Segment
from yolo11_lightning.tasks.segment.loss import SegmentationLoss
from yolo11_lightning.tasks.segment.mask_ops import (
    encode_rle,
    image_target_masks,
    masks_at_protos,
    segment_image,
)
from yolo11_lightning.tasks.segment.masks import rasterize

if TYPE_CHECKING:
    from yolo11_lightning.loss.detection import DetectionLoss
    from yolo11_lightning.metrics.detection import DetectionMAP
    from yolo11_lightning.structures.instances import InstanceField, Instances

__all__ = ["NUM_MASKS", "PROTO_CHANNELS", "SegmentTask"]

log = logging.getLogger(__name__)

NUM_MASKS = 32  # mask coefficients per anchor and prototypes per image (YOLO11-seg)
PROTO_CHANNELS = 256  # hidden width of Proto at width 1, scaled like any layer
SEGMENT_OUTPUT_DOC = (
    "output0 (B, 4 + nc + 32, A): cx, cy, w, h in input pixels, class scores, 32 mask coefficients; no NMS. "
    "output1 (B, 32, H/4, W/4): mask prototypes; a mask is sigmoid(coefficients @ prototypes) > 0.5 in its box"
)


class SegmentTask(DetectTask):
    """Instance segmentation: ``Segment`` head, ``SegmentationLoss``, box + mask mAP, boxes and masks.

    The masks' encoding (overlap index maps or one mask per instance) is read from each batch
    (``SegmentationBatch["mask_overlap"]``), so the loss follows whatever the data produces.
    """

    name: ClassVar[str] = "segment"
    words: ClassVar[str] = "segmentation"
    title: ClassVar[str] = "instance segmentation"
    noun: ClassVar[str] = "instance segmenter"
    model_suffix: ClassVar[str] = "-seg"
    reference_class: ClassVar[str] = "SegmentationModel"
    reference_key: ClassVar[str | None] = "model.23.proto.cv1.conv.weight"  # only a Segment head has it
    loss_items: ClassVar[tuple[str, ...]] = ("box", "seg", "cls", "dfl")
    checkpoint_monitor: ClassVar[str] = "val/fitness"  # box + mask, as the reference's best.pt
    monitor_meaning: ClassVar[str] = (
        "0.1 mAP50 + 0.9 mAP50-95 of the boxes plus the same of the masks, 0 to 2"
    )
    reported_metrics: ClassVar[tuple[str, ...]] = ("mAP50-95", "mAP50", "mask_mAP50-95", "mask_mAP50")
    checked_metrics: ClassVar[tuple[str, ...]] = ("mAP50-95", "mask_mAP50-95")
    label_fields: ClassVar[tuple[type[InstanceField], ...]] = (Polygons,)
    onnx_outputs: ClassVar[tuple[str, ...]] = ("output0", "output1")
    onnx_output_doc: ClassVar[str] = SEGMENT_OUTPUT_DOC

    # ------------------------------------------------------------------------------------ network
    def build_head(
        self, num_classes: int, channels: Sequence[int], strides: Sequence[int], reg_max: int, scale: str,
        kpt_shape: tuple[int, int] | None = None,
    ) -> nn.Module:  # fmt: skip
        return Segment(
            num_classes, channels, strides, reg_max, NUM_MASKS, scaled_channels(scale, PROTO_CHANNELS)
        )

    def extra_channels(self, model: Any) -> int:
        """The 32 mask coefficients per anchor."""
        return NUM_MASKS

    # ------------------------------------------------------------------------------------ loss
    def build_loss(self, model: Any, box: float, cls: float, dfl: float) -> DetectionLoss:
        return SegmentationLoss(model.num_classes, strides=model.strides, box=box, cls=cls, dfl=dfl)

    @staticmethod
    def _masks(batch: dict[str, Any]) -> tuple[Tensor, bool]:
        if "masks" not in batch:
            raise ValueError(
                "the segment task needs segmentation batches (with `masks` and `mask_overlap`), but the batch "
                f"has only {sorted(batch)}: use a segmentation data module (--data.task segment)"
            )
        return batch["masks"], bool(batch.get("mask_overlap", True))

    def loss(self, criterion: Any, outputs: Any, batch: dict[str, Any]) -> tuple[Tensor, Tensor]:
        masks, overlap = self._masks(batch)
        criterion.overlap = overlap  # type: ignore[attr-defined]
        return criterion(outputs, batch["targets"], masks, batch.get("targets_per_image"))

    # ------------------------------------------------------------------------------------ data
    def sample_targets(
        self, image_shape: tuple[int, int], instances: Instances, options: dict[str, Any]
    ) -> tuple[np.ndarray | None, dict[str, Any]]:
        """The sample's masks from its outlines, and the row order they imply (overlap: larger first)."""
        outlines = instances.fields[Polygons.name].points  # type: ignore[attr-defined]
        masks, order = rasterize(
            outlines, image_shape[0], image_shape[1], overlap=options.get("mask_overlap", True)
        )
        return order, {"masks": torch.from_numpy(masks)}

    def missing_targets(self, options: dict[str, Any]) -> dict[str, Any]:
        return {"masks": torch.zeros(0, 0, dtype=torch.uint8)}

    def collate(self, samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        return collate_segmentation(samples)

    def check_records(self, records: Any, where: str) -> None:
        """Log how many instances have no polygon (their masks are their boxes' rectangles)."""
        instances, missing = records.num_labels(), records.num_labels() - records.num_polygons()
        if missing:
            log.warning(
                "%s: %d of %d instances have no polygon (box rows, annotations without segmentation, or "
                "polygons dropped by the checks): their masks are their boxes' rectangles",
                where, missing, instances,
            )  # fmt: skip

    # ------------------------------------------------------------------------------------ evaluation
    def make_metric(self, class_names: list[str] | None, reference_style: bool = False) -> DetectionMAP:
        from yolo11_lightning.tasks.segment.metric import SegmentationMAP

        return SegmentationMAP(class_names, reference_style=reference_style)

    def segment(self, module: Any, images: Tensor) -> tuple[list[Tensor], Tensor]:
        """Eval forward + NMS: per image (n, 6 + 32) rows in input pixels, and the (B, 32, H/4, W/4) protos."""
        predictions, protos = module.model(module.model_input(images))
        return self.nms(module, predictions), protos

    def evaluate(self, module: Any, batch: dict[str, Any], metric: DetectionMAP) -> dict[str, Any]:
        """Box and mask scoring as the reference validator: masks at proto resolution (``masks_at_protos``)
        against the ground truth at the same 1/4 resolution (``image_target_masks``)."""
        masks, overlap = self._masks(batch)
        rows, protos = self.segment(module, batch["images"])
        size = batch["images"].shape[-2:]
        detections = [r[:, :6] for r in rows]
        predicted = [masks_at_protos(protos[i], r[:, 6:], r[:, :4], size) for i, r in enumerate(rows)]
        truths = [
            image_target_masks(masks, overlap, batch["targets"], i) for i in range(len(batch["images"]))
        ]
        metric.update(detections, batch, predicted, truths)  # type: ignore[call-arg]
        return {"detections": detections, "masks": predicted}

    def draw_evaluated(
        self, image: np.ndarray, outputs: dict[str, Any], index: int, keep: Tensor,
        names: Sequence[str] | None,
    ) -> np.ndarray:  # fmt: skip
        """The predicted masks (a light colour overlay) under the boxes."""
        det = outputs["detections"][index].detach().float().cpu()[keep]
        masks = outputs["masks"][index].detach().cpu()[keep]
        image = draw_masks(image, masks.numpy(), det[:, 5].numpy())
        return super().draw_evaluated(image, outputs, index, keep, names)

    def draw_targets(
        self, image: np.ndarray, batch: dict[str, Any], index: int, names: Sequence[str] | None
    ) -> np.ndarray:
        """The ground-truth masks under the boxes."""
        targets = batch["targets"].detach().cpu()
        masks = image_target_masks(batch["masks"].detach().cpu(), batch["mask_overlap"], targets, index)
        image = draw_masks(image, masks.numpy(), targets[targets[:, 0] == index, 1].numpy())
        return super().draw_targets(image, batch, index, names)

    # ------------------------------------------------------------------------------------ prediction
    def predict(self, module: Any, batch: dict[str, Any]) -> list[dict[str, Tensor]]:
        """Per image ``{"detections": (m, 6), "masks": (m, h0, w0) bool}`` in original image pixels
        (``mask_ops.segment_image``: the reference predictor's masks; empty masks dropped)."""
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
        """The instance mask as COCO compressed RLE (``{"size": [h, w], "counts"}``)."""
        return {"segmentation": encode_rle(extras["masks"][k])}

    def draw(self, image: np.ndarray, classes: np.ndarray, extras: dict[str, Any]) -> np.ndarray:
        masks = extras["masks"]
        return draw_masks(image, masks, classes) if len(masks) else image

    # ------------------------------------------------------------------------------------ export
    def onnx_output_axes(self, dynamic: bool) -> list[dict[int, str]]:
        """Detection's output plus the prototypes, whose height and width follow the image's when free."""
        protos = {0: "batch", 2: "proto_height", 3: "proto_width"} if dynamic else {0: "batch"}
        return [*super().onnx_output_axes(dynamic), protos]

    def onnx_output_dims(self, model: Any, size: tuple[int, int], dynamic: bool) -> list[dict[int, int]]:
        """Detection's output plus the prototypes (B, 32, H/4, W/4)."""
        num_masks = model.head.nm
        protos = {1: num_masks} if dynamic else {1: num_masks, 2: size[0] // 4, 3: size[1] // 4}
        return [*super().onnx_output_dims(model, size, dynamic), protos]

    def onnx_output_order(self, shapes: Sequence[Sequence[Any]]) -> list[int]:
        """Predictions (3-D) first, prototypes (4-D) second, whatever order the file lists them in."""
        return [1, 0] if len(shapes[0]) == 4 else [0, 1]

    def onnx_extra_channels(
        self, shapes: Sequence[Sequence[Any]], kpt_shape: Sequence[int] | None = None
    ) -> int:
        """The mask coefficients per anchor: the prototypes' channel count."""
        proto_shape = list(shapes[1])
        if len(proto_shape) != 4 or not isinstance(proto_shape[1], int):
            raise ValueError(f"second output {proto_shape} is not the prototypes (B, nm, H/4, W/4)")
        return proto_shape[1]
