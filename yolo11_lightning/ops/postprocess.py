"""Turns the detector's decoded output into per-image detections with NMS.

``ops.letterbox`` maps them to original pixels.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchvision.ops import box_convert, nms

from yolo11_lightning.ops.letterbox import letterbox_to_original

__all__ = [
    "letterbox_to_original",  # the letterbox inverse lives in ops.letterbox
    "nms_candidates",
    "non_max_suppression",
]


def nms_candidates(
    scores: Tensor,
    conf_threshold: float,
    multi_label: bool,
    max_candidates: int,
    class_agnostic: bool,
    class_offset: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Picks one image's NMS candidates from its (A, nc) class scores as the reference's NMS does.

    Axis-aligned and rotated boxes alike.

    The (anchor, class) pairs scoring above ``conf_threshold`` (every class of an anchor with ``multi_label`` and
    nc > 1, else its best class), in that order, at most ``max_candidates`` of the highest scores.

    Returns (anchor index (n,) long, score (n,) in the scores' dtype, class (n,) long, shift (n, 1) float32: ``class
    · class_offset`` pixels, 0 with ``class_agnostic``, added to the box positions so that one NMS pass over all
    candidates suppresses within a class only).
    """
    if multi_label and scores.shape[1] > 1:
        anchor_idx, classes = (scores > conf_threshold).nonzero(as_tuple=True)
        scores = scores[anchor_idx, classes]
    else:
        scores, classes = scores.max(1)
        anchor_idx = (scores > conf_threshold).nonzero(as_tuple=True)[0]
        scores, classes = scores[anchor_idx], classes[anchor_idx]
    if scores.numel() > max_candidates:
        top = scores.argsort(descending=True)[:max_candidates]
        anchor_idx, scores, classes = anchor_idx[top], scores[top], classes[top]
    shift = classes[:, None].float() * (0.0 if class_agnostic else class_offset)
    return anchor_idx, scores, classes, shift


def non_max_suppression(
    predictions: Tensor,
    conf_threshold: float = 0.001,
    iou_threshold: float = 0.7,
    max_detections: int = 300,
    multi_label: bool = True,
    class_agnostic: bool = False,
    max_candidates: int = 30000,
    extra: int = 0,
    class_offset: float = 7680.0,
) -> list[Tensor]:
    """Score filter + class-aware NMS, image by image, step for step the reference validator's.

    Per image: candidates are (box, class) pairs scoring above ``conf_threshold`` (every class of a box
    with ``multi_label``, else its best class), at most ``max_candidates`` of the highest scores; boxes are
    shifted by ``class * class_offset`` pixels so that one NMS over all of them only suppresses within a class
    (``nms_candidates``); the ``max_detections`` best survivors are kept. Deliberate differences: the NMS runs in float32 even on a half-precision model (the reference
    runs it in the model's dtype, where an offset of 7680 px leaves a few pixels of resolution), and there
    is no wall-clock limit (the reference stops NMS after 2 s + 50 ms per image, which would make results
    depend on the machine's speed).

    Args:
        predictions: (B, 4 + nc, A) eval output of ``YOLO11``: xywh boxes in input pixels, then class scores.
        conf_threshold: minimum class score kept.
        iou_threshold: boxes of the same class overlapping more than this are suppressed.
        max_detections: detections kept per image, best first.
        multi_label: one box may yield a detection for every class above ``conf_threshold``
            (as the reference validator); otherwise only its best class.
        class_agnostic: suppress across classes too.
        max_candidates: cap on boxes entering NMS, highest scores first (bounds the NMS cost).
        extra: trailing channels after the class scores carried along per kept box, not scored (32 for the
            segmenter's mask coefficients: predictions (B, 4 + nc + 32, A)).
        class_offset: shift in pixels between classes, the reference's 7680 (boxes must be smaller). Its value
            sets the float rounding of the IoUs, so a box at the IoU threshold is kept or dropped as there;
            torchvision's ``batched_nms`` (offset = largest coordinate + 1) rounds differently.

    Returns:
        One (n, 6 + extra) tensor per image: ``[x1, y1, x2, y2, score, class, *extra]`` in input pixels,
        score-sorted.
    """
    if extra < 0 or predictions.shape[1] - 4 - extra < 1:
        raise ValueError(
            f"predictions with {predictions.shape[1]} channels cannot hold 4 box values, >= 1 class score and "
            f"{extra} extra channels"
        )
    num_classes = predictions.shape[1] - 4 - extra
    preds = predictions.transpose(1, 2)  # (B, A, 4 + nc + extra)
    outputs = []
    for image_preds in preds:
        anchor_idx, scores, classes, shift = nms_candidates(
            image_preds[:, 4 : 4 + num_classes], conf_threshold, multi_label, max_candidates, class_agnostic,
            class_offset,
        )  # fmt: skip
        boxes = box_convert(image_preds[anchor_idx, :4], "cxcywh", "xyxy").float()
        scores = scores.float()
        keep = nms(boxes + shift, scores, iou_threshold)[:max_detections]
        kept = [boxes[keep], scores[keep, None], classes[keep, None].float()]
        if extra:
            kept.append(image_preds[anchor_idx[keep], 4 + num_classes :].float())
        outputs.append(torch.cat(kept, 1))
    return outputs
