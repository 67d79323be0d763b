"""``PoseTask``: keypoints (YOLO11-pose), what every layer asks of it (``tasks.base``).

Detection plus K keypoints of D values per instance (``kpt_shape``, COCO persons: (17, 3); a dataset yaml's
``kpt_shape`` with its ``flip_idx``, or a COCO keypoints json's categories' keypoint names): the labels carry them (``structures.keypoints.Keypoints``, moved by every
augmentation step), a batch its ``keypoints`` (N, K, 3) (``batch``), the head adds K·D channels per anchor
(``head.Pose``), the loss a keypoint term and a visibility term (``loss.PoseLoss``), the metric the keypoint mAP
by OKS (``metric.PoseMAP``), predictions their keypoints in original pixels (``drawing``: skeletons, COCO json
keypoints), an ONNX file its ``kpt_shape`` in the metadata.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from yolo11_lightning.ops.letterbox import detections_to_original
from yolo11_lightning.structures.keypoints import Keypoints
from yolo11_lightning.tasks.detect import DetectTask
from yolo11_lightning.tasks.pose.batch import collate_pose
from yolo11_lightning.tasks.pose.drawing import draw_keypoints, keypoints_to_original
from yolo11_lightning.tasks.pose.head import Pose
from yolo11_lightning.tasks.pose.loss import PoseLoss

if TYPE_CHECKING:
    from yolo11_lightning.metrics.detection import DetectionMAP
    from yolo11_lightning.structures.instances import InstanceField, Instances

__all__ = ["DEFAULT_KPT_SHAPE", "PoseTask"]

DEFAULT_KPT_SHAPE = (
    17,
    3,
)  # COCO persons: 17 keypoints of x, y, visibility (the reference's yolo11-pose.yaml)
POSE_OUTPUT_DOC = (
    "(B, 4 + nc + K*D, A): cx, cy, w, h in input pixels, class scores, then per keypoint x, y in input pixels "
    "(and a visibility score in (0, 1) when D = 3); K, D: metadata kpt_shape; no NMS"
)
_KEYPOINT_OUTPUT = "head.cv4.0.2.weight"  # our key of the first level's keypoint output conv (K·D, c4, 1, 1)


class PoseTask(DetectTask):
    """Keypoints: ``Pose`` head, ``PoseLoss``; (n, 6 + K·D) detections once NMS carries the keypoints."""

    name: ClassVar[str] = "pose"
    words: ClassVar[str] = "keypoint (pose)"
    title: ClassVar[str] = "pose estimation"
    noun: ClassVar[str] = "pose estimator"
    model_suffix: ClassVar[str] = "-pose"
    reference_class: ClassVar[str] = "PoseModel"
    reference_key: ClassVar[str | None] = "model.23.cv4.0.2.weight"  # also OBB's: told apart by its width
    loss_items: ClassVar[tuple[str, ...]] = ("box", "pose", "kobj", "cls", "dfl")
    label_fields: ClassVar[tuple[type[InstanceField], ...]] = (Keypoints,)
    checkpoint_monitor: ClassVar[str] = "val/fitness"  # box + pose, as the reference's best.pt
    monitor_meaning: ClassVar[str] = (
        "0.1 mAP50 + 0.9 mAP50-95 of the boxes plus the same of the keypoints (OKS), 0 to 2"
    )
    reported_metrics: ClassVar[tuple[str, ...]] = ("mAP50-95", "mAP50", "pose_mAP50-95", "pose_mAP50")
    checked_metrics: ClassVar[tuple[str, ...]] = ("mAP50-95", "pose_mAP50-95")
    onnx_output_doc: ClassVar[str] = POSE_OUTPUT_DOC
    # A keypoint is its raw offset times 2·stride (64 px per unit at P5), twice a box side's DFL gain: measured
    # gaps reach 2x detection's on random reference weights (5.5e-4 at 160 px); 4 leaves a margin.
    onnx_tolerance_gain: ClassVar[float] = 4.0
    option_keys: ClassVar[tuple[str, ...]] = ("kpt_shape",)

    def check_kpt_shape(self, kpt_shape: Sequence[int] | None) -> tuple[int, int]:
        """(K, D): the given shape, (17, 3) when None; K >= 1 keypoints of D = 2 (x, y) or 3 (x, y, visibility)."""
        if kpt_shape is None:
            return DEFAULT_KPT_SHAPE
        shape = tuple(kpt_shape)
        if (
            len(shape) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in shape)
            or shape[0] < 1
            or shape[1] not in (2, 3)
        ):
            raise ValueError(
                f"kpt_shape must be [K, D]: K >= 1 keypoints of D = 2 (x, y) or 3 (x, y, visibility) values, "
                f"got {kpt_shape!r}"
            )
        return (shape[0], shape[1])

    def build_head(
        self, num_classes: int, channels: Sequence[int], strides: Sequence[int], reg_max: int, scale: str,
        kpt_shape: tuple[int, int] | None = None,
    ) -> nn.Module:  # fmt: skip
        return Pose(num_classes, channels, strides, reg_max, kpt_shape or DEFAULT_KPT_SHAPE)

    def extra_channels(self, model: Any) -> int:
        """K·D keypoint values per anchor (the model's ``kpt_shape``)."""
        k, d = model.kpt_shape
        return k * d

    def matches_reference(self, state: Mapping[str, Any]) -> bool:
        """A keypoint branch more than one channel wide (an OBB head's is one angle)."""
        key = self.reference_key
        return key in state and isinstance(state[key], Tensor) and state[key].shape[0] > 1  # type: ignore[operator]

    def kpt_shape_from_state(self, state: Mapping[str, Tensor]) -> tuple[int, int] | None:
        """From the keypoint outputs' count K·D alone: D = 3 when it divides by 3, else D = 2 (a file that says
        its ``kpt_shape`` is read from it instead)."""
        weight = state.get(_KEYPOINT_OUTPUT)
        if weight is None:
            return None
        nk = int(weight.shape[0])
        return (nk // 3, 3) if nk % 3 == 0 else (nk // 2, 2) if nk % 2 == 0 else None

    def model_options(self, model: Any) -> dict[str, Any]:
        """``kpt_shape`` [K, D], the model's keypoint shape."""
        return {"kpt_shape": [int(v) for v in model.kpt_shape]}

    def options_from(
        self, values: Mapping[str, Any], where: str, state: Mapping[str, Tensor] | None = None
    ) -> dict[str, Any]:
        """``kpt_shape`` checked as ``check_kpt_shape`` does; without one, the one ``state``'s keypoint outputs
        imply (``kpt_shape_from_state``), else none: (17, 3)."""
        shape = values.get("kpt_shape")
        if shape is None:
            implied = None if state is None else self.kpt_shape_from_state(state)
            return {} if implied is None else {"kpt_shape": implied}
        try:
            return {"kpt_shape": self.check_kpt_shape(shape)}
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None

    def build_loss(self, model: Any, box: float, cls: float, dfl: float) -> PoseLoss:
        return PoseLoss(model.num_classes, model.kpt_shape, strides=model.strides, box=box, cls=cls, dfl=dfl)

    def loss(self, criterion: Any, outputs: Any, batch: dict[str, Any]) -> tuple[Tensor, Tensor]:
        """``criterion(outputs, targets, keypoints)``: the batch's ``keypoints`` (N, K, D), normalised."""
        if "keypoints" not in batch:
            raise ValueError(
                f"the pose task needs batches with `keypoints` (N, K, D), but the batch has only {sorted(batch)}"
            )
        return criterion(outputs, batch["targets"], batch["keypoints"])

    # ------------------------------------------------------------------------------------ data
    def sample_targets(
        self, image_shape: tuple[int, int], instances: Instances, options: dict[str, Any]
    ) -> tuple[np.ndarray | None, dict[str, Any]]:
        """The sample's ``keypoints`` (n, K, 3): x, y normalised to the (h, w) image, and the visibility."""
        points = instances.fields[Keypoints.name].points.copy()  # type: ignore[attr-defined]
        points[..., 0] /= image_shape[1]
        points[..., 1] /= image_shape[0]
        return None, {"keypoints": torch.from_numpy(points)}

    def missing_targets(self, options: dict[str, Any]) -> dict[str, Any]:
        return {"keypoints": torch.zeros(0, 0, 3)}

    def collate(self, samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        return collate_pose(samples)

    # ------------------------------------------------------------------------------------ evaluation
    def make_metric(self, class_names: list[str] | None, reference_style: bool = False) -> DetectionMAP:
        from yolo11_lightning.tasks.pose.metric import PoseMAP

        return PoseMAP(class_names, reference_style=reference_style)

    def pose(self, module: Any, images: Tensor) -> list[Tensor]:
        """Eval forward + NMS: per image (n, 6 + K·D) rows in input pixels: box, score, class, keypoints."""
        return self.nms(module, module.model(module.model_input(images)))

    def evaluate(self, module: Any, batch: dict[str, Any], metric: DetectionMAP) -> dict[str, Any]:
        """Box and keypoint scoring (``metric.PoseMAP``); returns the detections and their (n, K, D) keypoints."""
        rows = self.pose(module, batch["images"])
        k, d = module.model.kpt_shape
        detections = [r[:, :6] for r in rows]
        keypoints = [r[:, 6:].reshape(-1, k, d) for r in rows]
        metric.update(detections, batch, keypoints)  # type: ignore[call-arg]
        return {"detections": detections, "keypoints": keypoints}

    def draw_evaluated(
        self, image: np.ndarray, outputs: dict[str, Any], index: int, keep: Tensor,
        names: Sequence[str] | None,
    ) -> np.ndarray:  # fmt: skip
        """The predicted keypoints and skeleton under the boxes."""
        det = outputs["detections"][index].detach().float().cpu()[keep]
        points = outputs["keypoints"][index].detach().float().cpu()[keep]
        image = draw_keypoints(image, points.numpy(), det[:, 5].numpy())
        return super().draw_evaluated(image, outputs, index, keep, names)

    def draw_targets(
        self, image: np.ndarray, batch: dict[str, Any], index: int, names: Sequence[str] | None
    ) -> np.ndarray:
        """The labelled keypoints (visibility 1 or 2) and skeleton under the boxes."""
        targets = batch["targets"].detach().cpu()
        own = targets[:, 0] == index
        points = batch["keypoints"].detach().float().cpu()[own].clone()
        points[..., 0] *= image.shape[1]
        points[..., 1] *= image.shape[0]
        image = draw_keypoints(image, points.numpy(), targets[own, 1].numpy())
        return super().draw_targets(image, batch, index, names)

    # ------------------------------------------------------------------------------------ prediction
    def predict(self, module: Any, batch: dict[str, Any]) -> list[dict[str, Tensor]]:
        """Per image ``{"detections": (n, 6), "keypoints": (n, K, D)}`` in original image pixels (clipped)."""
        rows = self.pose(module, batch["images"])
        k, d = module.model.kpt_shape
        detections = detections_to_original(
            [r[:, :6] for r in rows], batch["scales"], batch["pads"], batch["orig_sizes"]
        )
        out = []
        for i, (r, det) in enumerate(zip(rows, detections)):
            points = keypoints_to_original(
                r[:, 6:].reshape(-1, k, d), batch["scales"][i], batch["pads"][i], batch["orig_sizes"][i]
            )
            out.append({"detections": det, "keypoints": points})
        return out

    def split_result(self, result: Any) -> tuple[Tensor, dict[str, Any]]:
        return result["detections"], {"keypoints": result["keypoints"].detach().float().cpu().numpy()}

    def result_fields(self, extras: dict[str, Any], k: int) -> dict[str, Any]:
        """COCO keypoints ``[x1, y1, v1, x2, y2, v2, ...]`` in original pixels; v is the predicted visibility
        score in (0, 1) (D = 3, as the reference's json) or 1 (D = 2)."""
        points = extras["keypoints"][k]
        if points.shape[-1] == 2:
            points = np.concatenate([points, np.ones_like(points[:, :1])], 1)
        return {"keypoints": [round(float(v), 3) for v in points.reshape(-1)]}

    def draw(self, image: np.ndarray, classes: np.ndarray, extras: dict[str, Any]) -> np.ndarray:
        points = extras["keypoints"]
        return draw_keypoints(image, points, classes) if len(points) else image

    # ------------------------------------------------------------------------------------ export
    def onnx_metadata(self, model: Any) -> dict[str, str]:
        """``kpt_shape`` as the reference's ONNX client reads it (a Python literal)."""
        return {"kpt_shape": repr([int(v) for v in model.kpt_shape])}

    def onnx_extra_channels(
        self, shapes: Sequence[Sequence[Any]], kpt_shape: Sequence[int] | None = None
    ) -> int:
        """K·D from the file's ``kpt_shape`` metadata (required: the output's width alone cannot tell)."""
        if kpt_shape is None:
            raise ValueError("a pose model's file must say its kpt_shape (metadata `kpt_shape`)")
        return int(kpt_shape[0]) * int(kpt_shape[1])
