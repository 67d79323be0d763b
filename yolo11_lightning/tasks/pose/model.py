"""Pose estimation's model hooks for tasks.base.model: its head, reference files and loss."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from torch import Tensor, nn

from yolo11_lightning.tasks.base.model import TaskModel
from yolo11_lightning.tasks.pose.head import Pose
from yolo11_lightning.tasks.pose.loss import PoseLoss

if TYPE_CHECKING:
    pass

__all__ = ["DEFAULT_KPT_SHAPE", "PoseModel"]

DEFAULT_KPT_SHAPE = (
    17,
    3,
)  # COCO persons: 17 keypoints of x, y, visibility (the reference's yolo11-pose.yaml)
_KEYPOINT_OUTPUT = "head.cv4.0.2.weight"  # our key of the first level's keypoint output conv (K·D, c4, 1, 1)


class PoseModel(TaskModel):
    """Pose estimation's model hooks, listed in the module docstring."""

    model_suffix: ClassVar[str] = "-pose"
    reference_class: ClassVar[str] = "PoseModel"
    reference_key: ClassVar[str | None] = "model.23.cv4.0.2.weight"  # also OBB's: told apart by its width
    loss_items: ClassVar[tuple[str, ...]] = ("box", "pose", "kobj", "cls", "dfl")
    option_keys: ClassVar[tuple[str, ...]] = ("kpt_shape",)

    def check_kpt_shape(self, kpt_shape: Sequence[int] | None) -> tuple[int, int]:
        """Returns the (K, D) keypoint shape: the given one, (17, 3) when None.

        K >= 1 keypoints of D = 2 (x, y) or 3 (x, y, visibility).
        """
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
        """Returns K·D keypoint values per anchor, from the model's kpt_shape."""
        k, d = model.kpt_shape
        return k * d

    def matches_reference(self, state: Mapping[str, Any]) -> bool:
        """Tells whether the head's keypoint branch is over one channel wide; an OBB head's is one angle."""
        key = self.reference_key
        return key in state and isinstance(state[key], Tensor) and state[key].shape[0] > 1  # type: ignore[operator]

    def kpt_shape_from_state(self, state: Mapping[str, Tensor]) -> tuple[int, int] | None:
        """Infers the keypoint shape from the outputs' count K·D: D = 3 when it divides by 3, else D = 2.

        A file that says its ``kpt_shape`` is read from it instead.
        """
        weight = state.get(_KEYPOINT_OUTPUT)
        if weight is None:
            return None
        nk = int(weight.shape[0])
        return (nk // 3, 3) if nk % 3 == 0 else (nk // 2, 2) if nk % 2 == 0 else None

    def model_options(self, model: Any) -> dict[str, Any]:
        """Returns kpt_shape [K, D], the model's keypoint shape."""
        return {"kpt_shape": [int(v) for v in model.kpt_shape]}

    def options_from(
        self, values: Mapping[str, Any], where: str, state: Mapping[str, Tensor] | None = None
    ) -> dict[str, Any]:
        """Reads kpt_shape, checked as check_kpt_shape does.

        Without one, it is the one ``state``'s keypoint outputs imply (``kpt_shape_from_state``), else the
        default (17, 3).
        """
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
        """Returns criterion(outputs, targets, keypoints) with the batch's normalised (N, K, D) keypoints."""
        if "keypoints" not in batch:
            raise ValueError(
                f"the pose task needs batches with `keypoints` (N, K, D), but the batch has only {sorted(batch)}"
            )
        return criterion(outputs, batch["targets"], batch["keypoints"])
