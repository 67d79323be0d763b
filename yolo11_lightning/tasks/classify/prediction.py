"""Classification's prediction and drawing hooks for tasks.base.prediction: results, json fields, pictures."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from torch import Tensor

from yolo11_lightning.tasks.base.prediction import TaskPrediction
from yolo11_lightning.tasks.classify.draw import draw_top_classes
from yolo11_lightning.tasks.classify.metric import top_classes

__all__ = ["ClassifyPrediction"]


class ClassifyPrediction(TaskPrediction):
    """Classification's prediction and drawing hooks, listed in the module docstring."""

    def draw_evaluated(
        self, image: np.ndarray, outputs: dict[str, Any], index: int, keep: Tensor,
        names: Sequence[str] | None,
    ) -> np.ndarray:  # fmt: skip
        """Writes the top-5 classes of image ``index`` and their probabilities on ``image``."""
        return draw_top_classes(image, outputs["probabilities"][index].detach().float().cpu(), names)

    def draw_targets(
        self, image: np.ndarray, batch: dict[str, Any], index: int, names: Sequence[str] | None
    ) -> np.ndarray:
        """Writes the label of training image ``index`` on ``image``."""
        label = int(batch["labels"][index])
        return draw_top_classes(image, None, names, label=label)

    def predict(self, module: Any, batch: dict[str, Any]) -> list[dict[str, Any]]:
        """Predicts per image {"probabilities": (nc,) float32, "names": the model's class names or None}."""
        probabilities = module.model(module.model_input(batch["images"])).float()
        names = getattr(module.model, "names", None)
        return [{"probabilities": p, "names": names} for p in probabilities]

    def split_result(self, result: Any) -> tuple[Tensor, dict[str, Any]]:
        """Returns no detections and the image's answer in the extras, for draw and image_fields."""
        return result["probabilities"].new_zeros(0, 6), result

    def draw_under_boxes(self, image: np.ndarray, classes: np.ndarray, extras: dict[str, Any]) -> np.ndarray:
        """Writes the top-5 classes and their probabilities at the top left."""
        return draw_top_classes(image, extras["probabilities"].detach().float().cpu(), extras.get("names"))

    def image_fields(self, extras: dict[str, Any]) -> dict[str, Any]:
        """Returns top5: the 5 most probable classes in order, each {category_id, category_name, score}."""
        probabilities = extras["probabilities"].detach().float().cpu()
        names = extras.get("names")
        rows = []
        for c in top_classes(probabilities[None])[0].tolist():
            row = {"category_id": c, "score": round(float(probabilities[c]), 5)}
            if names is not None and c < len(names):
                row["category_name"] = names[c]
            rows.append(row)
        return {"top5": rows}
