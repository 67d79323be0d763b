"""Post-processing parity with the reference NMS, and the letterbox inverse."""

import os

import pytest
import torch

from yolo11_lightning.ops.postprocess import letterbox_to_original, non_max_suppression

os.environ.setdefault("YOLO_OFFLINE", "1")


def _random_predictions(seed: int, batch: int = 2, num_classes: int = 5, anchors: int = 600) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(batch, 2, anchors, generator=g) * 320
    wh = torch.rand(batch, 2, anchors, generator=g) * 60 + 2
    # Clustered boxes so NMS has overlaps to suppress; scores spread around the thresholds.
    xy[:, :, anchors // 2 :] = xy[:, :, : anchors // 2] + torch.randn(batch, 2, anchors // 2, generator=g) * 3
    scores = torch.rand(batch, num_classes, anchors, generator=g) ** 3
    return torch.cat((xy, wh, scores), 1)


@pytest.mark.parametrize("multi_label", [True, False])
@pytest.mark.parametrize("seed", [0, 1])
def test_nms_matches_reference(seed: int, multi_label: bool) -> None:
    ops = pytest.importorskip("ultralytics.utils.nms")
    preds = _random_predictions(seed)
    ours = non_max_suppression(preds, 0.05, 0.7, max_detections=300, multi_label=multi_label)
    theirs = ops.non_max_suppression(
        preds.clone(), 0.05, 0.7, multi_label=multi_label, max_det=300, max_time_img=100.0
    )
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape
        # Same detections; order may differ only between equal scores, so compare sorted rows.
        key_a, key_b = a[:, 4] * 1000 + a[:, 5], b[:, 4] * 1000 + b[:, 5]
        torch.testing.assert_close(a[key_a.argsort()], b[key_b.argsort()], rtol=0, atol=1e-4)


def _pairs_at_the_iou_threshold(seed: int, pairs: int = 400, num_classes: int = 80) -> torch.Tensor:
    """(1, 4 + nc, 2 * pairs) predictions: pairs of equal boxes shifted so their IoU is 0.7 within 1e-5,
    one class per pair (up to 79: a class offset of 600k px, where float32 keeps 1/16 px)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(pairs, generator=g) * 100 + 20
    shift = w * 0.3 / 1.7 * (1 + (torch.rand(pairs, generator=g) - 0.5) * 2e-5)  # IoU (w - s) / (w + s)
    cx, cy = torch.rand(2, pairs, generator=g) * 600 + 20
    xy = torch.cat((torch.stack((cx, cy)), torch.stack((cx + shift, cy))), 1)
    wh = torch.stack((w, w)).repeat(1, 2)
    classes = torch.randint(0, num_classes, (pairs,), generator=g).repeat(2)
    scores = torch.zeros(num_classes, 2 * pairs)
    scores[classes, torch.arange(2 * pairs)] = torch.rand(2 * pairs, generator=g) * 0.9 + 0.05
    return torch.cat((xy, wh, scores))[None]


@pytest.mark.parametrize("seed", [0, 1])
def test_nms_decides_threshold_cases_as_the_reference(seed: int) -> None:
    """The class offset sets the float rounding of each IoU: the reference's 7680 px keeps or drops the
    same boxes at IoU 0.7 (torchvision's batched_nms, offset = largest coordinate + 1, differs by ~20)."""
    ops = pytest.importorskip("ultralytics.utils.nms")
    preds = _pairs_at_the_iou_threshold(seed)
    ours = non_max_suppression(preds, 0.001, 0.7, max_detections=1000)[0]
    theirs = ops.non_max_suppression(
        preds.clone(), 0.001, 0.7, multi_label=True, max_det=1000, max_time_img=100.0
    )[0]
    assert 0 < len(preds[0, 0]) - len(theirs) < len(preds[0, 0]) // 2  # some pairs suppressed, not all
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def test_nms_caps_detections_and_handles_empty() -> None:
    preds = _random_predictions(3)
    out = non_max_suppression(preds, 0.0, 0.99, max_detections=7)
    assert all(d.shape == (7, 6) for d in out)
    empty = non_max_suppression(torch.zeros(1, 9, 50), 0.5, 0.7)
    assert empty[0].shape == (0, 6)


def test_letterbox_to_original_inverts_letterbox() -> None:
    # A 200x100 (w x h) image letterboxed into 128x128: scale 0.64, pad top (128 - 64) / 2 = 32.
    original = torch.tensor([[10.0, 20.0, 150.0, 90.0]])
    scale, pad = 0.64, torch.tensor([0.0, 32.0])
    letterboxed = original * scale + pad.repeat(2)
    back = letterbox_to_original(letterboxed, scale, pad, torch.tensor([100, 200]))
    torch.testing.assert_close(back, original)
    clipped = letterbox_to_original(
        torch.tensor([[-5.0, 0.0, 200.0, 200.0]]), scale, pad, torch.tensor([100, 200])
    )
    assert clipped[0].tolist() == [0.0, 0.0, 200.0, 100.0]
