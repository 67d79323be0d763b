"""``ObbTask``: oriented boxes (YOLO11-obb), what every layer asks of it (``tasks.base``).

Detection with a rotation per box: the labels carry each box's four corners (``labels.ObbCorners``, moved by every
augmentation step), a sample its rotated boxes (``labels.rotated_boxes``, the batch's (N, 7) ``targets``:
``batch.collate_obb``), the head adds one angle per anchor (``head.OBB``), the loss assigns and scores rotated boxes
with probiou (``loss.ObbLoss``), evaluation and prediction use the reference's rotated NMS (``nms.rotated_nms``) and
its OBB mAP (``metric.ObbMAP``), and predictions are rotated boxes in original pixels with their corners.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import cv2
import numpy as np
import torch
from torch import Tensor, nn

from yolo11_lightning.data.sources.checks import check_outline
from yolo11_lightning.data.sources.yolo import label_path_for
from yolo11_lightning.plots.drawing import class_color, write_label
from yolo11_lightning.tasks.detect import DetectTask
from yolo11_lightning.tasks.obb.batch import collate_obb
from yolo11_lightning.tasks.obb.head import OBB
from yolo11_lightning.tasks.obb.labels import ObbCorners, corner_problem, rotated_boxes
from yolo11_lightning.tasks.obb.loss import ObbLoss
from yolo11_lightning.tasks.obb.nms import rotated_nms
from yolo11_lightning.tasks.obb.rotated import corners

if TYPE_CHECKING:
    from yolo11_lightning.metrics.detection import DetectionMAP
    from yolo11_lightning.structures.instances import InstanceField, Instances

log = logging.getLogger(__name__)

OBB_OUTPUT_DOC = (
    "(B, 4 + nc + 1, A): the rotated box's cx, cy, w, h in input pixels, class scores, then its angle in radians "
    "(the width's direction, clockwise on the image); no NMS"
)

__all__ = ["ObbTask"]


def _dropped(coords: np.ndarray) -> bool:
    """Whether the split's reading drops an OBB row of these coordinates (``outline_labels``: a polygon row whose
    outline fails ``checks.check_outline``)."""
    return len(coords) >= 6 and len(coords) % 2 == 0 and check_outline(coords)[1] is not None


class ObbTask(DetectTask):
    """Oriented boxes: ``OBB`` head, ``ObbLoss``; (B, 4 + nc + 1, A) eval outputs (xywh, scores, angle)."""

    name: ClassVar[str] = "obb"
    words: ClassVar[str] = "oriented-box (OBB)"
    title: ClassVar[str] = "oriented object detection"
    noun: ClassVar[str] = "oriented-box detector"
    model_suffix: ClassVar[str] = "-obb"
    monitor_meaning: ClassVar[str] = (
        "oriented-box mAP at IoU 0.50:0.95 by probiou (the reference validator's rules)"
    )
    reference_class: ClassVar[str] = "OBBModel"
    reference_key: ClassVar[str | None] = "model.23.cv4.0.2.weight"  # also pose's: told apart by its width
    label_fields: ClassVar[tuple[type[InstanceField], ...]] = (ObbCorners,)
    onnx_output_doc: ClassVar[str] = OBB_OUTPUT_DOC
    validation_conf: ClassVar[float] = 0.01  # the reference's validator keeps fewer rotated candidates
    outline_labels: ClassVar[bool] = True  # rows of repeated or collinear corners: dropped, not kept as boxes

    def extra_channels(self, model: Any) -> int:
        """One channel after the class scores: the angle (radians)."""
        return 1

    def build_head(
        self, num_classes: int, channels: Sequence[int], strides: Sequence[int], reg_max: int, scale: str,
        kpt_shape: tuple[int, int] | None = None,
    ) -> nn.Module:  # fmt: skip
        return OBB(num_classes, channels, strides, reg_max)

    def matches_reference(self, state: Mapping[str, Any]) -> bool:
        """An extra branch of one channel: the angle (a pose head's is K·D keypoint values wide)."""
        key = self.reference_key
        return key in state and isinstance(state[key], Tensor) and state[key].shape[0] == 1  # type: ignore[operator]

    def build_loss(self, model: Any, box: float, cls: float, dfl: float) -> ObbLoss:
        return ObbLoss(model.num_classes, strides=model.strides, box=box, cls=cls, dfl=dfl)

    def loss(self, criterion: Any, outputs: Any, batch: dict[str, Any]) -> tuple[Tensor, Tensor]:
        """``criterion(outputs, targets)``, targets (N, 7) ``[image, class, cx, cy, w, h, r]``."""
        return criterion(outputs, batch["targets"])

    # ------------------------------------------------------------------------------------ data
    def sample_targets(
        self, image_shape: tuple[int, int], instances: Instances, options: dict[str, Any]
    ) -> tuple[np.ndarray | None, dict[str, Any]]:
        """The rotated box around each instance's moved corners (``rboxes`` (n, 5): centre and size normalised
        to the image, angle in radians), as the reference's ``Format`` turns its segments into boxes."""
        height, width = image_shape
        boxes = rotated_boxes(instances.fields[ObbCorners.name].points)  # type: ignore[attr-defined]
        boxes[:, :4] /= np.array([width, height, width, height], np.float32)
        return None, {"rboxes": torch.from_numpy(boxes)}

    def missing_targets(self, options: dict[str, Any]) -> dict[str, Any]:
        return {"rboxes": torch.zeros(0, 5)}

    def collate(self, samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        return collate_obb(samples)  # type: ignore[return-value]

    def check_records(self, records: Any, where: str) -> None:
        """Log how many instances are not labelled by four corners (box rows: axis-aligned boxes; other polygons:
        the smallest rotated rectangle around them); ``check-data --task obb`` names their rows. Rows of degenerate
        corners are not among them: the split's reading dropped them (``outline_labels``)."""
        sizes = records.arrays()["segment_sizes"]
        other = int(np.count_nonzero(sizes != 4))
        if other:
            log.warning(
                "%s: %d of %d instances are not oriented boxes of 4 corners (box rows or other polygons); "
                "`yolo11-lightning check-data --task obb` names them",
                where, other, len(sizes),
            )  # fmt: skip

    def label_problems(self, records: Sequence[Any]) -> list[str]:
        """Every row of the split's YOLO label files that is kept but not an oriented box: its value count or
        crossing sides (``labels.corner_problem``; rows of repeated or collinear corners were dropped and named by
        the split's reading). COCO json has no oriented-box field."""
        lines = []
        for record in records:
            label = label_path_for(record.path)
            try:
                with open(label, encoding="utf-8") as f:
                    rows = f.read().splitlines()
            except OSError:
                continue
            for number, row in enumerate(rows, 1):
                values = row.split()
                if not values:
                    continue
                try:
                    coords = np.array(values[1:], np.float64)
                except ValueError:
                    continue  # not a number: the parse reported the row already
                if _dropped(coords):
                    continue  # the split's reading dropped the row and named it
                why = corner_problem(coords)
                if why is not None:
                    lines.append(f"{label}:{number}: {why}")
        return lines

    # ------------------------------------------------------------------------------------ evaluation
    def make_metric(self, class_names: list[str] | None, reference_style: bool = False) -> DetectionMAP:
        from yolo11_lightning.tasks.obb.metric import ObbMAP

        return ObbMAP(class_names)

    def nms(self, module: Any, predictions: Tensor) -> list[Tensor]:
        """(B, 4 + nc + 1, A) -> per image (n, 7) ``[cx, cy, w, h, score, class, r]`` in input pixels."""
        hp = module.hparams
        return rotated_nms(
            predictions, conf_threshold=hp.conf_threshold, iou_threshold=hp.iou_threshold,
            max_detections=hp.max_detections,
        )  # fmt: skip

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
        """The rotated boxes of image ``index`` outlined in white, labelled with their class ids."""
        boxes, classes = _target_boxes(image, batch, index)
        return draw_rotated(image, boxes, classes, color=(255, 255, 255), labels=True)

    # ------------------------------------------------------------------------------------ prediction
    def predict(self, module: Any, batch: dict[str, Any]) -> list[dict[str, Tensor]]:
        """Per image ``{"detections": (n, 6), "rboxes": (n, 5)}`` in original image pixels: the rotated boxes
        ``cx, cy, w, h, r`` (r in [0, π/2), w and h swapped where the angle is turned by a quarter, as the
        reference's predictor regularises them), and ``[x1, y1, x2, y2, score, class]`` with each box's
        axis-aligned extent clipped to the image."""
        out = []
        for i, det in enumerate(module.detect(batch["images"])):
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
        """The rotated box ``xywhr`` (original pixels, r in radians) and its four corners ``[[x, y], ...]``."""
        box = extras["rboxes"][k]
        return {
            "xywhr": [round(float(v), 6 if j == 4 else 3) for j, v in enumerate(box)],
            "corners": [[round(float(x), 3), round(float(y), 3)] for x, y in corners(box).tolist()],
        }

    def draw_prediction(
        self, image: np.ndarray, detections: np.ndarray, extras: dict[str, Any], names: Sequence[str] | None,
        thickness: int,
    ) -> np.ndarray:  # fmt: skip
        """The rotated boxes in their class colours, each labelled at its topmost corner (not their axis-aligned
        extents, which only the json's ``bbox`` holds)."""
        rboxes, classes, scores = extras["rboxes"].numpy(), detections[:, 5], detections[:, 4]
        return draw_rotated(image, rboxes, classes, thickness, scores, names, labels=True)

    # ------------------------------------------------------------------------------------ export
    def onnx_extra_channels(
        self, shapes: Sequence[Sequence[Any]], kpt_shape: Sequence[int] | None = None
    ) -> int:
        """One channel after the class scores: the angle."""
        return 1


def _target_boxes(image: np.ndarray, batch: dict[str, Any], index: int) -> tuple[np.ndarray, np.ndarray]:
    """Image ``index``'s rows of the batch's (N, 7) ``targets`` as ((n, 5) xywhr in ``image``'s pixels, (n,)
    classes)."""
    targets = batch["targets"].detach().float().cpu()
    rows = targets[targets[:, 0] == index]
    height, width = image.shape[:2]
    boxes = rows[:, 2:7] * rows.new_tensor([width, height, width, height, 1])
    return boxes.numpy(), rows[:, 1].numpy()


def regularize(rboxes: Tensor) -> Tensor:
    """(n, 5) xywhr -> the same boxes with r in [0, π/2): a box turned by a further quarter swaps w and h."""
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
    """A copy of ``image`` ((H, W, 3) uint8 RGB) with (n, 5) xywhr pixel boxes outlined in ``color`` (None: their
    class colours); with ``labels``, each box's label (``visualize.write_label``: name or id, score) above its
    topmost corner."""
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
