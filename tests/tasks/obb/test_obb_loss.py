"""ObbLoss: parity with the reference v8OBBLoss (test oracle) in float64, items and gradients, on random and
real-shaped batches (several images, varying counts, images without boxes, boxes under 2 pixels), an empty batch,
world-size invariance of the normaliser, probiou and the rotated assigner against the reference's."""

from __future__ import annotations

import math
import os
import types

os.environ["YOLO_OFFLINE"] = "1"  # before any ultralytics import

import pytest
import torch
from loss_inputs import random_head_maps

from yolo11_lightning.tasks.obb.loss import ObbLoss
from yolo11_lightning.tasks.obb.rotated import probiou

STRIDES = (8, 16, 32)


def _obb_preds(g: torch.Generator, bs: int, height: int, width: int, nc: int, dtype=torch.float64):
    """(maps, angles (B, 1, A) radians) as the train-mode OBB head gives them."""
    anchors = sum((height // s) * (width // s) for s in STRIDES)
    logits = torch.randn(bs, 1, anchors, generator=g, dtype=torch.float64)
    return random_head_maps(g, bs, height, width, nc, dtype), ((logits.sigmoid() - 0.25) * math.pi).to(dtype)


def _rotated_targets(g: torch.Generator, counts: list[int], height: int, width: int, nc: int) -> torch.Tensor:
    """(N, 7) rows [image, class, cx, cy, w, h, r], normalised; images with 3+ boxes get one under 2 pixels."""
    rows = []
    for image, n in enumerate(counts):
        wh = torch.rand(n, 2, generator=g, dtype=torch.float64) * 0.5 + 0.05
        cxcy = 0.15 + torch.rand(n, 2, generator=g, dtype=torch.float64) * 0.7
        angle = (torch.rand(n, 1, generator=g, dtype=torch.float64) - 0.25) * math.pi
        if n >= 3:
            wh[0] = torch.tensor([1.5 / width, 0.2])  # 1.5 px wide: left out, as the reference does
        cls = torch.randint(0, nc, (n, 1), generator=g).double()
        rows.append(
            torch.cat((torch.full((n, 1), float(image), dtype=torch.float64), cls, cxcy, wh, angle), 1)
        )
    return torch.cat(rows) if rows else torch.zeros(0, 7, dtype=torch.float64)


def _reference(preds, targets: torch.Tensor, nc: int):
    """The oracle's (loss, items) and its gradient of loss.sum() / batch_size, in float64."""
    loss_mod = pytest.importorskip("ultralytics.utils.loss")
    head = types.SimpleNamespace(
        nc=nc, reg_max=16, no=nc + 64, stride=torch.tensor(STRIDES, dtype=torch.float64)
    )
    anchor = torch.nn.Parameter(torch.zeros(1))
    args = types.SimpleNamespace(box=7.5, cls=0.5, dfl=1.5)
    model = types.SimpleNamespace(args=args, model=[head], parameters=lambda: iter([anchor]))
    maps, angles = preds
    leaves = [f.detach().clone().requires_grad_() for f in (*maps, angles)]
    batch = {"batch_idx": targets[:, 0], "cls": targets[:, 1:2], "bboxes": targets[:, 2:].clone()}
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        loss, items = loss_mod.v8OBBLoss(model)((leaves[:3], leaves[3]), batch)
    finally:
        torch.set_default_dtype(default)
    grads = torch.autograd.grad(loss.sum() / maps[0].shape[0], leaves)
    return loss, items, grads


def _ours(preds, targets, nc, **kwargs):
    maps, angles = preds
    leaves = [f.detach().clone().requires_grad_() for f in (*maps, angles)]
    loss, items = ObbLoss(nc, **kwargs)((leaves[:3], leaves[3]), targets)
    return loss, items, torch.autograd.grad(loss, leaves)


CASES = {  # boxes per image, height, width, classes
    "random": ([5, 3], 96, 128, 3),
    "image_without_boxes": ([4, 0, 2], 128, 128, 5),
    "tiny_boxes_only": ([1, 1], 64, 64, 2),
    "crowded_dota_like": ([30, 12], 128, 128, 15),
    "empty_batch": ([0, 0], 64, 96, 3),
}


CASES["real_size_slow"] = ([0, 8, 50, 150], 640, 640, 15)  # real image size and crowding: marked slow


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=pytest.mark.slow) if c.endswith("_slow") else c for c in CASES]
)
def test_loss_matches_reference(case: str, seed: int) -> None:
    counts, height, width, nc = CASES[case]
    g = torch.Generator().manual_seed(seed)
    preds = _obb_preds(g, len(counts), height, width, nc)
    targets = _rotated_targets(g, counts, height, width, nc)
    if case == "tiny_boxes_only":
        targets[:, 4] = 1.0 / width  # every box 1 pixel wide: nothing left to assign
    ref_loss, ref_items, ref_grads = _reference(preds, targets, nc)
    loss, items, grads = _ours(preds, targets, nc)
    assert items.shape == (3,) and loss.ndim == 0 and torch.isfinite(loss)
    torch.testing.assert_close(items, ref_items, rtol=1e-6, atol=0)  # box, cls, dfl
    torch.testing.assert_close(loss, ref_loss.sum() / len(counts), rtol=1e-6, atol=0)
    for ours, ref in zip(grads, ref_grads):
        torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6 * max(ref.abs().max().item(), 1e-30))
    if case in ("empty_batch", "tiny_boxes_only"):
        assert items[0] == items[2] == 0 and (grads[3] == 0).all()
    else:
        assert (items > 0).all() and grads[3].abs().sum() > 0  # the box term reached the angles


def test_probiou_matches_reference() -> None:
    metrics = pytest.importorskip("ultralytics.utils.metrics")
    g = torch.Generator().manual_seed(0)
    a = torch.cat((torch.rand(200, 2, generator=g) * 50, torch.rand(200, 2, generator=g) * 30 + 0.5,
                   (torch.rand(200, 1, generator=g) - 0.25) * math.pi), 1).double()  # fmt: skip
    b = a + torch.randn(200, 5, generator=g, dtype=torch.float64) * torch.tensor([5, 5, 3, 3, 0.3])
    b[:, 2:4] = b[:, 2:4].abs() + 0.1
    b[:5] = a[:5]  # identical boxes
    ours = probiou(a, b)
    torch.testing.assert_close(ours, metrics.probiou(a, b).squeeze(-1), rtol=1e-12, atol=1e-12)
    assert (ours[:5] > 0.999).all() and ours.min() >= -1e-7 and ours.max() < 1  # 1 - sqrt(1 + eps) at worst


def test_split_batch_with_reduced_normaliser_sums_to_whole_batch_gradient() -> None:
    g = torch.Generator().manual_seed(5)
    nc, counts = 3, [3, 0, 6, 2]
    preds = _obb_preds(g, 4, 64, 96, nc)
    targets = _rotated_targets(g, counts, 64, 96, nc)
    _, whole_items, whole_grads = _ours(preds, targets, nc)
    halves = []
    for lo, hi in ((0, 2), (2, 4)):
        keep = (targets[:, 0] >= lo) & (targets[:, 0] < hi)
        part = targets[keep].clone()
        part[:, 0] -= lo
        halves.append((([m[lo:hi] for m in preds[0]], preds[1][lo:hi]), part))
    seen: list[torch.Tensor] = []
    for p, t in halves:
        ObbLoss(nc, sum_over_ranks=lambda x: seen.append(x) or x)(p, t)
    assert [s.shape for s in seen] == [(4,), (4,)]  # [Σ target scores, Σ box, Σ cls, Σ dfl]
    grads = []
    for (p, t), other in zip(halves, reversed(seen)):
        _, part_items, part_grads = _ours(p, t, nc, sum_over_ranks=lambda x, o=other: x + o)
        torch.testing.assert_close(part_items, whole_items, rtol=1e-10, atol=0)
        grads.append(part_grads)
    for j, whole in enumerate(whole_grads):
        torch.testing.assert_close(torch.cat((grads[0][j], grads[1][j])), whole, rtol=1e-10, atol=1e-14)


def test_float32_empty_batch_keeps_the_angles_in_the_graph() -> None:
    g = torch.Generator().manual_seed(1)
    maps, angles = _obb_preds(g, 2, 64, 64, 2, torch.float32)
    leaves = [p.requires_grad_() for p in (*maps, angles)]
    loss, items = ObbLoss(2)((leaves[:3], leaves[3]), torch.zeros(0, 7))
    loss.backward()
    assert (
        torch.isfinite(loss) and items[0] == 0 and leaves[3].grad is not None and (leaves[3].grad == 0).all()
    )


def test_bad_inputs_are_named() -> None:
    g = torch.Generator().manual_seed(0)
    preds = _obb_preds(g, 2, 64, 64, 2)
    with pytest.raises(ValueError, match=r"targets has shape \(3, 6\), expected \(N, 7\) rows"):
        ObbLoss(2)(preds, torch.zeros(3, 6))
    with pytest.raises(ValueError, match=r"angles have shape \(2, 2, 84\), expected \(B, 1, A\)"):
        ObbLoss(2)((preds[0], preds[1].repeat(1, 2, 1)), torch.zeros(0, 7))


@pytest.mark.parametrize("sparse", [True, False], ids=["sparse", "dense"])
def test_tiny_boxes_among_real_ones_are_ignored_as_the_reference_drops_them(sparse: bool) -> None:
    """Tiny boxes kept as rows (no host sync) but absent to the assigner: first, middle and last of an image, and
    an image with tiny boxes only, on both assigner paths (dense is the accelerator's)."""
    from yolo11_lightning.tasks.obb.assigner import RotatedTaskAlignedAssigner

    g = torch.Generator().manual_seed(3)
    counts, height, width, nc = [5, 2, 3], 64, 96, 3
    preds = _obb_preds(g, len(counts), height, width, nc)
    targets = _rotated_targets(g, counts, height, width, nc)
    tiny = [0, 2, 4, 5, 6, 7]  # image 0: rows 0, 2, 4 of 5; image 1: both; image 2: its first
    targets[tiny[:3], 4] = 1.0 / width  # 1 pixel wide
    targets[tiny[3:], 5] = 1.5 / height  # 1.5 pixels high
    ref_loss, ref_items, ref_grads = _reference(preds, targets, nc)
    loss, items, grads = _ours(preds, targets, nc, assigner=RotatedTaskAlignedAssigner(sparse=sparse))
    torch.testing.assert_close(items, ref_items, rtol=1e-6, atol=0)
    torch.testing.assert_close(loss, ref_loss.sum() / len(counts), rtol=1e-6, atol=0)
    for ours, ref in zip(grads, ref_grads):
        torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6 * max(ref.abs().max().item(), 1e-30))
    assert (items > 0).all()
    # Without the tiny rows: the same loss, to the last bits the row count can change.
    kept = torch.ones(len(targets), dtype=torch.bool)
    kept[tiny] = False
    _, items_kept, _ = _ours(preds, targets[kept], nc, assigner=RotatedTaskAlignedAssigner(sparse=sparse))
    torch.testing.assert_close(items, items_kept, rtol=1e-12, atol=0)
