"""Instance masks from the segmenter's output, after NMS: the reference's mask post-processing.

The segment head gives every anchor 32 mask coefficients (after NMS: the trailing columns of
``non_max_suppression(..., extra=32)``) and every image 32 prototypes at 1/4 of the input, ``protos``
(32, H/4, W/4). A detection's mask logits are ``coefficients @ protos``; its mask is where the logits are
> 0 (sigmoid > 0.5) inside its box. Like the reference, the threshold is applied to the logits after any
crop and bilinear resize (``align_corners=False``), so the resized quantity is the logit, not the sigmoid.

Three resolutions, as the reference computes them:

* ``masks_at_protos``: cropped at proto resolution (H/4, W/4). The reference validator's metric path: it
  scores these against ground-truth masks at the same 1/4 resolution.
* ``masks_at_input``: cropped at proto resolution, then bilinear to the letterboxed input (H, W). Its
  predictor's default; ``masks_to_original`` then takes them to the original image (how it draws them).
* ``masks_native``: logits resized to the target frame first (letterbox padding removed when the target has
  another aspect), then cropped by boxes given in that frame. Its predictor's ``retina_masks`` (boxes and
  masks in original pixels) and its COCO-json validation path (masks at the input size).

``image_target_masks`` unpacks one image's ground-truth masks of a ``SegmentationBatch`` (either encoding)
at the same 1/4 resolution, for scoring against ``masks_at_protos``. ``segment_image`` is the predict path
for one image (boxes and masks in original pixels);
``encode_rle`` writes a binary mask as COCO compressed RLE (``{"size": [h, w], "counts": str}``).
Imports torch and numpy only.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from yolo11_lightning.ops.letterbox import letterbox_to_original

__all__ = [
    "crop_masks",
    "encode_rle",
    "image_target_masks",
    "mask_logits",
    "masks_at_input",
    "masks_at_protos",
    "masks_native",
    "masks_to_original",
    "scale_masks",
    "segment_image",
]


def mask_logits(protos: Tensor, coefficients: Tensor) -> Tensor:
    """Combines (32, h, w) prototypes and (n, 32) coefficients into (n, h, w) float32 mask logits."""
    c, h, w = protos.shape
    if coefficients.ndim != 2 or coefficients.shape[1] != c:
        raise ValueError(
            f"mask coefficients must be (n, {c}) for {c} prototypes, got {tuple(coefficients.shape)}"
        )
    return (coefficients.float() @ protos.float().reshape(c, -1)).reshape(-1, h, w)


def crop_masks(masks: Tensor, boxes: Tensor) -> Tensor:
    """Zeroes (n, h, w) masks outside their (n, 4) xyxy boxes in mask pixels.

    Pixel (row r, column c) is kept when ``x1 <= c < x2`` and ``y1 <= r < y2`` (pixel indices against the
    box edges, no rounding: the reference's rule on the GPU and for 50 masks or more; on the CPU, for fewer
    masks, it rounds the edges first, which moves a cropped edge by at most one pixel).
    """
    h, w = masks.shape[-2:]
    x1, y1, x2, y2 = boxes.to(masks.device)[:, :, None, None].unbind(1)  # each (n, 1, 1)
    cols = torch.arange(w, device=masks.device, dtype=x1.dtype)[None, None, :]
    rows = torch.arange(h, device=masks.device, dtype=x1.dtype)[None, :, None]
    return masks * ((cols >= x1) & (cols < x2) & (rows >= y1) & (rows < y2))


def masks_at_protos(protos: Tensor, coefficients: Tensor, boxes: Tensor, input_size: Sequence[int]) -> Tensor:
    """Returns binary masks at proto resolution cropped to the boxes, as the reference's process_mask.

    Args:
        protos: (32, h, w) prototypes of one image (h = H/4, w = W/4).
        coefficients: (n, 32) mask coefficients of its kept detections.
        boxes: (n, 4) xyxy in letterboxed-input pixels.
        input_size: (H, W) of the network input.

    Returns:
        (n, h, w) bool.
    """
    logits = mask_logits(protos, coefficients)
    return _crop_at_protos(logits, boxes, input_size).gt(0)


def masks_at_input(protos: Tensor, coefficients: Tensor, boxes: Tensor, input_size: Sequence[int]) -> Tensor:
    """Returns (n, H, W) bool masks at the input size: cropped at proto resolution, then resized bilinearly.

    The reference predictor's default, ``process_mask(..., upsample=True)``. Arguments as ``masks_at_protos``.
    """
    logits = _crop_at_protos(mask_logits(protos, coefficients), boxes, input_size)
    return _resize(logits, (int(input_size[0]), int(input_size[1]))).gt(0)


def masks_native(protos: Tensor, coefficients: Tensor, boxes: Tensor, shape: Sequence[int]) -> Tensor:
    """Returns (n, h0, w0) bool masks in the frame ``shape``, as the reference's process_mask_native.

    The logits are resized there (``scale_masks``, letterbox padding inferred from the aspect ratios), then
    cropped by ``boxes`` (n, 4) xyxy in that frame. ``shape`` (h0, w0) is the input size (boxes in input
    pixels) or the original image size (boxes in original pixels: the retina-masks path).
    """
    logits = scale_masks(mask_logits(protos, coefficients), shape)
    return crop_masks(logits, boxes).gt(0)


def _crop_at_protos(logits: Tensor, boxes: Tensor, input_size: Sequence[int]) -> Tensor:
    _, h, w = logits.shape
    ratios = torch.tensor(
        [[w / input_size[1], h / input_size[0], w / input_size[1], h / input_size[0]]], device=boxes.device
    )
    return crop_masks(logits, boxes * ratios)


def scale_masks(masks: Tensor, shape: Sequence[int], pad: Sequence[float] | Tensor | None = None) -> Tensor:
    """Maps (n, H, W) masks in a letterboxed frame to (n, h0, w0) float in the frame shape = (h0, w0).

    The letterbox padding is cut off, then the rest is resized bilinearly (``align_corners=False``); values
    are interpolated, not thresholded. ``pad``: the letterbox (left, top) padding in the masks' pixels (the
    batch's ``pads`` for masks at the input size); None infers it from the two aspect ratios, centred (the
    reference's ``scale_masks``). The bottom and right cuts mirror the top and left ones, as the reference's.
    """
    height, width = masks.shape[-2:]
    h0, w0 = int(shape[0]), int(shape[1])
    if (height, width) == (h0, w0):
        return masks.float()
    if pad is None:
        gain = min(height / h0, width / w0)
        pad_w, pad_h = (width - w0 * gain) / 2, (height - h0 * gain) / 2
    else:
        pad_w, pad_h = (float(v) for v in pad)
    top, left = round(pad_h - 0.1), round(pad_w - 0.1)
    bottom, right = height - round(pad_h + 0.1), width - round(pad_w + 0.1)
    return _resize(masks[..., top:bottom, left:right].float(), (h0, w0))


def _resize(masks: Tensor, size: tuple[int, int]) -> Tensor:
    """Resizes (n, h, w) masks bilinearly to (n, *size), align_corners=False; no masks, an empty result."""
    if not len(masks):
        return masks.new_zeros((0, *size))
    return F.interpolate(masks[None], size, mode="bilinear", align_corners=False)[0]


def masks_to_original(
    masks: Tensor, original_size: Sequence[int], pad: Sequence[float] | Tensor | None = None
) -> Tensor:
    """Maps binary (n, H, W) masks at the letterboxed input to (n, h0, w0) bool in the original image.

    The masks are ``scale_masks`` > 0.5, how the reference draws predicted masks on the original image.
    """
    return scale_masks(masks, original_size, pad).gt(0.5)


def segment_image(
    detections: Tensor,
    protos: Tensor,
    input_size: Sequence[int],
    original_size: Sequence[int],
    scale: float | Tensor,
    pad: Tensor,
    retina_masks: bool = False,
) -> tuple[Tensor, Tensor]:
    """Turns one image's NMS output into detections and masks in original pixels, as the reference predicts.

    Args:
        detections: (n, 6 + 32) ``non_max_suppression(..., extra=32)`` rows of one image, input pixels.
        protos: (32, H/4, W/4) its prototypes.
        input_size: (H, W) of the letterboxed input.
        original_size: (h0, w0) of the original image.
        scale, pad: its letterbox gain and (left, top) padding (``ImageBatch.scales`` / ``pads``).
        retina_masks: masks computed at the original resolution (``masks_native``) instead of at the input
            size and then resized (``masks_at_input`` + ``masks_to_original``).

    Returns:
        (m, 6) ``[x1, y1, x2, y2, score, class]`` in original pixels and (m, h0, w0) bool masks; detections
        whose mask is empty (at the input size, or at the original one with ``retina_masks``) are dropped, as
        the reference does.
    """
    boxes = detections[:, :6].clone()
    coefficients = detections[:, 6:]
    h0, w0 = int(original_size[0]), int(original_size[1])
    if not len(detections):
        return boxes, torch.zeros((0, h0, w0), dtype=torch.bool, device=detections.device)
    orig = torch.tensor([h0, w0], device=boxes.device)
    pad = torch.as_tensor(pad, dtype=boxes.dtype, device=boxes.device)
    original_boxes = letterbox_to_original(boxes[:, :4], scale, pad, orig)
    boxes[:, :4] = original_boxes
    if retina_masks:
        masks = masks_native(protos, coefficients, original_boxes, (h0, w0))
        keep = masks.flatten(1).any(1)
        return boxes[keep], masks[keep]
    at_input = masks_at_input(protos, coefficients, detections[:, :4], input_size)
    keep = at_input.flatten(1).any(1)  # the reference keeps masks not empty at the input size
    return boxes[keep], masks_to_original(at_input[keep], (h0, w0), pad)


def image_target_masks(masks: Tensor, overlap: bool, targets: Tensor, image: int) -> Tensor:
    """Returns the (n, H/4, W/4) bool ground-truth masks of image ``image`` of a SegmentationBatch.

    One per row of ``targets`` (N, 6) whose image index is ``image``, in their order (the reference
    validator's ``_prepare_batch``).

    ``masks``: the batch's ``masks``, (B, H/4, W/4) index maps when ``overlap`` (k >= 1: the k-th row of the
    image), else (N, H/4, W/4) one 0/1 mask per row of ``targets``.
    """
    rows = targets[:, 0].to(torch.long) == image
    if not overlap:
        return masks[rows.to(masks.device)].bool()
    count = int(rows.sum())
    index = torch.arange(1, count + 1, device=masks.device, dtype=masks.dtype)
    return masks[image][None] == index[:, None, None]


def encode_rle(mask: Tensor | np.ndarray) -> dict[str, object]:
    """Encodes a binary (h, w) mask as COCO compressed RLE: {"size": [h, w], "counts": str}.

    Runs go down the columns (column-major), starting with a run of zeros (possibly empty); ``counts`` is
    COCO's string form (each run after the second as the difference to the run two before, in 5-bit groups
    offset by 48), what ``pycocotools.mask.encode`` returns decoded to ``str``, JSON-ready.
    """
    array = mask.detach().cpu().numpy() if isinstance(mask, Tensor) else np.asarray(mask)
    if array.ndim != 2:
        raise ValueError(f"encode_rle takes one (h, w) mask, got shape {array.shape}")
    flat = array.astype(bool).ravel(order="F")
    changes = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    runs = np.diff(np.concatenate(([0], changes, [flat.size]))).tolist()
    if flat.size and flat[0]:
        runs.insert(0, 0)
    return {"size": [int(array.shape[0]), int(array.shape[1])], "counts": _rle_string(runs)}


def _rle_string(runs: list[int]) -> str:
    out = []
    for i, run in enumerate(runs):
        x = run - runs[i - 2] if i > 2 else run
        while True:
            c = x & 0x1F
            x >>= 5
            more = x != -1 if c & 0x10 else x != 0
            out.append(chr((c | 0x20 if more else c) + 48))
            if not more:
                break
    return "".join(out)
