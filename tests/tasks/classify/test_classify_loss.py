"""ClassificationLoss: the reference's v8ClassificationLoss (mean cross-entropy) in float64, items and gradients,
an empty batch, world-size invariance of the mean."""

from __future__ import annotations

import os

os.environ["YOLO_OFFLINE"] = "1"  # before any ultralytics import

import pytest
import torch

from yolo11_lightning.tasks.classify.loss import ClassificationLoss


def _reference(logits: torch.Tensor, labels: torch.Tensor):
    loss_mod = pytest.importorskip("ultralytics.utils.loss")
    leaf = logits.detach().clone().requires_grad_()
    loss, item = loss_mod.v8ClassificationLoss()(leaf, {"cls": labels})
    return loss, item, torch.autograd.grad(loss, leaf)[0]


def _ours(logits: torch.Tensor, labels: torch.Tensor, **kwargs):
    leaf = logits.detach().clone().requires_grad_()
    loss, items = ClassificationLoss(**kwargs)(leaf, labels)
    return loss, items, torch.autograd.grad(loss, leaf)[0]


@pytest.mark.parametrize(("bs", "nc"), [(1, 2), (7, 10), (64, 1000)])
def test_loss_matches_reference(bs: int, nc: int) -> None:
    g = torch.Generator().manual_seed(bs)
    logits = torch.randn(bs, nc, generator=g, dtype=torch.float64) * 3
    labels = torch.randint(0, nc, (bs,), generator=g)
    ref_loss, ref_item, ref_grad = _reference(logits, labels)
    loss, items, grad = _ours(logits, labels)
    assert items.shape == (1,) and loss.ndim == 0
    torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=0)
    torch.testing.assert_close(items[0], ref_item, rtol=1e-12, atol=0)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=1e-15)


def test_float32_and_empty_batch() -> None:
    logits = torch.randn(0, 5, requires_grad=True)
    loss, items = ClassificationLoss()(logits, torch.zeros(0, dtype=torch.long))
    loss.backward()
    assert loss == 0 and items.tolist() == [0.0] and logits.grad is not None
    with pytest.raises(ValueError, match=r"logits \(4, 5\) and labels \(3,\), expected \(B, nc\) and \(B,\)"):
        ClassificationLoss()(torch.zeros(4, 5), torch.zeros(3, dtype=torch.long))


def test_split_batch_with_reduced_count_sums_to_whole_batch_gradient() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 4, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 4, (6,), generator=g)
    _, whole_items, whole_grad = _ours(logits, labels)
    halves = [
        (logits[:1], labels[:1]),
        (logits[1:], labels[1:]),
    ]  # uneven shares: a mean per rank would differ
    seen: list[torch.Tensor] = []
    for x, y in halves:
        ClassificationLoss(sum_over_ranks=lambda s: seen.append(s) or s)(x, y)
    assert [s.tolist()[0] for s in seen] == [1.0, 5.0]  # [images, Σ cross-entropy] of each
    grads = []
    for (x, y), other in zip(halves, reversed(seen)):
        _, items, grad = _ours(x, y, sum_over_ranks=lambda s, o=other: s + o)
        torch.testing.assert_close(items, whole_items, rtol=1e-12, atol=0)
        grads.append(grad)
    torch.testing.assert_close(torch.cat(grads), whole_grad, rtol=1e-12, atol=1e-15)
