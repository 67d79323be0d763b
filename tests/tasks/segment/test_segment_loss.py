"""SegmentationLoss: parity with the reference v8SegmentationLoss (test oracle) in float64, overlap and
per-instance masks, empty images, world-size invariance, bad inputs."""

from __future__ import annotations

import os
import types

os.environ["YOLO_OFFLINE"] = "1"  # before any ultralytics import

import pytest
import torch
from loss_inputs import random_box_targets, random_head_maps

from yolo11_lightning.tasks.segment.loss import SegmentationLoss

STRIDES = (8, 16, 32)
NM = 32


def _seg_preds(g: torch.Generator, bs: int, height: int, width: int, nc: int, dtype=torch.float64):
    """(maps, coefficients (B, 32, A), protos (B, 32, H/4, W/4)) as the train-mode seg head gives them."""
    maps = random_head_maps(g, bs, height, width, nc, dtype)
    anchors = sum((height // s) * (width // s) for s in STRIDES)
    coefficients = (torch.randn(bs, NM, anchors, generator=g, dtype=torch.float64) * 0.5).to(dtype)
    protos = torch.randn(bs, NM, height // 4, width // 4, generator=g, dtype=torch.float64).to(dtype)
    return maps, coefficients, protos


def _instance_masks(targets: torch.Tensor, mh: int, mw: int, empty_every: int = 0) -> torch.Tensor:
    """(N, mh, mw) 0/1: the ellipse inscribed in each box (a mask that is not its box); every
    ``empty_every``-th instance has an empty mask (an image "without masks" for that object)."""
    ys = (torch.arange(mh, dtype=torch.float64) + 0.5).view(1, mh, 1) / mh
    xs = (torch.arange(mw, dtype=torch.float64) + 0.5).view(1, 1, mw) / mw
    cx, cy, w, h = (targets[:, i].view(-1, 1, 1) for i in range(2, 6))
    inside = ((xs - cx) / (w / 2)).square() + ((ys - cy) / (h / 2)).square() <= 1
    masks = inside.to(torch.uint8)
    if empty_every:
        masks[::empty_every] = 0
    return masks


def _overlap_maps(targets: torch.Tensor, instances: torch.Tensor, bs: int) -> torch.Tensor:
    """(B, mh, mw) index maps: value k = k-th row of the image (1-based); larger instances drawn first."""
    _, mh, mw = instances.shape
    maps = torch.zeros(bs, mh, mw, dtype=torch.uint8)
    for image in range(bs):
        rows = (targets[:, 0] == image).nonzero().flatten().tolist()
        order = sorted(range(len(rows)), key=lambda k: -float(instances[rows[k]].sum()))
        for k in order:
            maps[image][instances[rows[k]].bool()] = k + 1
    return maps


def _reference(preds, targets: torch.Tensor, masks: torch.Tensor, nc: int, overlap: bool, force_vector: bool):
    """The oracle's (loss, items) and its gradient of loss.sum() / batch_size, in float64.

    The oracle crops masks with one of two formulas: rounded box edges for fewer than 50 masks on CPU, exact
    edges (``x1 <= col < x2``) otherwise, which is what training on a GPU always uses. ``force_vector`` runs
    the oracle's own crop on the exact-edge path by padding it to 50 masks.
    """
    loss_mod = pytest.importorskip("ultralytics.utils.loss")
    ops = pytest.importorskip("ultralytics.utils.ops")
    head = types.SimpleNamespace(
        nc=nc, reg_max=16, no=nc + 64, stride=torch.tensor(STRIDES, dtype=torch.float64)
    )
    anchor = torch.nn.Parameter(torch.zeros(1))
    args = types.SimpleNamespace(box=7.5, cls=0.5, dfl=1.5, overlap_mask=overlap)
    model = types.SimpleNamespace(args=args, model=[head], parameters=lambda: iter([anchor]))
    maps, coefficients, protos = preds
    leaves = [f.detach().clone().requires_grad_() for f in (*maps, coefficients, protos)]
    batch = {"batch_idx": targets[:, 0], "cls": targets[:, 1:2], "bboxes": targets[:, 2:], "masks": masks}

    def exact_crop(m: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
        n = m.shape[0]
        pad = max(50 - n, 0)
        padded = ops.crop_mask(
            torch.cat((m, m.new_zeros(pad, *m.shape[1:]))), torch.cat((boxes, boxes.new_zeros(pad, 4)))
        )
        return padded[:n]

    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # the oracle builds its buffers in the default dtype
    original = loss_mod.crop_mask
    if force_vector:
        loss_mod.crop_mask = exact_crop
    try:
        loss, items = loss_mod.v8SegmentationLoss(model)((leaves[:3], leaves[3], leaves[4]), batch)
    finally:
        loss_mod.crop_mask = original
        torch.set_default_dtype(default)
    grads = torch.autograd.grad(loss.sum() / maps[0].shape[0], leaves)
    return loss, items, grads


def _ours(preds, targets, masks, nc, overlap=True, **kwargs):
    maps, coefficients, protos = preds
    leaves = [f.detach().clone().requires_grad_() for f in (*maps, coefficients, protos)]
    loss, items = SegmentationLoss(nc, overlap=overlap, **kwargs)(
        (leaves[:3], leaves[3], leaves[4]), targets, masks
    )
    return loss, items, torch.autograd.grad(loss, leaves)


CASES = {  # boxes per image, height, width, classes, overlap, mask scale (1 = protos' size, 4 = input size)
    "overlap": ([5, 3], 96, 128, 3, True, 1),
    "per_instance": ([5, 3], 96, 128, 3, False, 1),
    "empty_image_overlap": ([4, 0, 2], 64, 64, 5, True, 1),
    "empty_image_per_instance": ([0, 3, 0], 64, 96, 2, False, 1),
    "empty_batch": ([0, 0], 64, 64, 3, True, 1),
    "full_resolution_masks": ([6, 2], 64, 96, 4, True, 4),
    "crowded_unpatched_oracle": ([40, 12], 128, 128, 6, True, 1),
}


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("case", list(CASES))
def test_loss_matches_reference(case: str, seed: int) -> None:
    counts, height, width, nc, overlap, up = CASES[case]
    g = torch.Generator().manual_seed(seed)
    preds = _seg_preds(g, len(counts), height, width, nc)
    targets = random_box_targets(g, counts, height, width, nc)
    instances = _instance_masks(targets, height // 4 * up, width // 4 * up, empty_every=3)
    masks = _overlap_maps(targets, instances, len(counts)) if overlap else instances
    ref_loss, ref_items, ref_grads = _reference(
        preds, targets, masks, nc, overlap, force_vector=not case.endswith("unpatched_oracle")
    )
    loss, items, grads = _ours(preds, targets, masks, nc, overlap)

    assert items.shape == (4,) and loss.ndim == 0
    torch.testing.assert_close(items, ref_items, rtol=1e-6, atol=0)  # box, seg, cls, dfl each
    torch.testing.assert_close(loss, ref_loss.sum() / len(counts), rtol=1e-6, atol=0)
    if sum(counts):
        assert (items > 0).all()
    else:
        assert items[0] == items[1] == items[3] == 0
    for ours, ref in zip(grads, ref_grads):
        torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6 * max(ref.abs().max().item(), 1e-30))
    if sum(counts):
        assert grads[4].abs().sum() > 0 and grads[3].abs().sum() > 0  # the mask term reached protos and coefs


def test_crowded_case_is_on_the_oracles_exact_edge_path() -> None:
    """The unpatched-oracle case must have >= 50 foreground anchors per image (else it proves nothing)."""
    counts, height, width, nc, _, _ = CASES["crowded_unpatched_oracle"]
    g = torch.Generator().manual_seed(0)
    preds = _seg_preds(g, len(counts), height, width, nc)
    targets = random_box_targets(g, counts, height, width, nc)
    prep = SegmentationLoss(nc)._assign(preds[0], targets)
    assert (prep.assign.fg_mask.sum(1) >= 50).all()


def test_images_without_boxes_or_masks_stay_finite_in_float32() -> None:
    g = torch.Generator().manual_seed(3)
    counts = [0, 3, 0]
    preds = _seg_preds(g, 3, 64, 64, 2, torch.float32)
    targets = random_box_targets(g, counts, 64, 64, 2).float()
    masks = torch.zeros(3, 16, 16, dtype=torch.uint8)  # boxes, but no mask pixels at all
    leaves = [p.requires_grad_() for p in (*preds[0], preds[1], preds[2])]
    loss, items = SegmentationLoss(2)((leaves[:3], leaves[3], leaves[4]), targets, masks)
    loss.backward()
    assert torch.isfinite(loss) and loss.dtype == torch.float32 and (items > 0).all()
    for leaf in leaves:
        assert leaf.grad is not None and torch.isfinite(leaf.grad).all()
    # Images without boxes: their protos and coefficients get exactly zero gradient (but are in the graph).
    assert (leaves[4].grad[[0, 2]] == 0).all() and (leaves[3].grad[[0, 2]] == 0).all()
    assert leaves[4].grad[1].abs().sum() > 0


def test_split_batch_with_reduced_normalisers_sums_to_whole_batch_gradient() -> None:
    """Two 'ranks' with half the batch each; both normalisers summed over both: gradients add up to one process."""
    g = torch.Generator().manual_seed(5)
    nc, counts = 3, [3, 0, 6, 2]
    preds = _seg_preds(g, 4, 64, 96, nc)
    targets = random_box_targets(g, counts, 64, 96, nc)
    instances = _instance_masks(targets, 16, 24)
    for overlap in (True, False):
        masks = _overlap_maps(targets, instances, 4) if overlap else instances
        _, whole_items, whole_grads = _ours(preds, targets, masks, nc, overlap)
        halves = []
        for lo, hi in ((0, 2), (2, 4)):
            keep = (targets[:, 0] >= lo) & (targets[:, 0] < hi)
            part = targets[keep].clone()
            part[:, 0] -= lo
            maps, coefficients, protos = preds
            part_preds = ([m[lo:hi] for m in maps], coefficients[lo:hi], protos[lo:hi])
            halves.append((part_preds, part, masks[lo:hi] if overlap else masks[keep]))
        seen: list[torch.Tensor] = []
        seen_append = lambda x, seen=seen: seen.append(x) or x  # noqa: E731
        for p, t, m in halves:
            SegmentationLoss(nc, overlap=overlap, sum_over_ranks=seen_append)((p[0], p[1], p[2]), t, m)
        # [Σ target scores, foreground anchors, Σ box, Σ seg, Σ cls, Σ dfl] of each half
        assert [s.shape for s in seen] == [(6,), (6,)] and seen[0][1] > 0 and seen[1][1] > 0
        grads = []
        for (p, t, m), other in zip(halves, reversed(seen)):
            _, part_items, part_grads = _ours(p, t, m, nc, overlap, sum_over_ranks=lambda x, o=other: x + o)
            # Items come from the summed term sums: each 'rank' logs the whole batch's.
            torch.testing.assert_close(part_items, whole_items, rtol=1e-10, atol=0)
            grads.append(part_grads)
        for k, whole in enumerate(whole_grads):
            torch.testing.assert_close(torch.cat((grads[0][k], grads[1][k])), whole, rtol=1e-10, atol=1e-14)
        # Without the reduction each half normalises by its own counts: not the whole-batch gradient.
        _, _, alone = _ours(*halves[0], nc, overlap)
        assert not torch.allclose(alone[4], whole_grads[4][:2], rtol=1e-3)


def test_sum_over_ranks_runs_on_empty_batches_too() -> None:
    calls: list[torch.Tensor] = []
    g = torch.Generator().manual_seed(0)
    preds = _seg_preds(g, 2, 64, 64, 3)
    criterion = SegmentationLoss(3, sum_over_ranks=lambda x: calls.append(x) or x)
    loss, _ = criterion(preds, torch.zeros(0, 6, dtype=torch.float64), torch.zeros(2, 16, 16))
    assert len(calls) == 1 and calls[0][:2].tolist() == [0.0, 0.0] and torch.isfinite(loss)


def test_seg_gain_defaults_to_the_box_gain() -> None:
    g = torch.Generator().manual_seed(2)
    preds = _seg_preds(g, 1, 64, 64, 2)
    targets = random_box_targets(g, [3], 64, 64, 2)
    masks = _overlap_maps(targets, _instance_masks(targets, 16, 16), 1)
    _, items = SegmentationLoss(2, box=2.0)(preds, targets, masks)
    _, halved = SegmentationLoss(2, box=2.0, seg=1.0)(preds, targets, masks)
    torch.testing.assert_close(halved[1], items[1] / 2)
    torch.testing.assert_close(halved[[0, 2, 3]], items[[0, 2, 3]])


def test_bad_inputs_are_named() -> None:
    g = torch.Generator().manual_seed(0)
    preds = _seg_preds(g, 2, 64, 64, 3)
    targets = random_box_targets(g, [2, 1], 64, 64, 3)
    criterion = SegmentationLoss(3)
    good = torch.zeros(2, 16, 16)
    with pytest.raises(
        ValueError, match=r"preds must be the train-mode output \(maps, coefficients, protos\)"
    ):
        criterion(preds[:2], targets, good)
    with pytest.raises(ValueError, match=r"coefficients have shape \(2, 32, 10\)"):
        criterion((preds[0], preds[1][..., :10], preds[2]), targets, good)
    with pytest.raises(ValueError, match=r"protos have shape \(2, 16, 16, 16\)"):
        criterion((preds[0], preds[1], preds[2][:, :16]), targets, good)
    with pytest.raises(
        ValueError, match=r"masks have shape \(3, 16, 16\), expected \(B, H/4, W/4\) index maps"
    ):
        criterion(preds, targets, torch.zeros(3, 16, 16))
    with pytest.raises(
        ValueError, match=r"masks have shape \(2, 16, 16\), expected \(N, H/4, W/4\) per-instance"
    ):
        SegmentationLoss(3, overlap=False)(preds, targets, good)
    wrong = good.clone()
    wrong[1, 3, 3] = 2  # image 1 has one row
    with pytest.raises(ValueError, match=r"masks\[1\] holds index 2 but image 1 has 1 targets rows"):
        criterion(preds, targets, wrong)
    with pytest.raises(ValueError, match=r"targets has shape \(2, 5\)"):
        criterion(preds, torch.zeros(2, 5), good)


def test_mask_dtypes_give_the_same_loss() -> None:
    """uint8, int64, float and bool masks (as a data pipeline may hand them) give identical items."""
    g = torch.Generator().manual_seed(4)
    preds = _seg_preds(g, 2, 64, 64, 3)
    targets = random_box_targets(g, [3, 2], 64, 64, 3)
    instances = _instance_masks(targets, 16, 16)
    maps = _overlap_maps(targets, instances, 2)
    overlap = [SegmentationLoss(3)(preds, targets, m)[1] for m in (maps, maps.long(), maps.float())]
    single = [SegmentationLoss(3, overlap=False)(preds, targets, m)[1] for m in (instances, instances.bool())]
    assert all(torch.equal(overlap[0], o) for o in overlap) and torch.equal(*single)
    assert not torch.equal(overlap[0], single[0])  # the overlap map hides parts of overlapped instances
