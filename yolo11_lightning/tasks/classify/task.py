"""``ClassifyTask``: image classification (YOLO11-cls), what every layer asks of it (``tasks.base``).

Another network: the detection backbone's layers 0-8, then C2PSA at layer 9 (no SPPF, no neck; ``neck = False``)
and the ``Classify`` head at layer 10; one label per image, the mean cross-entropy (``loss.ClassificationLoss``;
``reference_loss_factor`` 1: the reference does not multiply it by the batch). The data is whole images
(``whole_image``: ``data.image_dataset.ImageDataset`` with ``augment.ClassifyTransform``, the reference's
classification pipeline; ImageFolder records from ``data.sources.imagefolder``; batches add ``labels`` (B,),
``batch.py``); evaluation is top-1 / top-5 accuracy (``metric.ClassificationAccuracy``, ``val/fitness`` their mean
for ``best.ckpt``); prediction writes the top 5 per image (``draw.py``); ONNX export has one (B, nc) output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from torch import Tensor, nn

from yolo11_lightning.metrics.class_results import ClassResults
from yolo11_lightning.tasks.base import Task
from yolo11_lightning.tasks.classify.augment import ClassifyAugment, ClassifyTransform
from yolo11_lightning.tasks.classify.batch import collate_classification
from yolo11_lightning.tasks.classify.draw import draw_top_classes
from yolo11_lightning.tasks.classify.head import Classify
from yolo11_lightning.tasks.classify.loss import ClassificationLoss
from yolo11_lightning.tasks.classify.metric import ClassificationAccuracy, classification_results, top_classes

__all__ = ["ClassifyTask"]


class ClassifyTask(Task):
    """Classification: backbone only, ``Classify`` head, ``ClassificationLoss``; (B, nc) probabilities."""

    name: ClassVar[str] = "classify"
    words: ClassVar[str] = "classification"
    title: ClassVar[str] = "image classification"
    noun: ClassVar[str] = "classifier"
    model_suffix: ClassVar[str] = "-cls"
    reference_class: ClassVar[str] = "ClassificationModel"
    reference_key: ClassVar[str | None] = "model.10.linear.weight"
    neck: ClassVar[bool] = False
    batch_norm: ClassVar[tuple[float, float]] = (
        1e-5,
        0.1,
    )  # PyTorch's defaults, as the reference's classifier
    class_branch: ClassVar[str] = "head.linear."
    class_key: ClassVar[str] = "head.linear.weight"
    loss_items: ClassVar[tuple[str, ...]] = ("cls",)
    whole_image: ClassVar[bool] = True
    label_noun: ClassVar[str] = "class labels"
    checkpoint_monitor: ClassVar[str] = "val/fitness"  # (top1 + top5) / 2, the reference's classify fitness
    monitor_meaning: ClassVar[str] = "(top-1 + top-5 accuracy) / 2, the reference's"
    reported_metrics: ClassVar[tuple[str, ...]] = ("top1", "top5")
    checked_metrics: ClassVar[tuple[str, ...]] = ("top1",)
    onnx_output_doc: ClassVar[str] = "(B, nc): class probabilities (softmax)"

    def build_head(
        self, num_classes: int, channels: Sequence[int], strides: Sequence[int], reg_max: int, scale: str,
        kpt_shape: tuple[int, int] | None = None,
    ) -> nn.Module:  # fmt: skip
        return Classify(channels[-1], num_classes)

    def build_loss(self, model: Any, box: float, cls: float, dfl: float) -> ClassificationLoss:
        """Cross-entropy; the box/cls/dfl gains are the detection tasks' and do not apply."""
        return ClassificationLoss()

    def loss(self, criterion: Any, outputs: Any, batch: dict[str, Any]) -> tuple[Tensor, Tensor]:
        """``criterion(logits, labels)``: the batch's ``labels`` (B,), one class per image."""
        if "labels" not in batch:
            raise ValueError(
                f"the classify task needs batches with `labels` (B,), but the batch has only {sorted(batch)}"
            )
        return criterion(outputs, batch["labels"])

    def reference_loss_factor(self, global_batch: int) -> int:
        """1: the reference trains its classifier on the mean cross-entropy, not multiplied by the batch."""
        return 1

    # ------------------------------------------------------------------------------------ data
    def image_transform(self, augment: bool, size: int, options: dict[str, Any]) -> ClassifyTransform:
        """The reference's classification pipeline (``augment.ClassifyTransform``); ``options``: ``aug`` (the data
        module's ``AugmentConfig``: ``scale``, flips, HSV gains), ``auto_augment``, ``erasing``."""
        if not augment:
            return ClassifyTransform(size)
        aug = options.get("aug")
        settings = {
            "auto_augment": options.get("auto_augment", "randaugment"),
            "erasing": options.get("erasing", 0.4),
        }
        if aug is not None:
            settings.update(
                scale_jitter=aug.scale, fliplr=aug.fliplr, flipud=aug.flipud, hsv_h=aug.hsv_h, hsv_s=aug.hsv_s,
                hsv_v=aug.hsv_v,
            )  # fmt: skip
        return ClassifyTransform(size, ClassifyAugment(**settings))

    def collate(self, samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        return collate_classification(samples)

    def check_split(self, records: Any, names: Sequence[str], evaluated: bool) -> str | None:
        """Every image needs exactly one label (what ImageFolder records have: a box dataset named for the classify
        task is refused, naming its first such image), and the classes must be two at least, two with images in
        training: a classifier of one class learns nothing and scores top-1 1.0 whatever it predicts."""
        arrays = records.arrays()
        counts = np.diff(arrays["label_ends"], prepend=0)
        wrong = np.flatnonzero(counts != 1)
        if len(wrong):
            return (
                f"{len(wrong)} of {len(counts)} images have {counts[wrong[0]]} labels, not one class (e.g. "
                f"{records.path(int(wrong[0]))}); classification reads an ImageFolder root: "
                "<root>/train/<class>/<images>"
            )
        if len(names) < 2:
            return (
                f"one class folder ({', '.join(names) or 'none'}): a classifier needs two classes at least (with one "
                "it learns nothing and scores top-1 1.0); add a folder of images per class"
            )
        present = np.unique(arrays["classes"])
        if not evaluated and len(present) < 2:
            return (
                f"only class `{names[int(present[0])]}` of {len(names)} has images: a classifier needs images of two "
                "classes at least (with one it learns nothing and scores top-1 1.0)"
            )
        return None

    # ------------------------------------------------------------------------------------ evaluation
    def make_metric(
        self, class_names: list[str] | None, reference_style: bool = False
    ) -> ClassificationAccuracy:
        return ClassificationAccuracy(class_names)

    def class_results(self, evaluation: Any, names: list[str]) -> ClassResults:
        """Images per class and the top-1 confusion matrix (``metric.classification_results``)."""
        return classification_results(evaluation, names)

    def evaluate(self, module: Any, batch: dict[str, Any], metric: Any) -> dict[str, Any]:
        """Class probabilities (B, nc) into ``metric``; returns them and, for the box-drawing callbacks, no
        detections (one empty (0, 6) tensor per image)."""
        probabilities = module.model(module.model_input(batch["images"]))
        metric.update(probabilities, batch["labels"], batch["indices"])
        empty = probabilities.new_zeros(0, 6)
        return {"probabilities": probabilities, "detections": [empty] * probabilities.shape[0]}

    def draw_evaluated(
        self, image: np.ndarray, outputs: dict[str, Any], index: int, keep: Tensor,
        names: Sequence[str] | None,
    ) -> np.ndarray:  # fmt: skip
        """The top-5 classes of image ``index`` and their probabilities, written on ``image``."""
        return draw_top_classes(image, outputs["probabilities"][index].detach().float().cpu(), names)

    def draw_targets(
        self, image: np.ndarray, batch: dict[str, Any], index: int, names: Sequence[str] | None
    ) -> np.ndarray:
        """The label of training image ``index``, written on ``image``."""
        label = int(batch["labels"][index])
        return draw_top_classes(image, None, names, label=label)

    # ------------------------------------------------------------------------------------ prediction
    def predict(self, module: Any, batch: dict[str, Any]) -> list[dict[str, Any]]:
        """Per image ``{"probabilities": (nc,) float32, "names": the model's class names or None}``."""
        probabilities = module.model(module.model_input(batch["images"])).float()
        names = getattr(module.model, "names", None)
        return [{"probabilities": p, "names": names} for p in probabilities]

    def split_result(self, result: Any) -> tuple[Tensor, dict[str, Any]]:
        """No detections; the image's answer in the extras (``draw``, ``image_fields``)."""
        return result["probabilities"].new_zeros(0, 6), result

    def draw(self, image: np.ndarray, classes: np.ndarray, extras: dict[str, Any]) -> np.ndarray:
        """The top-5 classes and their probabilities, written at the top left."""
        return draw_top_classes(image, extras["probabilities"].detach().float().cpu(), extras.get("names"))

    def image_fields(self, extras: dict[str, Any]) -> dict[str, Any]:
        """``top5``: the 5 most probable classes, in order, each ``{category_id, category_name, score}``."""
        probabilities = extras["probabilities"].detach().float().cpu()
        names = extras.get("names")
        rows = []
        for c in top_classes(probabilities[None])[0].tolist():
            row = {"category_id": c, "score": round(float(probabilities[c]), 5)}
            if names is not None and c < len(names):
                row["category_name"] = names[c]
            rows.append(row)
        return {"top5": rows}

    # ------------------------------------------------------------------------------------ export
    def onnx_output_axes(self, dynamic: bool) -> list[dict[int, str]]:
        return [{0: "batch"}]

    def onnx_output_dims(self, model: Any, size: tuple[int, int], dynamic: bool) -> list[dict[int, int]]:
        return [{1: model.num_classes}]

    def onnx_num_classes(self, shape: Sequence[Any], extra: int) -> int | None:
        if len(shape) != 2:
            raise ValueError(f"output {list(shape)} is not a classifier's (B, nc) probabilities")
        return shape[1] if isinstance(shape[1], int) else None
