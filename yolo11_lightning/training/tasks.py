"""What a YOLO11 task changes in ``YOLO11Module``: its loss, its metric, and what evaluation and predict return.

``YOLO11Module(task=...)`` builds the head (``YOLO11(task=...)``) and takes the rest from a ``Task``:

* ``build_loss``: the criterion (``module.criterion``), called as ``criterion(train_output, ...)``;
* ``loss``: one training batch's ``(loss, items)``, ``items`` named by ``loss_items`` (logged
  ``train/<name>_loss``);
* ``make_metric``: the validation/test metric (a ``DetectionMAP``: its ``update(outputs, batch)``);
* ``evaluate``: eval-mode forward, post-processing and metric update of one batch; returns what
  ``ValidationImages`` draws (``{"detections": [...], "masks": [...]?}``);
* ``predict``: one ``ImageBatch``'s results in original image pixels.

A new task (pose, OBB) is one more ``Task`` subclass registered in ``TASKS``; the module does not change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from torch import Tensor

from yolo11_lightning.loss import DetectionLoss
from yolo11_lightning.loss.segmentation import SegmentationLoss
from yolo11_lightning.nn.yolo11 import NUM_MASKS
from yolo11_lightning.ops.letterbox import detections_to_original
from yolo11_lightning.ops.masks import image_target_masks, masks_at_protos, segment_image
from yolo11_lightning.ops.postprocess import non_max_suppression
from yolo11_lightning.training.metrics.detection import DetectionMAP
from yolo11_lightning.training.segment_evaluation import SegmentationMAP

if TYPE_CHECKING:
    from yolo11_lightning.training.module import YOLO11Module

__all__ = ["TASKS", "DetectTask", "SegmentTask", "Task", "get_task"]


class Task:
    """Detection: the base every task extends (``DetectionLoss``, box mAP, (n, 6) detections)."""

    name: ClassVar[str] = "detect"
    loss_items: ClassVar[tuple[str, ...]] = ("box", "cls", "dfl")
    extra: ClassVar[int] = 0  # prediction channels after the class scores (NMS carries them along)
    checkpoint_monitor: ClassVar[str] = "val/mAP50-95"  # what ``best.ckpt`` follows (``BestCheckpoint``)

    def build_loss(self, num_classes: int, strides: Any, box: float, cls: float, dfl: float) -> DetectionLoss:
        return DetectionLoss(num_classes, strides=strides, box=box, cls=cls, dfl=dfl)

    def loss(self, criterion: DetectionLoss, outputs: Any, batch: dict[str, Any]) -> tuple[Tensor, Tensor]:
        """``(loss, items)`` of the train-mode ``outputs`` against the batch."""
        return criterion(outputs, batch["targets"])

    def make_metric(self, class_names: list[str] | None, reference_style: bool = False) -> DetectionMAP:
        return DetectionMAP(class_names, reference_style=reference_style)

    def nms(self, module: YOLO11Module, predictions: Tensor) -> list[Tensor]:
        """(B, 4 + nc + extra, A) -> per image (n, 6 + extra) in input pixels, the module's thresholds."""
        hp = module.hparams
        kwargs = {"extra": self.extra} if self.extra else {}
        return non_max_suppression(
            predictions, conf_threshold=hp.conf_threshold, iou_threshold=hp.iou_threshold,
            max_detections=hp.max_detections, **kwargs,
        )  # fmt: skip

    def evaluate(self, module: YOLO11Module, batch: dict[str, Any], metric: DetectionMAP) -> dict[str, Any]:
        """Detect, score into ``metric``; returns ``{"detections": [(n, 6)]}`` (what ValidationImages draws)."""
        detections = module._detect(batch["images"])
        metric.update(detections, batch)
        return {"detections": detections}

    def predict(self, module: YOLO11Module, batch: dict[str, Any]) -> list[Any]:
        """Per image an (n, 6) tensor ``[x1, y1, x2, y2, score, class]`` in original image pixels."""
        return detections_to_original(
            module._detect(batch["images"]), batch["scales"], batch["pads"], batch["orig_sizes"]
        )


DetectTask = Task


class SegmentTask(Task):
    """Instance segmentation: ``SegmentationLoss``, box + mask mAP, boxes and masks in original pixels.

    The masks' encoding (overlap index maps or one mask per instance) is read from each batch
    (``SegmentationBatch["mask_overlap"]``), so the loss follows whatever the data produces.
    """

    name: ClassVar[str] = "segment"
    loss_items: ClassVar[tuple[str, ...]] = ("box", "seg", "cls", "dfl")
    extra: ClassVar[int] = NUM_MASKS
    checkpoint_monitor: ClassVar[str] = "val/fitness"  # box + mask, as the reference's best.pt

    def build_loss(self, num_classes: int, strides: Any, box: float, cls: float, dfl: float) -> DetectionLoss:
        return SegmentationLoss(num_classes, strides=strides, box=box, cls=cls, dfl=dfl)

    @staticmethod
    def _masks(batch: dict[str, Any]) -> tuple[Tensor, bool]:
        if "masks" not in batch:
            raise ValueError(
                "the segment task needs segmentation batches (with `masks` and `mask_overlap`), but the batch "
                f"has only {sorted(batch)}: use a segmentation data module (--data.task segment)"
            )
        return batch["masks"], bool(batch.get("mask_overlap", True))

    def loss(self, criterion: DetectionLoss, outputs: Any, batch: dict[str, Any]) -> tuple[Tensor, Tensor]:
        masks, overlap = self._masks(batch)
        criterion.overlap = overlap  # type: ignore[attr-defined]
        return criterion(outputs, batch["targets"], masks, batch.get("targets_per_image"))

    def make_metric(self, class_names: list[str] | None, reference_style: bool = False) -> DetectionMAP:
        return SegmentationMAP(class_names, reference_style=reference_style)

    def segment(self, module: YOLO11Module, images: Tensor) -> tuple[list[Tensor], Tensor]:
        """Eval forward + NMS: per image (n, 6 + 32) rows in input pixels, and the (B, 32, H/4, W/4) protos."""
        predictions, protos = module.model(module._model_input(images))
        return self.nms(module, predictions), protos

    def evaluate(self, module: YOLO11Module, batch: dict[str, Any], metric: DetectionMAP) -> dict[str, Any]:
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

    def predict(self, module: YOLO11Module, batch: dict[str, Any]) -> list[dict[str, Tensor]]:
        """Per image ``{"detections": (m, 6), "masks": (m, h0, w0) bool}`` in original image pixels
        (``ops.masks.segment_image``: the reference predictor's masks; empty masks dropped)."""
        rows, protos = self.segment(module, batch["images"])
        size = batch["images"].shape[-2:]
        out = []
        for i, r in enumerate(rows):
            boxes, masks = segment_image(
                r, protos[i], size, batch["orig_sizes"][i].tolist(), batch["scales"][i], batch["pads"][i]
            )
            out.append({"detections": boxes, "masks": masks})
        return out


TASKS: dict[str, type[Task]] = {"detect": DetectTask, "segment": SegmentTask}


def get_task(name: str) -> Task:
    """The ``Task`` named ``name``; a clear error listing the known ones otherwise."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r} (model.task); choose one of {', '.join(TASKS)}")
    return TASKS[name]()
