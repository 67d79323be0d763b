"""``PoseTask``: keypoints (YOLO11-pose), what every layer asks of it (``tasks.base``).

Detection plus K keypoints of D values per instance (``kpt_shape``, COCO persons: (17, 3)): the head adds K·D
channels per anchor (``head.Pose``), the loss a keypoint term and a visibility term (``loss.PoseLoss``). The model,
its reference files and its loss are here; the data (keypoint labels, flips), pose mAP, prediction and export are
not yet (``not_yet``: runs are refused by ``tasks.choice``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from yolo11_lightning.data.labels.keypoints import Keypoints
from yolo11_lightning.tasks.detect import DetectTask
from yolo11_lightning.tasks.pose.batch import collate_pose
from yolo11_lightning.tasks.pose.head import Pose
from yolo11_lightning.tasks.pose.loss import PoseLoss

if TYPE_CHECKING:
    from yolo11_lightning.data.labels.instances import InstanceField, Instances
    from yolo11_lightning.training.metrics.detection import DetectionMAP

__all__ = ["DEFAULT_KPT_SHAPE", "PoseTask"]

DEFAULT_KPT_SHAPE = (
    17,
    3,
)  # COCO persons: 17 keypoints of x, y, visibility (the reference's yolo11-pose.yaml)
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
    reported_metrics: ClassVar[tuple[str, ...]] = ("mAP50-95", "mAP50", "pose_mAP50-95", "pose_mAP50")
    checked_metrics: ClassVar[tuple[str, ...]] = ("mAP50-95", "pose_mAP50-95")
    not_yet: ClassVar[str] = "its data (keypoint labels and flips), pose mAP, prediction and export"

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
