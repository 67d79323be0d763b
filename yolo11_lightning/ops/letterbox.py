"""The letterbox inverse: boxes in the letterboxed network input -> original image pixels.

A letterboxed image is the original resized by ``scale`` (one factor, or one per axis) and padded by
``pad = (left, top)`` pixels (``data.augment.transforms.letterbox``); the batch carries both per image
(``structures.batch.ImageBatch``), so a box maps back as ``(xy - pad) / scale``, clipped to the original size.
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["detections_to_original", "letterbox_to_original"]


def letterbox_to_original(
    boxes_xyxy: Tensor, scale: Tensor | float, pad: Tensor, orig_size: Tensor
) -> Tensor:
    """Map xyxy boxes from the letterboxed input back to original image pixels.

    Args:
        boxes_xyxy: (n, 4) boxes in letterboxed-input pixels.
        scale: resize gain that was applied to the original image: one for both axes, or (2,) (x, y).
        pad: (2,) left and top padding in input pixels.
        orig_size: (2,) original (height, width), used to clip.
    """
    if isinstance(scale, Tensor) and scale.numel() == 2:
        scale = scale.reshape(2).repeat(2)
    out = (boxes_xyxy - pad.repeat(2)) / scale
    height, width = orig_size[0], orig_size[1]
    out[:, 0::2] = out[:, 0::2].clamp(0, width)
    out[:, 1::2] = out[:, 1::2].clamp(0, height)
    return out


def detections_to_original(
    detections: list[Tensor], scales: Tensor, pads: Tensor, orig_sizes: Tensor
) -> list[Tensor]:
    """Maps each image's detections from letterboxed-input pixels to original image pixels.

    Detections are (n, 6) rows [x1, y1, x2, y2, score, class]; ``scales`` is (B,) or (B, 2) per axis,
    ``pads`` (B, 2) and ``orig_sizes`` (B, 2), as in the batch.
    """
    out = []
    for i, det in enumerate(detections):
        det = det.clone()
        det[:, :4] = letterbox_to_original(det[:, :4], scales[i], pads[i], orig_sizes[i])
        out.append(det)
    return out
