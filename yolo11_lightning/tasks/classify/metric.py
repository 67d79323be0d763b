"""Top-1 / top-5 accuracy of a classifier, gathered over ranks by dataset index (``ClassificationAccuracy``).

The reference's ``ClassificationValidator``: per image the ``min(5, nc)`` classes of highest probability
(``argsort`` descending, as the reference's, so ties fall alike), top-1 the share whose first class is the label,
top-5 the share with the label among them, fitness their mean (what ``best.ckpt`` follows, ``val/fitness``).
``loss``: the mean cross-entropy over the images (the reference logs the mean of its batches' means; equal when
the batches are equal in size), from the probabilities (clamped at the smallest float32, so a probability that
underflows to 0 costs 103.3 instead of inf).

States are flat ``cat`` tensors keyed by dataset index: unpadded shards of different lengths gather whole, and the
values on any number of ranks equal the single-process ones.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor
from torchmetrics import Metric

from yolo11_lightning.metrics.class_results import ClassResults

__all__ = ["ClassificationAccuracy", "classification_results", "top_classes"]

TOP_K = 5
TINY = torch.finfo(torch.float32).tiny


def top_classes(probabilities: Tensor, k: int = TOP_K) -> Tensor:
    """Returns the (B, min(k, nc)) int64 top classes of (B, nc) probabilities, by the reference's argsort."""
    return probabilities.argsort(1, descending=True)[:, : min(k, probabilities.shape[1])]


class ClassificationAccuracy(Metric):
    """``update(probabilities (B, nc), labels (B,), indices (B,))``; ``compute()`` -> ``{top1, top5, fitness,
    loss}`` (fractions in [0, 1], loss in nats), the same on every rank."""

    full_state_update = False

    def __init__(self, class_names: list[str] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.class_names = class_names
        # With ``keep_evaluation`` (the result pictures and the closing summary set it on rank 0) each compute keeps
        # ``evaluation``: (labels (n,), top-1 classes (n,), top-5 hits (n,)) on the host, in dataset order.
        self.keep_evaluation = False
        self.evaluation: tuple[Tensor, Tensor, Tensor] | None = None
        self.add_state("indices", default=[], dist_reduce_fx="cat")
        self.add_state("labels", default=[], dist_reduce_fx="cat")
        self.add_state("top", default=[], dist_reduce_fx="cat")
        self.add_state("losses", default=[], dist_reduce_fx="cat")

    def update(self, probabilities: Tensor, labels: Tensor, indices: Tensor) -> None:
        probabilities = probabilities.detach().float()
        labels = labels.to(probabilities.device).long()
        top = top_classes(probabilities)
        if top.shape[1] < TOP_K:  # fewer than 5 classes: pad with the first class (changes no count)
            top = torch.cat((top, top[:, :1].expand(-1, TOP_K - top.shape[1])), 1)
        picked = probabilities.gather(1, labels[:, None])[:, 0]
        self.indices.append(indices.to(probabilities.device).long())
        self.labels.append(labels)
        self.top.append(top)
        self.losses.append(-picked.clamp(min=TINY).log())

    def compute(self) -> dict[str, Tensor]:
        def flat(state: Any, *shape: int) -> Tensor:
            if isinstance(state, list):
                return torch.cat(state) if state else torch.zeros(0, *shape, device=self.device)
            return state

        labels, top, losses = flat(self.labels), flat(self.top, TOP_K), flat(self.losses)
        if len(labels) == 0:
            zero = torch.zeros((), device=self.device)
            return {"top1": zero, "top5": zero, "fitness": zero, "loss": zero}
        order = flat(self.indices).argsort()  # the images in dataset order: the same sums on any world size
        labels, top, losses = labels[order], top[order], losses[order]
        correct = top == labels[:, None]
        if self.keep_evaluation:
            self.evaluation = (labels.cpu(), top[:, 0].cpu(), correct.any(1).cpu())
        top1 = correct[:, 0].double().mean()
        top5 = correct.any(1).double().mean()
        return {
            "top1": top1.float(),
            "top5": top5.float(),
            "fitness": ((top1 + top5) / 2).float(),
            "loss": losses.double().mean().float(),
        }


def classification_results(evaluation: tuple[Tensor, Tensor, Tensor], names: list[str]) -> ClassResults:
    """Returns what the closing summary and the result pictures show of a kept evaluation.

    That is images per class, top-1 and top-5 accuracy per class and overall, and the confusion matrix
    ``[predicted, true]`` of the top-1 classes (the reference's classification confusion matrix; the
    background row and column, a detector's, stay empty); no per-kind curves.
    """
    labels, predicted, top5 = (t.numpy() for t in evaluation)
    labels, predicted = labels.astype(np.int64), predicted.astype(np.int64)
    k = len(names)
    confusion = np.zeros((k + 1, k + 1), np.int64)
    np.add.at(confusion, (predicted, labels), 1)
    counts = np.bincount(labels, minlength=k)[:k]
    accuracy = {}
    for name, hits in (("top1", predicted == labels), ("top5", top5.astype(bool))):
        per_class = np.bincount(labels, weights=hits, minlength=k)[:k]
        with np.errstate(invalid="ignore", divide="ignore"):
            accuracy[name] = (float(hits.mean()) if len(hits) else float("nan"), per_class / counts)
    return ClassResults(
        names=list(names), images=counts, instances=counts.copy(), num_images=len(labels), kinds={},
        confusion=confusion, accuracy=accuracy,
    )  # fmt: skip
