"""The task contract: what every layer asks of a YOLO11 task, with detection's answers as the defaults.

A task (``tasks/detect.py``, ``tasks/segment/``) is one ``Task`` subclass and its own files, registered by one line
in ``tasks/__init__.py``. Every layer reads it through ``get_task(name)``:

* the network (``nn.yolo11.YOLO11``): ``neck`` (which layers it has: backbone and neck, the head after layers
  16/19/22, or the backbone alone, the head after layer 9), ``check_kpt_shape`` (the task's keypoint shape, pose
  only), ``build_head``; the head returns the train-mode outputs (``outputs``) and the eval-mode ones
  (``decode_outputs``);
* model files (``model_files``): ``words`` for messages, ``reference_class`` / ``reference_key`` /
  ``matches_reference`` to recognise the reference's files of the task, ``head_index`` (the head's ``model.<i>``),
  ``class_branch`` / ``class_key`` (the tensors whose shapes follow the class count), ``kpt_shape_from_state``;
* predictions: ``extra_channels`` (what follows the class scores, carried through NMS);
* the loss: ``build_loss``, ``loss`` (one batch's ``(loss, items)``), ``loss_items`` (logged
  ``train/<name>_loss``), ``reference_loss_factor`` (what the reference multiplies the loss by: the batch, or 1 for
  classification's mean);
* what is not there yet: ``not_yet`` (a task whose data, metrics, prediction or export are still to come is
  refused by ``tasks.choice`` with that sentence);
* the data: ``label_fields`` (instance fields the records carry and augmentation moves, ``structures``),
  ``sample_targets`` (what a sample adds to its labels, e.g. masks), ``collate``, ``check_records``,
  ``check_split`` (a split the task cannot use, refused on every rank alike), ``outline_labels`` (the rows'
  outlines are the labels: degenerate ones dropped), ``label_problems`` (``check-data --task``), ``label_noun``
  (what ``check-data`` calls the labels it counts);
  ``whole_image`` / ``image_transform`` (one label per image: whole-image samples instead of the box pipeline);
* evaluation: ``make_metric``, ``evaluate`` (forward, post-processing and metric update of a batch),
  ``class_results`` (the per-class results of an evaluation the metric kept),
  ``checkpoint_monitor`` (what ``best.ckpt`` follows), ``reported_metrics`` / ``checked_metrics``
  (``export --check-data``);
* prediction: ``predict`` (one batch, original pixels), ``draw_prediction`` / ``draw`` and ``result_fields`` (what
  the annotated copies show and the json rows hold; ``image_fields``: a row per image), ``draw_evaluated`` and
  ``draw_ground_truth`` (the validation images), ``draw_targets`` (the training batches of the result pictures);
* export: ``onnx_outputs``, ``onnx_output_doc``, ``onnx_output_dims``, ``onnx_metadata``, ``onnx_extra_channels``
  and ``onnx_num_classes`` (reading an ONNX file back).

Tasks reach the module (``training.module.YOLO11Module``) through its public methods only: ``model``,
``hparams``, ``model_input`` and ``detect``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from yolo11_lightning.data.task_samples import TaskSamples
from yolo11_lightning.loss.detection import DetectionLoss
from yolo11_lightning.nn.blocks import BN_EPS, BN_MOMENTUM
from yolo11_lightning.nn.head import Detect
from yolo11_lightning.nn.yolo11 import HeadSpec
from yolo11_lightning.ops.letterbox import detections_to_original
from yolo11_lightning.ops.postprocess import non_max_suppression
from yolo11_lightning.plots.drawing import draw_boxes
from yolo11_lightning.structures.batch import collate_detection

if TYPE_CHECKING:
    from yolo11_lightning.metrics.class_results import ClassResults
    from yolo11_lightning.metrics.detection import DetectionMAP

__all__ = ["Task"]

OUTPUT_DOC = "(B, 4 + nc, A): cx, cy, w, h in input pixels, then class scores; no NMS"


class Task(TaskSamples):
    """A YOLO11 task as every layer sees it (module docstring); detection's behaviour is the default."""

    name: ClassVar[str]
    words: ClassVar[str]  # "a <words> model": detection, segmentation
    title: ClassVar[str]  # what ``yolo11-lightning info`` calls its models: detection, instance segmentation
    noun: ClassVar[str]  # what one model is: detector, instance segmenter
    model_suffix: ClassVar[str]  # the reference's file names: yolo11n<suffix>.pt
    reference_class: ClassVar[str]  # the reference's model class of the task
    reference_key: ClassVar[str | None] = None  # a state-dict key only this task's reference files have
    # backbone and neck (head at reference layer 23); False: backbone only (layer 10)
    neck: ClassVar[bool] = True
    # (eps, momentum) of every BatchNorm: the reference's detection models set (1e-3, 0.03); its classifier keeps
    # PyTorch's defaults (its ClassificationModel never calls the reference's initialize_weights)
    batch_norm: ClassVar[tuple[float, float]] = (BN_EPS, BN_MOMENTUM)
    class_branch: ClassVar[str] = "head.cv3."  # our keys of the head's class branch (widths follow nc)
    class_key: ClassVar[str] = "head.cv3.0.2.weight"  # our key of a tensor whose first dimension is nc
    not_yet: ClassVar[str] = ""  # what the package cannot do for the task yet; non-empty: runs are refused
    loss_items: ClassVar[tuple[str, ...]] = ("box", "cls", "dfl")
    checkpoint_monitor: ClassVar[str] = "val/mAP50-95"  # what ``best.ckpt`` follows (``BestCheckpoint``)
    monitor_meaning: ClassVar[str] = (
        "COCO box mAP at IoU 0.50:0.95"  # the closing summary prints it beside it
    )
    validation_conf: ClassVar[float] = (
        0.001  # the module's default score threshold in validation (the reference's)
    )
    reported_metrics: ClassVar[tuple[str, ...]] = ("mAP50-95", "mAP50")  # ``export --check-data`` prints
    checked_metrics: ClassVar[tuple[str, ...]] = ("mAP50-95",)  # ... and holds to the allowed difference
    # one label per image: the DataModule's samples are ``image_transform``'s, not the box pipeline's
    whole_image: ClassVar[bool] = False
    # what ``check-data`` calls the labels it counts: "180 boxes", "boxes per class"
    label_noun: ClassVar[str] = "boxes"
    # the rows' outlines are the labels (oriented boxes): a row of a degenerate outline is dropped when the split is
    # read instead of kept as the box around it (``data.sources.config.DatasetConfig.outline_labels``)
    outline_labels: ClassVar[bool] = False
    onnx_outputs: ClassVar[tuple[str, ...]] = ("output0",)
    onnx_output_doc: ClassVar[str] = OUTPUT_DOC
    # The export check's tolerance (``export.onnx.onnx_tolerance``) times this: a task whose decode amplifies
    # float32 rounding more than the box decode's does allows more.
    onnx_tolerance_gain: ClassVar[float] = 1.0

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    # ------------------------------------------------------------------------------------ network
    @property
    def head_index(self) -> int:
        """The head's layer index in the reference's model (``model.<i>``): 23 after backbone and neck, 10 after
        the classification backbone."""
        return 23 if self.neck else 10

    def check_kpt_shape(self, kpt_shape: Sequence[int] | None) -> tuple[int, int] | None:
        """The model's keypoint shape (K, D) from what was given: None for a task without keypoints (a given one
        is a ValueError)."""
        if kpt_shape is not None:
            raise ValueError(
                f"kpt_shape is for pose models; a {self.words} model has none (got {kpt_shape!r})"
            )
        return None

    def build_head(
        self, num_classes: int, channels: Sequence[int], strides: Sequence[int], reg_max: int, scale: str,
        kpt_shape: tuple[int, int] | None = None,
    ) -> nn.Module:  # fmt: skip
        """The head on the maps of ``channels`` (P3/P4/P5; ``scale`` for heads whose width follows it)."""
        return Detect(num_classes, channels, strides, reg_max)

    def head_spec(self, kpt_shape: Sequence[int] | None = None) -> HeadSpec:
        """What ``nn.yolo11.YOLO11`` needs to build this task's network (``kpt_shape`` checked here)."""
        checked = self.check_kpt_shape(kpt_shape)
        return HeadSpec(self.name, self.neck, partial(self.build_head, kpt_shape=checked), self.batch_norm)

    # ------------------------------------------------------------------------------------ model files
    def matches_reference(self, state: Mapping[str, Any]) -> bool:
        """Whether a reference state dict (keys ``model.<i>...``) is this task's: it has ``reference_key``.
        ``model_files.reference`` asks the tasks in registry order; the first that says yes has it."""
        return self.reference_key is not None and self.reference_key in state

    def kpt_shape_from_state(self, state: Mapping[str, Tensor]) -> tuple[int, int] | None:
        """The keypoint shape a state dict of ours implies when its file does not say (pose only)."""
        return None

    # ------------------------------------------------------------------------------------ options
    # the options a model of the task is built with (``create_model``'s keywords), as model files name them
    option_keys: ClassVar[tuple[str, ...]] = ()

    def model_options(self, model: Any) -> dict[str, Any]:
        """The options ``model`` (a ``YOLO11`` of this task) was built with, under ``option_keys``: what a model
        file keeps and ``create_model`` takes back (none for most tasks)."""
        return {}

    def options_from(
        self, values: Mapping[str, Any], where: str, state: Mapping[str, Tensor] | None = None
    ) -> dict[str, Any]:
        """The options among a model file's ``values`` (a weights payload, a checkpoint's hyper-parameters, the
        attributes of a reference model's modules, parsed ONNX metadata), checked (ValueError naming ``where``), as
        ``create_model``'s keywords. One the file lacks is the task's default, or with ``state`` (our keys) what
        its tensors imply."""
        return {}

    # ------------------------------------------------------------------------------------ loss
    def build_loss(self, model: Any, box: float, cls: float, dfl: float) -> nn.Module:
        """The criterion of ``model`` (a ``YOLO11`` of this task: class count, strides, keypoint shape)."""
        return DetectionLoss(model.num_classes, strides=model.strides, box=box, cls=cls, dfl=dfl)

    def loss(self, criterion: Any, outputs: Any, batch: dict[str, Any]) -> tuple[Tensor, Tensor]:
        """``(loss, items)`` of the train-mode ``outputs`` against the batch."""
        return criterion(outputs, batch["targets"])

    def reference_loss_factor(self, global_batch: int) -> int:
        """What the reference multiplies the (globally normalised) loss by before backward: the global batch for
        the detection tasks (``ReferenceRecipe.loss_scale`` turns it into gradients on any world size)."""
        return global_batch

    # ------------------------------------------------------------------------------------ data
    def image_transform(self, augment: bool, size: int, options: dict[str, Any]) -> Any:
        """A ``whole_image`` task's sample pipeline (``data.image_dataset.ImageDataset``): an object with
        ``load_shape(h, w)``, ``fit(image)`` (what the loader keeps) and ``__call__(image, seed)`` (the sample,
        (size, size, 3) uint8); ``options``: the data module's augmentation settings."""
        raise NotImplementedError(f"the {self.name} task augments boxes, not whole images")

    def collate(self, samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        return collate_detection(samples)

    def check_records(self, records: Any, where: str) -> None:
        """Report what this task needs and a split's records lack (``where`` names the split); ``records``: a
        ``PackedRecords`` (read its arrays' counts, not record by record)."""

    def check_split(self, records: Any, names: Sequence[str], evaluated: bool) -> str | None:
        """Why the task cannot use a split's records, in words that follow ``<dataset>: split `<split>` (<its
        entries>): ``, or None; ``records``: a ``PackedRecords``, ``names``: the dataset's classes, ``evaluated``:
        validation or test (else training or prediction). Every rank asks with the same records, so every rank
        refuses alike.

        Detection's answer: an evaluated split without any label is refused (every mAP would be COCO's -1, "no
        data"). A training split without labels trains on background, as the reference's (its load says so)."""
        if evaluated and not len(records.arrays()["classes"]):
            return (
                f"no labels: none of its {len(records)} images has one, and without labels every mAP is -1 (COCO's "
                "'no data'); label the images, or point the split at labelled ones"
            )
        return None

    def label_problems(self, records: Sequence[Any]) -> list[str]:
        """``check-data``'s lines ``<file>:<line>: <reason>`` for label rows the split's parse kept but this task
        cannot use (``records``: the split's ``ImageRecord``s)."""
        return []

    # ------------------------------------------------------------------------------------ evaluation
    def make_metric(self, class_names: list[str] | None, reference_style: bool = False) -> DetectionMAP:
        from yolo11_lightning.metrics.detection import DetectionMAP

        return DetectionMAP(class_names, reference_style=reference_style)

    def extra_channels(self, model: Any) -> int:
        """Prediction channels of ``model`` (a ``YOLO11`` of this task) after the class scores, carried through
        NMS (segmentation: 32 mask coefficients; pose: K·D keypoint values); detection: none."""
        return 0

    def class_results(self, evaluation: Any, names: list[str]) -> ClassResults:
        """Per-class results of an evaluation the metric kept (``metric.evaluation``): the closing summary's table
        and the result pictures (``metrics.class_results``)."""
        from yolo11_lightning.metrics.class_results import class_results

        return class_results(evaluation, names)

    def nms(self, module: Any, predictions: Tensor) -> list[Tensor]:
        """(B, 4 + nc + extra, A) -> per image (n, 6 + extra) in input pixels, the module's thresholds
        (``extra = extra_channels(module.model)``)."""
        hp = module.hparams
        extra = self.extra_channels(module.model)
        kwargs = {"extra": extra} if extra else {}
        return non_max_suppression(
            predictions, conf_threshold=hp.conf_threshold, iou_threshold=hp.iou_threshold,
            max_detections=hp.max_detections, **kwargs,
        )  # fmt: skip

    def evaluate(self, module: Any, batch: dict[str, Any], metric: DetectionMAP) -> dict[str, Any]:
        """Detect, score into ``metric``; returns ``{"detections": [(n, 6)]}`` (what ValidationImages draws)."""
        detections = module.detect(batch["images"])
        metric.update(detections, batch)
        return {"detections": detections}

    def draw_evaluated(
        self, image: np.ndarray, outputs: dict[str, Any], index: int, keep: Tensor,
        names: Sequence[str] | None,
    ) -> np.ndarray:  # fmt: skip
        """Image ``index`` of an ``evaluate`` result drawn on ``image`` (detections where ``keep``)."""
        det = outputs["detections"][index].detach().float().cpu()[keep]
        return draw_boxes(image, det[:, :4].numpy(), det[:, 5].numpy(), det[:, 4].numpy(), names)

    def draw_targets(
        self, image: np.ndarray, batch: dict[str, Any], index: int, names: Sequence[str] | None
    ) -> np.ndarray:
        """The labels of image ``index`` of a training batch drawn on ``image`` ((H, W, 3) uint8 RGB, the
        batch's pixels): boxes in their class colours."""
        boxes, classes = _target_boxes(image, batch, index)
        return draw_boxes(image, boxes, classes, names=names)

    def draw_ground_truth(self, image: np.ndarray, batch: dict[str, Any], index: int) -> np.ndarray:
        """The labels of image ``index`` of an evaluation batch drawn in white on ``image`` ((H, W, 3) uint8 RGB,
        the batch's pixels), under the predictions of the validation images: boxes with their class ids."""
        boxes, classes = _target_boxes(image, batch, index)
        return draw_boxes(image, boxes, classes, color=(255, 255, 255))

    # ------------------------------------------------------------------------------------ prediction
    def predict(self, module: Any, batch: dict[str, Any]) -> list[Any]:
        """Per image an (n, 6) tensor ``[x1, y1, x2, y2, score, class]`` in original image pixels."""
        return detections_to_original(
            module.detect(batch["images"]), batch["scales"], batch["pads"], batch["orig_sizes"]
        )

    def split_result(self, result: Any) -> tuple[Tensor, dict[str, Any]]:
        """One image's ``predict`` result as ((n, 6) detections, per-detection extras as host arrays)."""
        return result, {}

    def result_fields(self, extras: dict[str, Any], k: int) -> dict[str, Any]:
        """The json fields of detection ``k`` beyond its box, score and class."""
        return {}

    def image_fields(self, extras: dict[str, Any]) -> dict[str, Any]:
        """The json row of the image as a whole (a classifier's top 5), from ``split_result``'s extras; empty (no
        row) for a task whose answers are its detections."""
        return {}

    def draw(self, image: np.ndarray, classes: np.ndarray, extras: dict[str, Any]) -> np.ndarray:
        """What an annotated copy shows under the boxes (``draw_prediction`` draws the boxes over it)."""
        return image

    def draw_prediction(
        self, image: np.ndarray, detections: np.ndarray, extras: dict[str, Any], names: Sequence[str] | None,
        thickness: int,
    ) -> np.ndarray:  # fmt: skip
        """The annotated copy of one predicted image: ``draw``'s picture under the (n, 6) ``detections``' boxes
        ``[x1, y1, x2, y2, score, class]``, labelled with their names and scores."""
        image = self.draw(image, detections[:, 5], extras)
        boxes, classes, scores = detections[:, :4], detections[:, 5], detections[:, 4]
        return draw_boxes(image, boxes, classes, scores, names, thickness=thickness)

    # ------------------------------------------------------------------------------------ export
    def onnx_output_axes(self, dynamic: bool) -> list[dict[int, str]]:
        """Per ONNX output (``onnx_outputs`` order), its free axes by name: the batch, and the anchors when the
        image height and width are free (``dynamic``)."""
        return [{0: "batch", 2: "anchors"} if dynamic else {0: "batch"}]

    def onnx_output_dims(self, model: Any, size: tuple[int, int], dynamic: bool) -> list[dict[int, int]]:
        """Per ONNX output, the axes whose length is known (shape inference leaves them symbolic)."""
        known = {1: 4 + model.num_classes + self.extra_channels(model)}
        if not dynamic:
            known[2] = sum((size[0] // s) * (size[1] // s) for s in model.strides)
        return [known]

    def onnx_output_order(self, shapes: Sequence[Sequence[Any]]) -> list[int]:
        """Where each of ``onnx_outputs`` is among an ONNX file's outputs of ``shapes`` (the file's order)."""
        return list(range(len(shapes)))

    def onnx_num_classes(self, shape: Sequence[Any], extra: int) -> int | None:
        """The class count an ONNX file's first output of ``shape`` implies (None: its axis is symbolic); raises
        ValueError when the shape is not this task's (B, 4 + nc + extra, A)."""
        if len(shape) != 3:
            raise ValueError(
                f"output {list(shape)} is not (B, 4 + nc, A); an export with NMS inside the graph (end-to-end) "
                "is not supported"
            )
        return shape[1] - 4 - extra if isinstance(shape[1], int) else None

    def onnx_metadata(self, model: Any) -> dict[str, str]:
        """What an ONNX file of ``model`` says beyond every task's metadata (pose: ``kpt_shape``)."""
        return {}

    def onnx_extra_channels(
        self, shapes: Sequence[Sequence[Any]], kpt_shape: Sequence[int] | None = None
    ) -> int:
        """The prediction channels after the class scores in an ONNX file whose outputs have ``shapes``
        (in ``onnx_outputs`` order) and whose metadata says ``kpt_shape`` (or not: None); raises ValueError when
        they are not this task's."""
        return 0


def _target_boxes(image: np.ndarray, batch: dict[str, Any], index: int) -> tuple[np.ndarray, np.ndarray]:
    """Image ``index``'s rows of the batch's ``targets`` as ((n, 4) xyxy boxes in ``image``'s pixels, (n,)
    classes)."""
    targets = batch["targets"].detach().float().cpu()
    rows = targets[targets[:, 0] == index]
    height, width = image.shape[:2]
    scale = rows.new_tensor([width, height])
    centre, size = rows[:, 2:4] * scale, rows[:, 4:6] * scale
    return torch.cat((centre - size / 2, centre + size / 2), 1).numpy(), rows[:, 1].numpy()
