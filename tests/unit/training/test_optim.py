"""Optimiser recipe: parameter groups as the reference, warmup and LR schedule, EMA decay."""

import math
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel

from yolo11_lightning.training.callbacks.ema import ModelEMA, ramped_decay
from yolo11_lightning.training.optim import (
    OptimizerRecipe,
    WarmupSchedule,
    build_optimizer,
    nominal_accumulation,
    parameter_groups,
)

os.environ.setdefault("YOLO_OFFLINE", "1")


def test_parameter_groups_match_reference_trainer() -> None:
    tasks = pytest.importorskip("ultralytics.nn.tasks")
    trainer_mod = pytest.importorskip("ultralytics.engine.trainer")
    model = tasks.DetectionModel("yolo11n.yaml", nc=3, verbose=False)
    fake_trainer = SimpleNamespace(
        args=SimpleNamespace(lr0=0.01, momentum=0.937, warmup_bias_lr=0.1), data={"nc": 3}
    )
    reference = trainer_mod.BaseTrainer.build_optimizer(fake_trainer, model, "SGD", 0.01, 0.937, 5e-4)
    # Reference order: biases, decayed weights, norm weights. Frozen tensors (DFL) never get a gradient.
    ref_groups = [{id(p) for p in g["params"] if p.requires_grad} for g in reference.param_groups]
    biases, norm_weights, weights = parameter_groups(model)
    assert [{id(p) for p in g} for g in (biases, weights, norm_weights)] == ref_groups

    ours = build_optimizer(model, OptimizerRecipe(name="SGD"), global_batch=16)
    assert [g["weight_decay"] for g in ours.param_groups] == [0.0, pytest.approx(5e-4 * 16 * 4 / 64), 0.0]
    assert ours.defaults["nesterov"] is True


@pytest.mark.parametrize(("batch", "accumulate"), [(1, 64), (16, 4), (24, 3), (64, 1), (256, 1)])
def test_nominal_accumulation(batch: int, accumulate: int) -> None:
    assert nominal_accumulation(batch) == accumulate


def test_warmup_ramps_then_follows_linear_schedule() -> None:
    recipe = OptimizerRecipe(lr0=0.01, lrf=0.01, warmup_epochs=3)
    schedule = WarmupSchedule(recipe, max_epochs=100, batches_per_epoch=50)
    assert schedule.warmup_iters == 150  # max(3 * 50, 100)
    lrs, momentum = schedule.values(0, epoch=0, num_groups=3)
    assert lrs == [0.1, 0.0, 0.0] and momentum == pytest.approx(0.8)
    lrs, momentum = schedule.values(75, epoch=1, num_groups=3)  # half-way: means of the end points
    target = 0.01 * schedule.lr_factor(1)
    assert lrs == pytest.approx([(0.1 + target) / 2, target / 2, target / 2])
    assert momentum == pytest.approx((0.8 + 0.937) / 2)
    lrs, momentum = schedule.values(500, epoch=10, num_groups=3)
    assert lrs == pytest.approx([0.01 * (0.9 * 0.99 + 0.01)] * 3) and momentum == 0.937
    assert schedule.lr_factor(100) == pytest.approx(0.01)  # ends at lr0 * lrf


def test_accumulation_ramps_from_one_to_nominal_over_warmup() -> None:
    schedule = WarmupSchedule(OptimizerRecipe(warmup_epochs=1), max_epochs=10, batches_per_epoch=50)
    assert schedule.warmup_iters == 100
    # Global batch 16, nominal 64: 1 at the start, 4 at the end of warmup and after (reference ramp).
    counts = [schedule.accumulation(i, global_batch=16) for i in (0, 10, 50, 90, 100, 101, 5000)]
    assert counts == [1, 1, 2, 4, 4, 4, 4]
    assert schedule.accumulation(0, global_batch=128) == 1 and schedule.accumulation(500, 128) == 1


def test_cosine_schedule_end_points() -> None:
    schedule = WarmupSchedule(OptimizerRecipe(cos_lr=True, lrf=0.05), max_epochs=10, batches_per_epoch=10)
    assert schedule.lr_factor(0) == pytest.approx(1.0)
    assert schedule.lr_factor(5) == pytest.approx((1 + 0.05) / 2)
    assert schedule.lr_factor(10) == pytest.approx(0.05)


def _oracle_optimizer(model: nn.Module, name: str, iterations: int, nc: int = 3, batch: int = 16):
    """The reference trainer's build_optimizer on a stand-in trainer; returns (optimizer, its args)."""
    trainer_mod = pytest.importorskip("ultralytics.engine.trainer")
    args = SimpleNamespace(lr0=0.01, momentum=0.937, warmup_bias_lr=0.1, warmup_momentum=0.8)
    accumulate = max(round(64 / batch), 1)
    decay = 5e-4 * batch * accumulate / 64
    fake = SimpleNamespace(args=args, data={"nc": nc})
    optimizer = trainer_mod.BaseTrainer.build_optimizer(fake, model, name, 0.01, 0.937, decay, iterations)
    return optimizer, args


def _reference_warmup(optimizer, args, ni: int, nw: int, lf: float) -> None:
    """The reference trainer's per-batch warmup (engine/trainer.py, _do_train), written out."""
    for j, group in enumerate(optimizer.param_groups):
        group["lr"] = np.interp(
            ni, [0, nw], [args.warmup_bias_lr if j == 0 else 0.0, group["initial_lr"] * lf]
        )
        if "momentum" in group:
            group["momentum"] = np.interp(ni, [0, nw], [args.warmup_momentum, args.momentum])


@pytest.mark.parametrize(("iterations", "expected"), [(500, "AdamW"), (10_000, "AdamW"), (10_001, "SGD")])
def test_auto_optimizer_is_the_reference_choice_through_warmup(iterations: int, expected: str) -> None:
    """Same optimiser class, LR, momentum/betas, group decays and bias warmup as the oracle, step by step."""
    tasks = pytest.importorskip("ultralytics.nn.tasks")
    model = tasks.DetectionModel("yolo11n.yaml", nc=3, verbose=False)
    reference, ref_args = _oracle_optimizer(model, "auto", iterations)
    recipe = OptimizerRecipe().resolve(global_batch=16, num_classes=3, total_iterations=iterations)
    ours = build_optimizer(model, recipe, global_batch=16)
    assert type(ours) is type(reference) and type(ours).__name__ == recipe.name == expected
    assert recipe.warmup_bias_lr == ref_args.warmup_bias_lr == 0.0
    keys = ("lr", "weight_decay", "momentum", "betas", "nesterov")
    settings = lambda opt: [{k: g.get(k) for k in keys} for g in opt.param_groups]  # noqa: E731
    assert settings(ours) == settings(reference)
    # Warmup of 100 batches (epoch 0 of 10), then the schedule: identical groups at every batch.
    for group in reference.param_groups:
        group["initial_lr"] = group["lr"]
    schedule = WarmupSchedule(recipe, max_epochs=10, batches_per_epoch=20)
    for ni in range(130):
        epoch = ni // 20
        if ni <= schedule.warmup_iters:
            _reference_warmup(reference, ref_args, ni, schedule.warmup_iters, 1 - epoch / 10 * 0.99)
        else:  # after warmup the reference's LambdaLR sets lr0 * lf(epoch) and leaves momentum alone
            for group in reference.param_groups:
                group["lr"] = group["initial_lr"] * (1 - epoch / 10 * 0.99)
        schedule.apply(ours, ni, epoch)
        for mine, theirs in zip(ours.param_groups, reference.param_groups):
            assert mine["lr"] == pytest.approx(theirs["lr"], rel=1e-12, abs=1e-15), ni
            assert mine.get("momentum") == pytest.approx(theirs.get("momentum")), ni
            assert mine.get("betas") == theirs.get("betas"), ni


def test_explicit_adamw_keeps_its_betas_as_the_reference() -> None:
    recipe = OptimizerRecipe(name="AdamW", lr0=0.001).resolve(16, 3, 0)
    optimizer = build_optimizer(nn.Linear(2, 2), recipe, 16)
    WarmupSchedule(recipe, 10, 20).apply(optimizer, 5, 0)
    assert all(g["betas"] == (0.937, 0.999) for g in optimizer.param_groups)


def test_recipe_survives_a_checkpoint_round_trip() -> None:
    recipe = OptimizerRecipe().resolve(global_batch=16, num_classes=5, total_iterations=20_000)
    restored = OptimizerRecipe.from_state_dict({**recipe.state_dict(), "unknown_future_key": 1})
    assert restored == recipe and restored.warmup_target_momentum == 0.937


def test_unresolved_auto_cannot_build() -> None:
    with pytest.raises(ValueError, match="resolved first"):
        build_optimizer(nn.Linear(2, 2), OptimizerRecipe(), 16)


def test_recipe_resolution_auto_and_lr_scaling() -> None:
    short = OptimizerRecipe(name="auto").resolve(global_batch=16, num_classes=3, total_iterations=500)
    assert (short.name, short.lr0, short.warmup_bias_lr) == ("AdamW", round(0.002 * 5 / 7, 6), 0.0)
    long = OptimizerRecipe(name="auto").resolve(global_batch=16, num_classes=3, total_iterations=20_000)
    assert (long.name, long.lr0, long.momentum, long.warmup_bias_lr) == ("SGD", 0.01, 0.9, 0.0)
    assert OptimizerRecipe(name="SGD", lr_scaling="linear").resolve(256, 3, 0).lr0 == pytest.approx(0.04)
    assert OptimizerRecipe(name="SGD", lr_scaling="sqrt").resolve(256, 3, 0).lr0 == pytest.approx(0.02)


def test_ema_follows_reference_formula() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    ema = AveragedModel(model, multi_avg_fn=ModelEMA(decay=0.9999, tau=3.0)._blend, use_buffers=True)
    expected = None
    for update in range(1, 6):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
            model[1].running_mean.add_(1.0)
            model[1].num_batches_tracked.add_(1)
        ema.update_parameters(model)
        current = {k: v.clone() for k, v in model.state_dict().items()}
        if expected is None:
            expected = current  # first update: copy
        else:
            d = 0.9999 * (1 - math.exp(-update / 3.0))
            expected = {
                k: (d * expected[k] + (1 - d) * v) if v.is_floating_point() else v for k, v in current.items()
            }
    for key, value in ema.module.state_dict().items():
        torch.testing.assert_close(value, expected[key], rtol=1e-6, atol=1e-7)
    assert ramped_decay(10_000) == pytest.approx(0.9999 * (1 - math.exp(-5)))
