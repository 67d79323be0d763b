"""Performance switches and fast paths: they must not change the numbers.

channels_last is a YOLO11Module hyper-parameter and compile a machine setting (training.callbacks.machine); the EMA callback's fast update must equal the
reference formula, continue its count after a resume and live on the module's device.
"""

from __future__ import annotations

import math
import types

import lightning as L
import pytest
import torch
from torch import nn

from yolo11_lightning import YOLO11Module, YOLODataModule
from yolo11_lightning.training.callbacks.ema import ModelEMA, ramped_decay
from yolo11_lightning.training.callbacks.machine import MachineSettings


def _batch(seed: int = 0, size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (2, 3, size, size), dtype=torch.uint8, generator=g)
    targets = torch.tensor(
        [[0, 0, 0.5, 0.5, 0.3, 0.4], [0, 2, 0.3, 0.6, 0.2, 0.2], [1, 1, 0.6, 0.4, 0.5, 0.3]]
    )
    return images, targets


def _loss_and_grads(module: YOLO11Module, images: torch.Tensor, targets: torch.Tensor, dtype=torch.float32):
    module.zero_grad(set_to_none=True)
    x = module.model_input(images).to(dtype)  # .to keeps the memory layout
    loss, items = module.criterion(module.model(x), targets.to(dtype))
    loss.backward()
    grads = {n: p.grad.clone() for n, p in module.model.named_parameters() if p.requires_grad}
    return loss.detach(), items, grads


def test_defaults_are_nhwc_without_compile() -> None:
    module = YOLO11Module(scale="n", num_classes=3, log_images=0)
    # compile is a machine setting (training.callbacks.machine), off by default and not a model hparam.
    assert module.hparams.channels_last is True and "compile" not in module.hparams
    assert MachineSettings().compile is False
    assert module.model.layers[0].conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert module.model_input(_batch()[0]).is_contiguous(memory_format=torch.channels_last)


def test_channels_last_off_keeps_nchw() -> None:
    module = YOLO11Module(scale="n", num_classes=3, log_images=0, channels_last=False)
    module.setup("fit")
    assert getattr(module.model, "_compiled_call_impl", None) is None
    assert module.model.layers[0].conv.weight.is_contiguous()  # NCHW
    images = _batch()[0]
    assert module.model_input(images).is_contiguous()
    loader_batch = images.contiguous(memory_format=torch.channels_last)  # how the DataLoader delivers them
    x = module.model_input(loader_batch)
    assert x.is_contiguous() and torch.equal(x, images.float() / 255)


def test_float_images_are_bitwise_the_reference_conversion() -> None:
    images = _batch()[0]
    for layout in (torch.contiguous_format, torch.channels_last):
        x = YOLO11Module.to_float(images.contiguous(memory_format=layout))
        assert x.dtype == torch.float32 and x.is_contiguous(memory_format=layout)
        assert torch.equal(x, images.float() / 255)  # what the reference trainer feeds its model


def test_channels_last_gives_the_same_loss_and_gradients() -> None:
    torch.manual_seed(0)
    plain = YOLO11Module(scale="n", num_classes=3, log_images=0, channels_last=False)
    torch.manual_seed(0)
    nhwc = YOLO11Module(scale="n", num_classes=3, log_images=0, channels_last=True)
    images, targets = _batch()
    x = nhwc.model_input(images)
    assert x.dtype == torch.float32 and x.is_contiguous(memory_format=torch.channels_last)
    weight = nhwc.model.layers[0].conv.weight
    assert weight.is_contiguous(memory_format=torch.channels_last) and not weight.is_contiguous()
    torch.testing.assert_close(x, plain.model_input(images))  # same values, other layout

    loss_a, items_a, _ = _loss_and_grads(plain, images, targets)
    loss_b, items_b, _ = _loss_and_grads(nhwc, images, targets)
    assert loss_a > 0
    torch.testing.assert_close(loss_b, loss_a, rtol=1e-5, atol=0)
    torch.testing.assert_close(items_b, items_a, rtol=1e-5, atol=1e-7)

    # Gradients: in float32 the layouts' different summation orders leave ~1e-4 relative noise (more on
    # gradients that are zero in exact arithmetic), so compare in float64, where only the layout differs.
    plain.double(), nhwc.double()
    assert nhwc.model.layers[0].conv.weight.is_contiguous(memory_format=torch.channels_last)
    loss_a, _, grads_a = _loss_and_grads(plain, images, targets, torch.float64)
    loss_b, _, grads_b = _loss_and_grads(nhwc, images, targets, torch.float64)
    torch.testing.assert_close(loss_b, loss_a, rtol=1e-12, atol=0)
    scale = max(g.abs().max() for g in grads_a.values())
    for name, grad in grads_a.items():
        torch.testing.assert_close(grads_b[name], grad, rtol=1e-9, atol=1e-12 * scale, msg=name)


def test_compile_switch_compiles_the_detector_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def fake_compile(fn, *args, **kwargs):  # record, run eagerly: the wiring is what is tested here
        calls.append(fn)
        return fn

    monkeypatch.setattr(torch, "compile", fake_compile)
    module = YOLO11Module(scale="n", num_classes=3, log_images=0)
    keys = list(module.state_dict())
    settings, trainer = MachineSettings(compile=True), L.Trainer(accelerator="cpu", logger=False)
    settings.on_fit_start(trainer, module)
    settings.setup(trainer, module, "validate")  # a second stage must not compile again
    assert len(calls) == 1 and module.model._compiled_call_impl is not None
    assert list(module.state_dict()) == keys  # checkpoints stay loadable without compile
    out = module.model.eval()(torch.rand(1, 3, 64, 64))
    assert out.shape == (1, 4 + 3, (8 * 8 + 4 * 4 + 2 * 2))


def test_compiled_decode_over_ten_rect_shapes_compiles_three_times_and_matches_eager() -> None:
    """``--machine.compile true`` with rect validation: every batch of another shape must not recompile.

    The anchor cache's key, read inside a compiled graph, became a guard: each new shape recompiled, and after
    8 (dynamo's ``recompile_limit``) the model fell back to eager. Now shapes go dynamic after the first
    recompile per dimension: one static graph, one dynamic in H, one in W, for any number of shapes.
    """
    from yolo11_lightning.nn.head import Detect

    graphs = []

    def count(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(gm)
        return gm.forward

    torch.manual_seed(0)
    head = Detect(2, (4, 4, 4), reg_max=4).eval()
    decode = torch.compile(head.decode, backend=count)
    shapes = [(2 + i % 4, 2 + i // 4) for i in range(10)]  # 10 (H, W) of the P5 map, as rect batches give
    with torch.inference_mode():
        for h, w in shapes:
            maps = [torch.randn(1, head.no, s * h, s * w) for s in (4, 2, 1)]
            torch.testing.assert_close(decode(maps), head.decode(maps))
    assert len(graphs) <= 3, f"{len(graphs)} compiles for {len(shapes)} shapes"


def test_machine_settings_compile_after_the_ema_copy_and_stay_out_of_checkpoints(
    monkeypatch: pytest.MonkeyPatch, tiny_dataset, tmp_path
) -> None:
    """``MachineSettings(compile=True)`` compiles the detector once, at fit start (after Lightning's weight
    averaging copied the plain module), and the checkpoint's hparams do not carry it."""
    calls = []

    def fake_compile(fn, *args, **kwargs):
        calls.append(fn)
        return fn

    monkeypatch.setattr(torch, "compile", fake_compile)
    module = YOLO11Module(scale="n", num_classes=3, log_images=0, warmup_epochs=0.0)
    data = YOLODataModule(str(tiny_dataset), batch_size=8, image_size=64, num_workers=0, pin_memory=False)
    trainer = L.Trainer(
        accelerator="cpu", max_steps=1, limit_val_batches=0, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[MachineSettings(compile=True)],
    )  # fmt: skip
    trainer.fit(module, data)
    assert len(calls) == 1 and module.model._compiled_call_impl is not None
    ema = next(c for c in trainer.callbacks if type(c).__name__ == "ModelEMA")
    assert not getattr(ema._average_model.module.model, "_compiled_call_impl", None)  # the copy is plain
    trainer.save_checkpoint(tmp_path / "run.ckpt")
    saved = torch.load(tmp_path / "run.ckpt", map_location="cpu", weights_only=True)
    assert "compile" not in saved["hyper_parameters"] and "keep_host_memory" not in saved["hyper_parameters"]


# ------------------------------------------------------------------------------------------ EMA
class _Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))


def _perturb(module: _Tiny) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p))
        module.net[1].running_mean.add_(1.0)
        module.net[1].num_batches_tracked.add_(1)


def _ema_for(module: _Tiny, tau: float = 3.0) -> tuple[ModelEMA, types.SimpleNamespace]:
    ema = ModelEMA(decay=0.9999, tau=tau)
    trainer = types.SimpleNamespace(global_step=0)
    ema.setup(trainer, module, "fit")
    ema.on_fit_start(trainer, module)
    return ema, trainer


def _step(ema: ModelEMA, trainer: types.SimpleNamespace, module: _Tiny) -> None:
    trainer.global_step += 1
    ema.on_train_batch_end(trainer, module, None, None, trainer.global_step - 1)


def test_fast_ema_update_follows_reference_formula() -> None:
    torch.manual_seed(0)
    module = _Tiny()
    ema, trainer = _ema_for(module)
    expected = None
    for update in range(1, 6):
        _perturb(module)
        _step(ema, trainer, module)
        current = {k: v.clone() for k, v in module.state_dict().items()}
        if expected is None:
            expected = current  # first update: copy
        else:
            d = 0.9999 * (1 - math.exp(-update / 3.0))
            expected = {
                k: (d * expected[k] + (1 - d) * v) if v.is_floating_point() else v for k, v in current.items()
            }
    averaged = {
        k[len("module.") :]: v for k, v in ema._average_model.state_dict().items() if k != "n_averaged"
    }
    assert averaged.keys() == expected.keys()
    for key, value in averaged.items():
        torch.testing.assert_close(value, expected[key], rtol=1e-6, atol=1e-7)
    assert int(ema._average_model.n_averaged) == 5
    # A repeated call within the same optimiser step (accumulation) must not update again.
    before = ema._average_model.module.net[0].weight.clone()
    _perturb(module)
    ema.on_train_batch_end(trainer, module, None, None, 0)
    torch.testing.assert_close(ema._average_model.module.net[0].weight, before)


def test_fast_ema_continues_the_update_count_after_a_resume() -> None:
    torch.manual_seed(0)
    module = _Tiny()
    ema, trainer = _ema_for(module)
    ema._average_model.n_averaged.fill_(7)  # as restored from a checkpoint after 7 updates
    average_before = ema._average_model.module.net[0].weight.clone()
    _perturb(module)
    _step(ema, trainer, module)
    d = ramped_decay(8, 0.9999, 3.0)
    torch.testing.assert_close(
        ema._average_model.module.net[0].weight, d * average_before + (1 - d) * module.net[0].weight.detach()
    )
    assert int(ema._average_model.n_averaged) == 8


def test_ema_copy_follows_the_module_to_its_device() -> None:
    # Lightning builds the averaged copy in `setup`, before the strategy moves the module; `meta` stands in
    # for the accelerator here.
    module = _Tiny()
    ema = ModelEMA()
    trainer = types.SimpleNamespace(global_step=0)
    ema.setup(trainer, module, "fit")
    module.to("meta")
    ema.on_fit_start(trainer, module)
    assert all(p.device.type == "meta" for p in ema._average_model.parameters())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="host syncs only show on an accelerator")
def test_training_step_and_ema_update_do_not_sync_with_the_host() -> None:
    module = YOLO11Module(scale="n", num_classes=3, log_images=0).cuda()
    images, targets = _batch()
    images, targets = images.cuda(), targets.cuda()
    ema, trainer = _ema_for(module)  # type: ignore[arg-type]
    _step(ema, trainer, module)  # the first update reads the count once
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss, _ = module.criterion(module.model(module.model_input(images)), targets)
        loss.backward()
        _step(ema, trainer, module)
    finally:
        torch.cuda.set_sync_debug_mode("default")
