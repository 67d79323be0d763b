"""Rotated NMS: the reference's post-processing of oriented boxes (probiou, class offset, fast NMS).

Per image, as ``ops.postprocess.non_max_suppression`` for axis-aligned boxes, the candidates of
``ops.postprocess.nms_candidates``: above the score threshold (every class of a box with ``multi_label``), at most
``max_candidates`` of the best, centres shifted by ``class · class_offset`` pixels so that one pass suppresses within
a class only. The pass is the reference's *fast*
NMS: boxes sorted by score, a box is dropped when its probiou with any better-scoring box (dropped or not) reaches
the threshold; the ``max_detections`` best survivors are kept. It runs in float32.
"""

from __future__ import annotations

import torch
from torch import Tensor

from yolo11_lightning.ops.postprocess import nms_candidates
from yolo11_lightning.tasks.obb.rotated import probiou

__all__ = ["pairwise_probiou", "rotated_nms"]


def pairwise_probiou(boxes1: Tensor, boxes2: Tensor) -> Tensor:
    """Returns the (n, m) probiou of (n, 5) and (m, 5) xywhr boxes."""
    return probiou(boxes1[:, None, :], boxes2[None, :, :])


def rotated_nms(
    predictions: Tensor,
    conf_threshold: float = 0.001,
    iou_threshold: float = 0.7,
    max_detections: int = 300,
    multi_label: bool = True,
    class_agnostic: bool = False,
    max_candidates: int = 30000,
    class_offset: float = 7680.0,
) -> list[Tensor]:
    """Runs rotated NMS on the (B, 4 + nc + 1, A) OBB eval output; see the module docstring.

    The output holds xywh in input pixels, class scores and the angle. Returns per image (n, 7) ``[cx, cy, w,
    h, score, class, r]`` in input pixels, sorted by score.
    """
    num_classes = predictions.shape[1] - 5
    if num_classes < 1:
        raise ValueError(f"OBB predictions need 4 + nc + 1 channels with nc >= 1, got {predictions.shape[1]}")
    outputs = []
    for image_preds in predictions.transpose(1, 2).float():
        anchor_idx, scores, classes, shift = nms_candidates(
            image_preds[:, 4 : 4 + num_classes], conf_threshold, multi_label, max_candidates, class_agnostic,
            class_offset,
        )  # fmt: skip
        order = scores.argsort(descending=True, stable=True)
        anchor_idx, scores, classes, shift = anchor_idx[order], scores[order], classes[order], shift[order]
        boxes = torch.cat((image_preds[anchor_idx, :4], image_preds[anchor_idx, -1:]), 1)
        shifted = boxes.clone()
        shifted[:, :2] += shift
        overlaps = pairwise_probiou(shifted, shifted).triu_(diagonal=1)
        keep = ((overlaps >= iou_threshold).sum(0) == 0).nonzero(as_tuple=True)[0][:max_detections]
        outputs.append(
            torch.cat((boxes[keep, :4], scores[keep, None], classes[keep, None].float(), boxes[keep, 4:]), 1)
        )
    return outputs
