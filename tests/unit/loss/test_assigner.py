"""TaskAlignedAssigner and complete_iou: behaviour, and parity with the reference package (test oracle)."""

from __future__ import annotations

import math
import os

import pytest
import torch

from yolo11_lightning.loss import TaskAlignedAssigner
from yolo11_lightning.ops import complete_iou, make_anchors

os.environ["YOLO_OFFLINE"] = "1"  # before any ultralytics import

STRIDES = (8, 16, 32)


def _boxes(g: torch.Generator, n: int, height: int, width: int) -> torch.Tensor:
    """(n, 4) xyxy pixel boxes: ordinary ones, plus 2 px, border-touching, whole-image and duplicate boxes."""
    wh = (torch.rand(n, 2, generator=g, dtype=torch.float64) * 0.5 + 0.02) * torch.tensor([width, height])
    xy = torch.rand(n, 2, generator=g, dtype=torch.float64) * (torch.tensor([width, height]) - wh)
    boxes = torch.cat((xy, xy + wh), 1)
    specials = [
        [10.0, 12.0, 12.0, 14.0],  # 2 px: at most one anchor inside
        [0.0, 0.0, 40.0, 30.0],  # touches the top-left border
        [width - 50.0, height - 20.0, float(width), float(height)],  # bottom-right border
        [0.0, 0.0, float(width), float(height)],  # the whole image
        [4.0, 12.0, 36.0, 44.0],  # edges through stride-8 anchor centres: those are not inside
    ]
    for i, box in enumerate(specials[: max(n - 2, 0)]):
        boxes[i] = torch.tensor(box, dtype=torch.float64)
    if n >= 6:
        boxes[-1] = boxes[-2]  # exact duplicate: every overlap ties, the first box must win
    return boxes


def _problem(seed: int, counts: list[int], height: int, width: int, nc: int = 6, reach: float = 6.0):
    """Random predictions over the anchors of an image, and flat ground truths with `counts` boxes per image.

    Predicted boxes reach up to `reach` cells from their anchor on each side: small values make most
    CIoUs clamp to 0, so ties among zero alignments and all-zero contests decide the assignment.
    """
    g = torch.Generator().manual_seed(seed)
    shapes = [(height // s, width // s) for s in STRIDES]
    points, stride = make_anchors(shapes, STRIDES, dtype=torch.float64)
    anchors = points * stride
    bs, na = len(counts), anchors.shape[0]
    scores = torch.rand(bs, na, nc, generator=g, dtype=torch.float64)
    dist = torch.rand(bs, na, 4, generator=g, dtype=torch.float64) * reach * stride
    pd_boxes = torch.cat((anchors - dist[..., :2], anchors + dist[..., 2:]), -1)
    boxes = torch.cat([_boxes(g, c, height, width) for c in counts]) if sum(counts) else torch.zeros(0, 4)
    labels = torch.randint(0, nc, (boxes.shape[0],), generator=g)
    image = torch.arange(bs).repeat_interleave(torch.tensor(counts))
    return scores, pd_boxes, anchors, boxes.double(), labels, image


def _reference_assign(scores, pd_boxes, anchors, boxes, labels, image):
    """The oracle's assigner on the padded (B, M) layout built from our flat list."""
    tal = pytest.importorskip("ultralytics.utils.tal")
    bs = scores.shape[0]
    counts = torch.bincount(image, minlength=bs)
    m = int(counts.max()) if len(image) else 0
    gt_boxes = torch.zeros(bs, m, 4, dtype=torch.float64)
    gt_labels = torch.zeros(bs, m, 1, dtype=torch.float64)
    local = torch.cat([torch.arange(int(c)) for c in counts]) if len(image) else image
    gt_boxes[image, local] = boxes
    gt_labels[image, local, 0] = labels.double()
    mask_gt = gt_boxes.sum(2, keepdim=True).gt(0)
    assigner = tal.TaskAlignedAssigner(topk=10, num_classes=scores.shape[-1], alpha=0.5, beta=6.0, eps=1e-9)
    _, target_boxes, target_scores, fg, gt_idx = assigner(
        scores, pd_boxes, anchors, gt_labels, gt_boxes, mask_gt
    )
    return fg, target_scores, target_boxes, gt_idx, local


CASES = {  # boxes per image, height, width, prediction reach
    "one_box": ([1], 128, 128, 6.0),
    "image_without_boxes": ([3, 0, 2], 128, 160, 6.0),
    "crowded_200": ([200, 2], 256, 320, 6.0),
    "non_square_mixed": ([7, 1, 12], 256, 320, 6.0),
    "poor_predictions": ([40, 25], 128, 160, 0.3),
}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("case", list(CASES))
def test_assigner_matches_reference(case: str, seed: int) -> None:
    counts, height, width, reach = CASES[case]
    problem = _problem(seed, counts, height, width, reach=reach)
    ref_fg, ref_scores, ref_boxes, ref_idx, local = _reference_assign(*problem)
    out = TaskAlignedAssigner()(*problem[:3], problem[3], problem[4], problem[5])

    assert ref_fg.any(), "the case must assign something"
    assert torch.equal(out.fg_mask, ref_fg)
    torch.testing.assert_close(out.target_scores, ref_scores.to(out.target_scores.dtype), rtol=0, atol=1e-7)
    fg = out.fg_mask
    assert torch.equal(local[out.gt_index[fg]], ref_idx[fg])
    assert torch.equal(out.target_boxes[fg], ref_boxes[fg])
    assert not out.target_boxes[~fg].any() and not out.target_scores[~fg].any()


@pytest.mark.parametrize("sparse", [True, False])
def test_chunking_and_sparse_evaluation_change_nothing(sparse: bool) -> None:
    problem = _problem(3, [30, 0, 45], 128, 160)
    whole = TaskAlignedAssigner(sparse=not sparse)(*problem)
    na = problem[2].shape[0]
    chunked = TaskAlignedAssigner(max_pairs=na, sparse=sparse)(*problem)  # one box per chunk
    assert torch.equal(whole.fg_mask, chunked.fg_mask) and torch.equal(whole.gt_index, chunked.gt_index)
    # Same formulas on differently shaped tensors: equal up to the last bit of SIMD vs scalar paths.
    torch.testing.assert_close(whole.target_scores, chunked.target_scores, rtol=1e-14, atol=1e-16)
    assert torch.equal(whole.target_boxes, chunked.target_boxes)


@pytest.mark.parametrize("sparse", [True, False])
def test_rows_outside_gt_valid_are_as_if_left_out(sparse: bool) -> None:
    """Invalid rows (whole-image boxes: they contain every anchor) first, among and after the valid ones, and an
    image of invalid rows only; predictions so poor that most contests are all-zero (the image's first valid box
    wins those): the same assignment as without the rows, their indices mapped."""
    scores, pd_boxes, anchors, boxes, labels, image = _problem(5, [12, 0, 9], 128, 160, reach=0.3)
    whole = torch.tensor([[0.0, 0.0, 160.0, 128.0]], dtype=torch.float64)
    parts, valid = [], []
    for img in range(3):
        own = (image == img).nonzero().flatten()
        spots = [0, len(own) // 2, len(own)] if len(own) else [0, 0]
        rows = [(boxes[i], labels[i], True) for i in own]
        for at in reversed(spots):
            rows.insert(at, (whole[0], torch.tensor(img % 6), False))
        parts += [(b, lab, img) for b, lab, _ in rows]
        valid += [v for _, _, v in rows]
    all_boxes = torch.stack([b for b, _, _ in parts])
    all_labels = torch.stack([lab for _, lab, _ in parts])
    all_image = torch.tensor([i for _, _, i in parts])
    valid_t = torch.tensor(valid)
    assigner = TaskAlignedAssigner(sparse=sparse)
    out = assigner(scores, pd_boxes, anchors, all_boxes, all_labels, all_image, valid_t)
    ref = assigner(scores, pd_boxes, anchors, all_boxes[valid_t], all_labels[valid_t], all_image[valid_t])
    assert ref.fg_mask.any() and torch.equal(out.fg_mask, ref.fg_mask)
    kept = valid_t.nonzero().flatten()
    assert torch.equal(out.gt_index[out.fg_mask], kept[ref.gt_index[ref.fg_mask]])
    assert torch.equal(out.target_scores, ref.target_scores)
    assert torch.equal(out.target_boxes, ref.target_boxes)


def test_contested_anchor_goes_to_box_of_highest_overlap() -> None:
    """Box 0 holds all 16 anchors, box 1 the left 12; every prediction is box 1, so box 1 wins the shared ones."""
    points, stride = make_anchors([(4, 4)], [8], dtype=torch.float64)
    anchors = points * stride  # centres 4, 12, 20, 28
    na = anchors.shape[0]
    boxes = torch.tensor([[0.0, 0.0, 32.0, 32.0], [0.0, 0.0, 25.0, 31.0]], dtype=torch.float64)
    pd_boxes = boxes[1].expand(1, na, 4).clone()
    scores = torch.full((1, na, 2), 0.5, dtype=torch.float64)
    out = TaskAlignedAssigner(topk=16)(
        scores, pd_boxes, anchors, boxes, torch.tensor([0, 1]), torch.tensor([0, 0])
    )

    shared = anchors[:, 0] < 25
    assert out.fg_mask.all()
    assert (out.gt_index[0][shared] == 1).all() and (out.gt_index[0][~shared] == 0).all()
    ones = torch.ones(int(shared.sum()), dtype=torch.float64)
    torch.testing.assert_close(out.target_scores[0][shared, 1], ones)  # CIoU 1 with its predictions
    # Box 0 keeps the other 4, all equally aligned: target score = its best CIoU.
    expected = complete_iou(boxes[0], boxes[1]).expand(int((~shared).sum()))
    torch.testing.assert_close(out.target_scores[0][~shared, 0], expected)
    assert not out.target_scores[0][shared, 0].any() and not out.target_scores[0][~shared, 1].any()


def test_topk_limits_anchors_per_box_and_no_boxes_means_background() -> None:
    scores, pd_boxes, anchors, boxes, labels, image = _problem(4, [5], 256, 256)
    out = TaskAlignedAssigner(topk=3)(scores, pd_boxes, anchors, boxes, labels, image)
    per_box = torch.bincount(out.gt_index[out.fg_mask], minlength=5)
    assert out.fg_mask.any() and (per_box <= 3).all()

    empty = TaskAlignedAssigner()(scores, pd_boxes, anchors, boxes[:0], labels[:0], image[:0])
    assert not empty.fg_mask.any() and not empty.target_scores.any()


def test_complete_iou_values() -> None:
    box = torch.tensor([0.0, 0.0, 4.0, 2.0], dtype=torch.float64)
    torch.testing.assert_close(
        complete_iou(box, box), torch.tensor(1.0, dtype=torch.float64), atol=1e-6, rtol=0
    )
    # Same shape, shifted right by 2: IoU 1/3, centre distance² 4 over enclosing diagonal² 36 + 4.
    shifted = box + torch.tensor([2.0, 0.0, 2.0, 0.0], dtype=torch.float64)
    torch.testing.assert_close(complete_iou(box, shifted), torch.tensor(1 / 3 - 4 / 40, dtype=torch.float64))
    # Broadcasting: (2, 1, 4) against (3, 4) gives (2, 3).
    assert complete_iou(torch.stack((box, shifted))[:, None], torch.stack((box, shifted, box))).shape == (
        2,
        3,
    )
    # Aspect term: concentric 2x2 and 4x1 boxes (areas 4): IoU 2/6, no centre distance, v > 0.
    square = torch.tensor([-1.0, -1.0, 1.0, 1.0], dtype=torch.float64)
    wide = torch.tensor([-2.0, -0.5, 2.0, 0.5], dtype=torch.float64)
    v = 4 / math.pi**2 * (math.atan(4.0) - math.atan(1.0)) ** 2
    expected = 1 / 3 - v * v / (v - 1 / 3 + 1)
    torch.testing.assert_close(
        complete_iou(square, wide), torch.tensor(expected, dtype=torch.float64), atol=1e-6, rtol=0
    )


def test_complete_iou_matches_reference_formula() -> None:
    metrics = pytest.importorskip("ultralytics.utils.metrics")
    g = torch.Generator().manual_seed(0)
    xy = torch.rand(5000, 2, generator=g, dtype=torch.float64) * 50
    a = torch.cat((xy, xy + torch.rand(5000, 2, generator=g, dtype=torch.float64) * 10 + 0.01), 1)
    b = a + torch.randn(5000, 4, generator=g, dtype=torch.float64)
    b[:, 2:] = torch.maximum(b[:, 2:], b[:, :2] + 0.01)
    a.requires_grad_()
    ours = complete_iou(a, b)
    ref = metrics.bbox_iou(a, b, xywh=False, CIoU=True).squeeze(-1)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    (grad,) = torch.autograd.grad(ours.sum(), a)
    (ref_grad,) = torch.autograd.grad(ref.sum(), a)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-10, atol=1e-12)
