"""What the network, the model files and the loss ask of a task, with detection's answers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, ClassVar

from torch import Tensor, nn

from yolo11_lightning.loss.detection import DetectionLoss
from yolo11_lightning.nn.blocks import BN_EPS, BN_MOMENTUM
from yolo11_lightning.nn.yolo11 import YOLO11, HeadSpec, detect_head

__all__ = ["TaskModel"]


class TaskModel:
    """The network, the model files and the loss: the task's hooks, listed in the module docstring."""

    model_suffix: ClassVar[str]  # the reference's file names: yolo11n<suffix>.pt
    reference_class: ClassVar[str]  # the reference's model class of the task
    reference_key: ClassVar[str | None] = None  # a state-dict key only this task's reference files have
    # backbone and neck (head at reference layer 23); False: backbone only (layer 10)
    has_neck: ClassVar[bool] = True
    # (eps, momentum) of every BatchNorm: the reference's detection models set (1e-3, 0.03); its classifier keeps
    # PyTorch's defaults (its ClassificationModel never calls the reference's initialize_weights)
    batch_norm: ClassVar[tuple[float, float]] = (BN_EPS, BN_MOMENTUM)
    class_branch: ClassVar[str] = "head.cv3."  # our keys of the head's class branch (widths follow nc)
    class_key: ClassVar[str] = "head.cv3.0.2.weight"  # our key of a tensor whose first dimension is nc
    loss_items: ClassVar[tuple[str, ...]] = ("box", "cls", "dfl")

    @property
    def head_index(self) -> int:
        """The head's layer index in the reference's model (``model.<i>``): 23 after backbone and neck, 10 after
        the classification backbone."""
        return 23 if self.has_neck else 10

    def check_kpt_shape(self, kpt_shape: Sequence[int] | None) -> tuple[int, int] | None:
        """Checks the given keypoint shape and returns the model's (K, D): None for a task without keypoints.

        A shape given to a task without keypoints is a ValueError.
        """
        if kpt_shape is not None:
            raise ValueError(
                f"kpt_shape is for pose models; a {self.words} model has none (got {kpt_shape!r})"
            )
        return None

    def build_head(
        self, num_classes: int, channels: Sequence[int], strides: Sequence[int], reg_max: int, scale: str,
        kpt_shape: tuple[int, int] | None = None,
    ) -> nn.Module:  # fmt: skip
        """Builds the head on the P3/P4/P5 maps of ``channels``; some heads' width follows ``scale``."""
        return detect_head(num_classes, channels, strides, reg_max, scale)

    def head_spec(self, kpt_shape: Sequence[int] | None = None) -> HeadSpec:
        """Returns what nn.yolo11.YOLO11 needs to build this task's network, checking kpt_shape."""
        checked = self.check_kpt_shape(kpt_shape)
        return HeadSpec(
            self.name, self.has_neck, partial(self.build_head, kpt_shape=checked), self.batch_norm
        )

    def matches_reference(self, state: Mapping[str, Any]) -> bool:
        """Tells whether a reference state dict, keys model.<i>..., is this task's: it has reference_key.

        ``model_files.reference`` asks the tasks in registry order; the first that says yes has it.
        """
        return self.reference_key is not None and self.reference_key in state

    def kpt_shape_from_state(self, state: Mapping[str, Tensor]) -> tuple[int, int] | None:
        """Returns the keypoint shape a state dict of ours implies when its file does not say; pose only."""
        return None

    # ------------------------------------------------------------------------------------ options
    # the options a model of the task is built with (``create_model``'s keywords), as model files name them
    option_keys: ClassVar[tuple[str, ...]] = ()

    def model_options(self, model: YOLO11) -> dict[str, Any]:
        """Returns the options a YOLO11 of this task was built with, under option_keys; none for most tasks.

        They are what a model file keeps and ``create_model`` takes back.
        """
        return {}

    def options_from(
        self, values: Mapping[str, Any], where: str, state: Mapping[str, Tensor] | None = None
    ) -> dict[str, Any]:
        """Reads and checks the options among a model file's ``values`` as create_model's keywords.

        The values are a weights payload, a checkpoint's hyper-parameters, the attributes of a reference
        model's modules or parsed ONNX metadata; a bad one is a ValueError naming ``where``. One the file
        lacks is the task's default, or with ``state`` (our keys) what its tensors imply.
        """
        return {}

    def build_loss(self, model: YOLO11, box: float, cls: float, dfl: float) -> nn.Module:
        """Builds the criterion of a YOLO11 of this task from its class count, strides and keypoint shape."""
        return DetectionLoss(model.num_classes, strides=model.strides, box=box, cls=cls, dfl=dfl)

    def loss(self, criterion: Any, outputs: Any, batch: dict[str, Any]) -> tuple[Tensor, Tensor]:
        """Returns (loss, items) of the train-mode ``outputs`` against the batch."""
        return criterion(outputs, batch["targets"])

    def reference_loss_factor(self, global_batch: int) -> int:
        """Returns what the reference multiplies the globally normalised loss by before backward.

        That is the global batch for the detection tasks; ``LoopRecipe.loss_scale`` turns it into gradients on
        any world size.
        """
        return global_batch

    def extra_channels(self, model: YOLO11) -> int:
        """Counts a YOLO11's prediction channels after the class scores, which NMS carries through.

        Segmentation has 32 mask coefficients, pose K·D keypoint values, detection none.
        """
        return 0
