"""PoseLoss: parity with the reference v8PoseLoss (test oracle) in float64, items and gradients, on random and
real-shaped batches (several images, varying instance counts, images without instances, unlabelled keypoints),
an empty batch, world-size invariance of the normalisers, bad inputs."""

from __future__ import annotations

import os
import types

os.environ["YOLO_OFFLINE"] = "1"  # before any ultralytics import

import pytest
import torch
from loss_inputs import random_box_targets, random_head_maps

from yolo11_lightning.tasks.pose.loss import COCO_SIGMAS, PoseLoss

STRIDES = (8, 16, 32)


def _pose_preds(g: torch.Generator, bs: int, height: int, width: int, nc: int, nk: int, dtype=torch.float64):
    """(maps, keypoints (B, K·D, A)) as the train-mode pose head gives them."""
    anchors = sum((height // s) * (width // s) for s in STRIDES)
    raw = (torch.randn(bs, nk, anchors, generator=g, dtype=torch.float64) * 0.5).to(dtype)
    return random_head_maps(g, bs, height, width, nc, dtype), raw


def _keypoints(g: torch.Generator, targets: torch.Tensor, kpt_shape: tuple[int, int]) -> torch.Tensor:
    """(N, K, D) keypoints inside or near each box, normalised; D = 3: visibility 0 (about a quarter), 1 or 2.
    Values are float32 numbers: the oracle reads keypoints in float32."""
    k, d = kpt_shape
    n = targets.shape[0]
    centre, size = targets[:, None, 2:4], targets[:, None, 4:6]
    xy = centre + (torch.rand(n, k, 2, generator=g, dtype=torch.float64) - 0.5) * size * 1.2
    if d == 2:
        return xy.float().double()
    visibility = torch.randint(0, 3, (n, k, 1), generator=g).double() * (
        torch.rand(n, k, 1, generator=g) > 0.25
    )
    xy = torch.where(visibility > 0, xy, 0.0)  # unlabelled keypoints are (0, 0, 0), as in the label files
    return torch.cat((xy, visibility), -1).float().double()


def _reference(preds, targets, keypoints, nc: int, kpt_shape: tuple[int, int]):
    """The oracle's (loss, items) and its gradient of loss.sum() / batch_size, in float64."""
    loss_mod = pytest.importorskip("ultralytics.utils.loss")
    head = types.SimpleNamespace(
        nc=nc,
        reg_max=16,
        no=nc + 64,
        stride=torch.tensor(STRIDES, dtype=torch.float64),
        kpt_shape=list(kpt_shape),
    )
    anchor = torch.nn.Parameter(torch.zeros(1))
    args = types.SimpleNamespace(box=7.5, cls=0.5, dfl=1.5, pose=12.0, kobj=1.0)
    model = types.SimpleNamespace(args=args, model=[head], parameters=lambda: iter([anchor]))
    maps, raw = preds
    leaves = [f.detach().clone().requires_grad_() for f in (*maps, raw)]
    batch = {
        "batch_idx": targets[:, 0],
        "cls": targets[:, 1:2],
        "bboxes": targets[:, 2:],
        "keypoints": keypoints,
    }
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # the oracle builds its buffers in the default dtype
    try:
        loss, items = loss_mod.v8PoseLoss(model)((leaves[:3], leaves[3]), batch)
    finally:
        torch.set_default_dtype(default)
    grads = torch.autograd.grad(loss.sum() / maps[0].shape[0], leaves)
    return loss, items, grads


def _ours(preds, targets, keypoints, nc, kpt_shape, **kwargs):
    maps, raw = preds
    leaves = [f.detach().clone().requires_grad_() for f in (*maps, raw)]
    loss, items = PoseLoss(nc, kpt_shape, **kwargs)((leaves[:3], leaves[3]), targets, keypoints)
    return loss, items, torch.autograd.grad(loss, leaves)


CASES = {  # boxes per image, height, width, classes, kpt_shape
    "coco_persons": ([3, 1], 64, 64, 1, (17, 3)),
    "image_without_instances": ([4, 0, 2], 128, 128, 1, (17, 3)),
    "xy_only_keypoints": ([2, 5], 64, 128, 2, (5, 2)),
    "other_shape_with_visibility": ([0, 3, 6], 64, 96, 3, (4, 3)),
    "crowded": ([25, 10], 128, 128, 2, (17, 3)),
    "empty_batch": ([0, 0], 64, 64, 1, (17, 3)),
}


# A real image size and crowding (marked slow). 512, not 640: the oracle rounds keypoints to float32 before
# scaling them, exact only for power-of-two sizes (at 640 a few gradient entries differ by ~6e-8 absolute).
CASES["real_size_slow"] = ([0, 3, 12, 40], 512, 512, 1, (17, 3))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=pytest.mark.slow) if c.endswith("_slow") else c for c in CASES]
)
def test_loss_matches_reference(case: str, seed: int) -> None:
    counts, height, width, nc, kpt_shape = CASES[case]
    g = torch.Generator().manual_seed(seed)
    preds = _pose_preds(g, len(counts), height, width, nc, kpt_shape[0] * kpt_shape[1])
    targets = random_box_targets(g, counts, height, width, nc)
    keypoints = _keypoints(g, targets, kpt_shape)
    loss, items, grads = _ours(preds, targets, keypoints, nc, kpt_shape)
    assert items.shape == (5,) and loss.ndim == 0 and torch.isfinite(loss)
    if not sum(counts):  # the oracle cannot take an empty keypoint batch; ours: box/pose/kobj/dfl are 0
        assert items[[0, 1, 2, 4]].tolist() == [0, 0, 0, 0] and items[3] > 0
        assert (grads[3] == 0).all()
        return
    ref_loss, ref_items, ref_grads = _reference(preds, targets, keypoints, nc, kpt_shape)
    torch.testing.assert_close(items, ref_items, rtol=1e-6, atol=0)  # box, pose, kobj, cls, dfl
    torch.testing.assert_close(loss, ref_loss.sum() / len(counts), rtol=1e-6, atol=0)
    assert (items > 0).all() if kpt_shape[1] == 3 else (items[[0, 1, 3, 4]] > 0).all()
    for ours, ref in zip(grads, ref_grads):
        torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6 * max(ref.abs().max().item(), 1e-30))
    assert grads[3].abs().sum() > 0  # the keypoint terms reached the keypoint channels


def test_two_value_model_reads_the_batch_visibility_as_the_reference() -> None:
    """A D = 2 model trained on the batch's (N, K, 3) keypoints (the visibility the data derived: 0 for a
    keypoint unlabelled or out of the image) masks those keypoints as the oracle does with the same batch."""
    g = torch.Generator().manual_seed(3)
    counts, height, width, nc = [2, 4], 64, 96, 2
    preds = _pose_preds(g, len(counts), height, width, nc, 5 * 2)
    targets = random_box_targets(g, counts, height, width, nc)
    keypoints = _keypoints(g, targets, (5, 3))
    assert (keypoints[..., 2] == 0).any()
    loss, items, grads = _ours(preds, targets, keypoints, nc, (5, 2))
    ref_loss, ref_items, ref_grads = _reference(preds, targets, keypoints, nc, (5, 2))
    torch.testing.assert_close(items, ref_items, rtol=1e-6, atol=0)
    torch.testing.assert_close(loss, ref_loss.sum() / len(counts), rtol=1e-6, atol=0)
    assert items[2] == 0  # no visibility channel, no visibility term
    for ours, ref in zip(grads, ref_grads):
        torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6 * max(ref.abs().max().item(), 1e-30))
    unmasked, _, _ = _ours(preds, targets, keypoints[..., :2], nc, (5, 2))
    assert unmasked != loss  # the visibility did mask keypoints


def test_sigmas_follow_the_reference_rule() -> None:
    assert PoseLoss(1, (17, 3)).sigmas.tolist() == pytest.approx(list(COCO_SIGMAS))
    assert PoseLoss(1, (17, 2)).sigmas.tolist() == pytest.approx(
        [1 / 17] * 17
    )  # the reference's: (17, 3) only
    assert PoseLoss(1, (5, 3)).sigmas.tolist() == pytest.approx([0.2] * 5)


def test_float32_with_unlabelled_instances_stays_finite() -> None:
    g = torch.Generator().manual_seed(3)
    preds = _pose_preds(g, 3, 64, 64, 1, 51, torch.float32)
    targets = random_box_targets(g, [0, 3, 0], 64, 64, 1).float()
    keypoints = torch.zeros(3, 17, 3)  # boxes whose keypoints are all unlabelled
    leaves = [p.requires_grad_() for p in (*preds[0], preds[1])]
    loss, items = PoseLoss(1)((leaves[:3], leaves[3]), targets, keypoints)
    loss.backward()
    assert torch.isfinite(loss) and loss.dtype == torch.float32 and items[1] == 0 and items[2] > 0
    for leaf in leaves:
        assert leaf.grad is not None and torch.isfinite(leaf.grad).all()


def test_split_batch_with_reduced_normalisers_sums_to_whole_batch_gradient() -> None:
    """Two 'ranks' with half the batch each, both normalisers summed over both: the gradients add up to one
    process holding the whole batch, and every rank logs the whole batch's items."""
    g = torch.Generator().manual_seed(5)
    nc, kpt_shape, counts = 2, (17, 3), [3, 0, 6, 2]
    preds = _pose_preds(g, 4, 64, 96, nc, 51)
    targets = random_box_targets(g, counts, 64, 96, nc)
    keypoints = _keypoints(g, targets, kpt_shape)
    _, whole_items, whole_grads = _ours(preds, targets, keypoints, nc, kpt_shape)
    halves = []
    for lo, hi in ((0, 2), (2, 4)):
        keep = (targets[:, 0] >= lo) & (targets[:, 0] < hi)
        part = targets[keep].clone()
        part[:, 0] -= lo
        halves.append((([m[lo:hi] for m in preds[0]], preds[1][lo:hi]), part, keypoints[keep]))
    seen: list[torch.Tensor] = []
    for p, t, k in halves:
        PoseLoss(nc, kpt_shape, sum_over_ranks=lambda x: seen.append(x) or x)(p, t, k)
    # [Σ target scores, foreground anchors, Σ box, Σ pose, Σ kobj, Σ cls, Σ dfl] of each half
    assert [s.shape for s in seen] == [(7,), (7,)] and seen[0][1] > 0 and seen[1][1] > 0
    grads = []
    for (p, t, k), other in zip(halves, reversed(seen)):
        _, part_items, part_grads = _ours(p, t, k, nc, kpt_shape, sum_over_ranks=lambda x, o=other: x + o)
        torch.testing.assert_close(part_items, whole_items, rtol=1e-10, atol=0)
        grads.append(part_grads)
    for j, whole in enumerate(whole_grads):
        torch.testing.assert_close(torch.cat((grads[0][j], grads[1][j])), whole, rtol=1e-10, atol=1e-14)
    _, _, alone = _ours(*halves[0], nc, kpt_shape)  # without the reduction: its own counts, not the whole's
    assert not torch.allclose(alone[3], whole_grads[3][:2], rtol=1e-3)


def test_bad_inputs_are_named() -> None:
    g = torch.Generator().manual_seed(0)
    preds = _pose_preds(g, 2, 64, 64, 1, 51)
    targets = random_box_targets(g, [2, 1], 64, 64, 1)
    keypoints = torch.zeros(3, 17, 3, dtype=torch.float64)
    with pytest.raises(
        ValueError, match=r"keypoints have shape \(3, 17, 2\), expected \(N, K, D\) = \(3, 17, 3\)"
    ):
        PoseLoss(1)(preds, targets, keypoints[..., :2])
    with pytest.raises(ValueError, match=r"keypoints have shape \(2, 34, 84\), expected \(B, K·D, A\)"):
        PoseLoss(1)((preds[0], preds[1][:, :34]), targets, keypoints)
    with pytest.raises(ValueError, match=r"preds must be the train-mode output \(maps, keypoints\)"):
        PoseLoss(1)(preds[0], targets, keypoints)
    with pytest.raises(ValueError, match=r"kpt_shape must be"):
        PoseLoss(1, (17, 4))
