"""Mask post-processing parity with the reference (``ultralytics.utils.ops``, test oracle) on random inputs,
NMS carrying the mask coefficients, and the COCO RLE encoder against faster-coco-eval's decoder."""

from __future__ import annotations

import os

os.environ["YOLO_OFFLINE"] = "1"  # before any import of the reference package

import numpy as np
import pytest
import torch

from yolo11_lightning.ops.postprocess import non_max_suppression
from yolo11_lightning.tasks.segment.mask_ops import (
    crop_masks,
    encode_rle,
    image_target_masks,
    masks_at_input,
    masks_at_protos,
    masks_native,
    masks_to_original,
    scale_masks,
    segment_image,
)

INPUT = (160, 224)  # letterboxed input (H, W); protos at 1/4
PROTO = (40, 56)


def _inputs(
    seed: int, n: int, integer_boxes: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Protos (32, 40, 56), coefficients (n, 32) and xyxy boxes (n, 4) in input pixels, partly outside it."""
    g = torch.Generator().manual_seed(seed)
    protos = torch.randn(32, *PROTO, generator=g)
    coefficients = torch.randn(n, 32, generator=g) * 0.5
    xy = torch.rand(n, 2, generator=g) * torch.tensor([INPUT[1], INPUT[0]]) - 10
    wh = torch.rand(n, 2, generator=g) * 120 + 4
    boxes = torch.cat((xy, xy + wh), 1)
    if integer_boxes:  # edges on whole proto pixels: the reference's rounding crop (< 50 masks) agrees
        boxes = (boxes / 4).round().clamp(min=0) * 4
    return protos, coefficients, boxes


@pytest.fixture(scope="module")
def ref_ops():
    return pytest.importorskip("ultralytics.utils.ops")


@pytest.mark.parametrize(("n", "integer_boxes"), [(64, False), (7, True), (0, False)])
def test_mask_functions_match_reference(ref_ops, n: int, integer_boxes: bool) -> None:
    """Validator (proto resolution), predictor (input size) and native (retina / json) masks: pixel-identical
    to the reference's for 64 masks (its vectorised crop) and for 7 with whole-pixel box edges."""
    protos, coefficients, boxes = _inputs(n + 1, n, integer_boxes)
    if n == 0:  # the reference validator does not call process_mask without detections
        assert masks_at_protos(protos, coefficients, boxes, INPUT).shape == (0, *PROTO)
        assert masks_at_input(protos, coefficients, boxes, INPUT).shape == (0, *INPUT)
        assert masks_native(protos, coefficients, boxes, (50, 70)).shape == (0, 50, 70)
        return
    cases = {
        "process_mask": (
            masks_at_protos(protos, coefficients, boxes, INPUT),
            ref_ops.process_mask(protos, coefficients.clone(), boxes.clone(), INPUT),
        ),
        "process_mask upsample": (
            masks_at_input(protos, coefficients, boxes, INPUT),
            ref_ops.process_mask(protos, coefficients.clone(), boxes.clone(), INPUT, upsample=True),
        ),
        "process_mask_native": (
            masks_native(protos, coefficients, boxes, INPUT),
            ref_ops.process_mask_native(protos, coefficients.clone(), boxes.clone(), INPUT),
        ),
    }
    for name, (ours, theirs) in cases.items():
        assert ours.dtype == torch.bool and ours.shape == theirs.shape, name
        assert torch.equal(ours, theirs.bool()), f"{name}: {(ours != theirs.bool()).sum()} pixels differ"
        assert 0.005 < ours.float().mean() < 0.5, f"{name}: masks too empty or full to discriminate"


def test_native_masks_in_original_frame_match_reference(ref_ops) -> None:
    """Retina masks: boxes in original pixels, padding inferred from the proto and original aspect ratios."""
    protos, coefficients, boxes = _inputs(5, 60)
    original = (100, 180)  # letterboxed into 160 x 224 (gain 1.244, 17 px bands top and bottom)
    boxes = ref_ops.scale_boxes(INPUT, boxes.clone(), original)
    ours = masks_native(protos, coefficients, boxes, original)
    theirs = ref_ops.process_mask_native(protos, coefficients.clone(), boxes.clone(), original)
    assert ours.shape == (60, *original) and torch.equal(ours, theirs.bool())


@pytest.mark.parametrize("original", [(100, 180), (160, 90), (33, 47), (160, 224)])
def test_scale_masks_matches_reference(ref_ops, original: tuple[int, int]) -> None:
    """Letterbox padding removed and resized: equal to 1e-6, with the padding inferred or given."""
    g = torch.Generator().manual_seed(sum(original))
    masks = (torch.rand(5, *INPUT, generator=g) > 0.5).float()
    theirs = ref_ops.scale_masks(masks[None], original)[0]
    torch.testing.assert_close(scale_masks(masks, original), theirs, rtol=0, atol=1e-6)
    gain = min(INPUT[0] / original[0], INPUT[1] / original[1])
    pad = (
        round((INPUT[1] - round(original[1] * gain)) / 2 - 0.1),
        round((INPUT[0] - round(original[0] * gain)) / 2 - 0.1),
    )
    theirs_pad = ref_ops.scale_masks(masks[None], original, ratio_pad=((gain, gain), pad))[0]
    torch.testing.assert_close(scale_masks(masks, original, pad), theirs_pad, rtol=0, atol=1e-6)
    assert torch.equal(masks_to_original(masks.bool(), original, pad), theirs_pad > 0.5)


def test_crop_masks_keeps_pixels_inside_the_box(ref_ops) -> None:
    masks = torch.ones(60, 12, 16)
    boxes = torch.tensor([[2.5, 1.0, 7.0, 9.2]] * 60)
    cropped = crop_masks(masks, boxes)
    assert cropped[0].nonzero()[:, 0].unique().tolist() == list(range(1, 10))  # rows 1..9 (9 < 9.2)
    assert cropped[0].nonzero()[:, 1].unique().tolist() == list(range(3, 7))  # cols 3..6 (>= 2.5, < 7)
    assert torch.equal(cropped, ref_ops.crop_mask(masks.clone(), boxes))


def _predictions(seed: int, nc: int = 4, anchors: int = 500) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(1, 2, anchors, generator=g) * 200
    xy[:, :, anchors // 2 :] = xy[:, :, : anchors // 2] + torch.randn(1, 2, anchors // 2, generator=g) * 3
    wh = torch.rand(1, 2, anchors, generator=g) * 50 + 4
    scores = torch.rand(1, nc, anchors, generator=g) ** 3
    coefficients = torch.randn(1, 32, anchors, generator=g)
    return torch.cat((xy, wh, scores, coefficients), 1).repeat(2, 1, 1)


@pytest.mark.parametrize("multi_label", [True, False])
def test_nms_carries_the_mask_coefficients(multi_label: bool) -> None:
    """The detection columns are what NMS gives without the coefficients; each kept row carries its anchor's
    32 coefficients, as the reference's NMS (``nc=4``) returns them."""
    nms = pytest.importorskip("ultralytics.utils.nms")
    preds = _predictions(0)
    ours = non_max_suppression(preds, 0.05, 0.7, multi_label=multi_label, extra=32)
    plain = non_max_suppression(preds[:, : 4 + 4], 0.05, 0.7, multi_label=multi_label)
    theirs = nms.non_max_suppression(
        preds.clone(), 0.05, 0.7, multi_label=multi_label, nc=4, max_time_img=100.0
    )
    for a, p, b in zip(ours, plain, theirs):
        assert a.shape == b.shape and a.shape[1] == 6 + 32 and len(a) > 20
        assert torch.equal(a[:, :6], p)
        key_a, key_b = a[:, 4] * 1000 + a[:, 5], b[:, 4] * 1000 + b[:, 5]
        torch.testing.assert_close(a[key_a.argsort()], b[key_b.argsort()], rtol=0, atol=1e-4)
    with pytest.raises(ValueError, match="extra channels"):
        non_max_suppression(preds[:, :36], extra=32)


@pytest.mark.parametrize("retina", [False, True])
def test_segment_image_matches_reference_predictor(ref_ops, retina: bool) -> None:
    """One image through NMS rows to original-pixel boxes and masks, as the reference predictor's
    ``construct_result`` computes them (non-retina: masks drawn after ``scale_masks`` > 0.5)."""
    protos, coefficients, boxes = _inputs(9, 55)
    original, scale, pad = (100, 180), 224 / 180, torch.tensor([0.0, 18.0])  # round(100 * 1.244) = 124
    scores = torch.linspace(0.9, 0.3, 55)[:, None]
    det = torch.cat((boxes, scores, torch.zeros(55, 1), coefficients), 1)
    got_boxes, got_masks = segment_image(det, protos, INPUT, original, scale, pad, retina_masks=retina)
    ratio_pad = ((scale, scale), (0, 18))
    ref_boxes = ref_ops.scale_boxes(INPUT, boxes.clone(), original, ratio_pad=ratio_pad)
    if retina:
        ref_masks = ref_ops.process_mask_native(protos, coefficients, ref_boxes, original).bool()
        keep = ref_masks.flatten(1).any(1)
    else:  # its predictor keeps the masks not empty at the input size, and draws them scaled to the original
        at_input = ref_ops.process_mask(protos, coefficients, boxes.clone(), INPUT, upsample=True)
        keep = at_input.flatten(1).bool().any(1)
        ref_masks = ref_ops.scale_masks(at_input[None].float(), original, ratio_pad=ratio_pad)[0] > 0.5
    assert 0 < int(keep.sum()) < 55  # some boxes lie outside the image: their empty masks are dropped
    torch.testing.assert_close(got_boxes[:, :4], ref_boxes[keep], rtol=0, atol=1e-4)
    assert torch.equal(got_boxes[:, 4:], det[keep, 4:6])
    assert torch.equal(got_masks, ref_masks[keep])
    empty_boxes, empty_masks = segment_image(det[:0], protos, INPUT, original, scale, pad)
    assert empty_boxes.shape == (0, 6) and empty_masks.shape == (0, *original)


def test_rle_matches_faster_coco_eval() -> None:
    """Our compressed RLE strings equal faster-coco-eval's encoder's and decode back to the masks."""
    mask_api = pytest.importorskip("faster_coco_eval.core.mask")
    rng = np.random.default_rng(0)
    masks = [
        rng.random((37, 53)) > 0.5,  # many short runs
        np.zeros((20, 30), bool),
        np.ones((20, 30), bool),
        np.pad(np.ones((100, 80), bool), ((5, 9), (40, 3))),  # long runs: multi-group counts
        np.eye(1, 300, 0, dtype=bool),  # first pixel set: leading zero-length run
        rng.random((1, 7)) > 0.3,
    ]
    for mask in masks:
        rle = encode_rle(mask)
        assert isinstance(rle["counts"], str) and rle["size"] == list(mask.shape)
        reference = mask_api.encode(np.asfortranarray(mask.astype(np.uint8)))
        assert rle["counts"] == reference["counts"].decode()
        decoded = mask_api.decode({"size": rle["size"], "counts": rle["counts"].encode()})
        assert np.array_equal(decoded.astype(bool), mask)
    assert encode_rle(torch.from_numpy(masks[0])) == encode_rle(masks[0])
    with pytest.raises(ValueError, match=r"one \(h, w\) mask"):
        encode_rle(np.zeros((2, 3, 4), bool))


def test_image_target_masks_unpack_both_encodings() -> None:
    """One image's ground truth from a batch: the index map's k-th value is its k-th row; per-instance masks are
    that image's rows; both give the same masks for non-overlapping instances."""
    targets = torch.tensor(
        [[0, 1, 0.5, 0.5, 0.2, 0.2], [1, 0, 0.5, 0.5, 0.2, 0.2], [1, 2, 0.5, 0.5, 0.2, 0.2]]
    )
    index_maps = torch.zeros(2, 8, 10, dtype=torch.uint8)
    index_maps[0, 1:3, 1:4] = 1
    index_maps[1, 0:2, 0:2], index_maps[1, 5:8, 6:9] = 1, 2
    per_instance = torch.stack([index_maps[0] == 1, index_maps[1] == 1, index_maps[1] == 2]).to(torch.uint8)
    for image, rows in ((0, [0]), (1, [1, 2])):
        overlap = image_target_masks(index_maps, True, targets, image)
        separate = image_target_masks(per_instance, False, targets, image)
        assert overlap.dtype == separate.dtype == torch.bool and overlap.shape == (len(rows), 8, 10)
        assert torch.equal(overlap, separate) and torch.equal(separate, per_instance[rows].bool())
    assert image_target_masks(index_maps, True, targets[:0], 0).shape == (0, 8, 10)
