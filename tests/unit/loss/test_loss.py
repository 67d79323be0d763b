"""DetectionLoss: parity with the reference v8DetectionLoss (test oracle), empty batches, world-size invariance."""

from __future__ import annotations

import os
import types

import pytest
import torch
from loss_inputs import STRIDES, random_box_targets, random_head_maps

from yolo11_lightning.loss import DetectionLoss

os.environ["YOLO_OFFLINE"] = "1"  # before any ultralytics import


def _reference(feats: list[torch.Tensor], targets: torch.Tensor, nc: int):
    """The oracle's (loss, items) and its gradient of loss.sum() / batch_size, all in float64."""
    loss_mod = pytest.importorskip("ultralytics.utils.loss")
    head = types.SimpleNamespace(
        nc=nc, reg_max=16, no=nc + 64, stride=torch.tensor(STRIDES, dtype=torch.float64)
    )
    anchor = torch.nn.Parameter(torch.zeros(1))
    model = types.SimpleNamespace(
        args=types.SimpleNamespace(box=7.5, cls=0.5, dfl=1.5), model=[head], parameters=lambda: iter([anchor])
    )
    leaves = [f.detach().clone().requires_grad_() for f in feats]
    batch = {"batch_idx": targets[:, 0], "cls": targets[:, 1:2], "bboxes": targets[:, 2:]}
    default = torch.get_default_dtype()
    torch.set_default_dtype(
        torch.float64
    )  # the oracle builds its target and loss buffers in the default dtype
    try:
        loss, items = loss_mod.v8DetectionLoss(model)(leaves, batch)
    finally:
        torch.set_default_dtype(default)
    grads = torch.autograd.grad(loss.sum() / feats[0].shape[0], leaves)
    return loss, items, grads


def _ours(feats: list[torch.Tensor], targets: torch.Tensor, nc: int, **kwargs):
    leaves = [f.detach().clone().requires_grad_() for f in feats]
    loss, items = DetectionLoss(nc, **kwargs)(leaves, targets)
    return loss, items, torch.autograd.grad(loss, leaves)


CASES = {  # boxes per image, height, width, classes
    "empty_batch": ([0, 0], 64, 96, 3),
    "image_without_boxes": ([4, 0, 2], 128, 128, 5),
    "one_box": ([1], 128, 160, 4),
    "crowded_200": ([200, 3], 256, 320, 6),
    "non_square": ([9, 5, 14], 256, 320, 80),
}


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("case", list(CASES))
def test_loss_matches_reference(case: str, seed: int) -> None:
    counts, height, width, nc = CASES[case]
    g = torch.Generator().manual_seed(seed)
    feats, targets = (
        random_head_maps(g, len(counts), height, width, nc),
        random_box_targets(g, counts, height, width, nc),
    )
    ref_loss, ref_items, ref_grads = _reference(feats, targets, nc)
    loss, items, grads = _ours(feats, targets, nc)

    assert items.shape == (3,) and loss.ndim == 0
    torch.testing.assert_close(items, ref_items, rtol=1e-6, atol=0)  # box, cls, dfl each
    torch.testing.assert_close(loss, ref_loss.sum() / len(counts), rtol=1e-6, atol=0)
    if sum(counts):
        assert (items > 0).all()
    for ours, ref in zip(grads, ref_grads):
        torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6 * ref.abs().max().item())


@pytest.mark.parametrize("counts", [[0, 0, 0], [0, 3, 0]])
def test_images_without_boxes_give_finite_loss_and_no_box_terms(counts: list[int]) -> None:
    g = torch.Generator().manual_seed(0)
    feats, targets = (
        random_head_maps(g, 3, 64, 64, 2, torch.float32),
        random_box_targets(g, counts, 64, 64, 2),
    )
    leaves = [f.requires_grad_() for f in feats]
    loss, items = DetectionLoss(2)(leaves, targets.float())
    loss.backward()
    assert torch.isfinite(loss) and loss.dtype == torch.float32
    if not sum(counts):
        assert items[0] == 0 and items[2] == 0 and items[1] > 0
    for f in leaves:
        assert torch.isfinite(f.grad).all()
        assert f.grad[:, 64:].abs().sum() > 0  # the class logits of every image learn "no object"
    empty = [i for i, n in enumerate(counts) if n == 0]
    # Box channels of images without boxes get exactly zero gradient (but are in the graph: DDP-safe).
    assert all((f.grad[empty, :64] == 0).all() for f in leaves)


def _local_summary(feats: list[torch.Tensor], targets: torch.Tensor, nc: int) -> torch.Tensor:
    """What a rank hands to sum_over_ranks: [Σ of its target scores, its gained box, cls and dfl sums]."""
    seen: list[torch.Tensor] = []
    DetectionLoss(nc, sum_over_ranks=lambda x: seen.append(x) or x)(feats, targets)
    assert len(seen) == 1 and seen[0].shape == (4,)
    return seen[0]


def test_split_batch_with_reduced_normaliser_sums_to_whole_batch_gradient() -> None:
    """Two 'ranks' holding half the batch each, normaliser summed over both: gradients add up to one process."""
    g = torch.Generator().manual_seed(5)
    nc, counts = 4, [3, 0, 6, 2]
    feats, targets = random_head_maps(g, 4, 128, 96, nc), random_box_targets(g, counts, 128, 96, nc)
    _, whole_items, whole_grads = _ours(feats, targets, nc)

    halves = []
    for lo, hi in ((0, 2), (2, 4)):
        part = targets[(targets[:, 0] >= lo) & (targets[:, 0] < hi)].clone()
        part[:, 0] -= lo
        halves.append(([f[lo:hi] for f in feats], part))
    own = [_local_summary(f, t, nc) for f, t in halves]
    assert min(o[0] for o in own) > 0 and own[0][0] + own[1][0] > 1  # the reduction matters (not the floor)

    grads = []
    for (f, t), other in zip(halves, reversed(own)):
        _, part_items, part_grads = _ours(f, t, nc, sum_over_ranks=lambda x, other=other: x + other)
        # Items come from the summed term sums: each 'rank' logs the whole batch's.
        torch.testing.assert_close(part_items, whole_items, rtol=1e-10, atol=0)
        grads.append(part_grads)
    for level, whole in enumerate(whole_grads):
        torch.testing.assert_close(
            torch.cat((grads[0][level], grads[1][level])), whole, rtol=1e-10, atol=1e-14
        )

    # Without the reduction each half normalises by its own sum: not the whole-batch gradient.
    _, _, alone = _ours(*halves[0], nc)
    assert not torch.allclose(alone[0], whole_grads[0][:2], rtol=1e-3)


def test_sum_over_ranks_runs_on_empty_batches_too() -> None:
    """Every rank must join the collective, whatever its batch holds."""
    g = torch.Generator().manual_seed(0)
    calls: list[torch.Tensor] = []
    two = torch.tensor([2.0, 0.0, 0.0, 0.0])  # another rank's summary: Σ target scores 2, nothing else
    criterion = DetectionLoss(3, sum_over_ranks=lambda x: calls.append(x) or x + two)
    loss, _ = criterion(random_head_maps(g, 2, 64, 64, 3), random_box_targets(g, [0, 0], 64, 64, 3))
    assert len(calls) == 1 and calls[0][0] == 0
    plain_loss, _ = DetectionLoss(3)(
        random_head_maps(torch.Generator().manual_seed(0), 2, 64, 64, 3), torch.zeros(0, 6)
    )
    torch.testing.assert_close(loss, plain_loss / 2.0)  # normaliser max(0 + 2, 1) = 2 instead of 1


def test_low_precision_inputs_are_computed_in_float32() -> None:
    g = torch.Generator().manual_seed(1)
    feats, targets = (
        random_head_maps(g, 2, 64, 96, 3, torch.bfloat16),
        random_box_targets(g, [3, 1], 64, 96, 3),
    )
    loss, items = DetectionLoss(3)(feats, targets.float())
    _, ref_items = DetectionLoss(3)([f.float() for f in feats], targets.float())
    assert loss.dtype == torch.float32
    torch.testing.assert_close(items, ref_items)


def test_bad_inputs_are_named() -> None:
    criterion = DetectionLoss(3)
    feats = [torch.zeros(1, 67, 64 // s, 64 // s) for s in (1, 2, 4)]  # a 512 px input, 3 classes
    with pytest.raises(ValueError, match=r"feats\[1\] has shape"):
        criterion([feats[0], torch.zeros(1, 66, 4, 4), feats[2]], torch.zeros(0, 6))
    with pytest.raises(ValueError, match="got 2 feature maps"):
        criterion(feats[:2], torch.zeros(0, 6))
    with pytest.raises(ValueError, match=r"targets has shape \(4, 5\)"):
        criterion(feats, torch.zeros(4, 5))
    row = [[0.0, 1.0, 0.5, 0.5, 0.2, 0.2]]
    with pytest.raises(
        ValueError, match=r"targets\[1, 1\] \(class\) is 3.0, expected an integer in \[0, 3\)"
    ):
        criterion(feats, torch.tensor([*row, [0.0, 3.0, 0.5, 0.5, 0.2, 0.2]]))
    with pytest.raises(ValueError, match=r"targets\[0, 0\] \(image_index\) is 1.0"):
        criterion(feats, torch.tensor([[1.0, 0.0, 0.5, 0.5, 0.2, 0.2]]))
