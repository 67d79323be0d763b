"""The reference loop recipe callback (training/callbacks/recipe.py): its state, and checkpoints from before it."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch

from yolo11_lightning.training.callbacks.checkpoints import LastCheckpoint
from yolo11_lightning.training.callbacks.recipe import LoopRecipe
from yolo11_lightning.training.datamodule import YOLODataModule
from yolo11_lightning.training.module import YOLO11Module


def test_last_step_index_round_trips_through_the_callback_state() -> None:
    recipe = LoopRecipe()
    recipe.last_step_index = 41
    restored = LoopRecipe()
    restored.load_state_dict(recipe.state_dict())
    assert restored.last_step_index == 41


def test_the_module_hands_lightning_its_recipe_callback() -> None:
    module = YOLO11Module(scale="n", num_classes=2, log_images=0, ema=False)

    class FakeTrainer:
        class state:
            fn = "fit"

    module._trainer = FakeTrainer()  # type: ignore[assignment]
    callbacks = module.configure_callbacks()
    assert module.loop_recipe in callbacks


# ------------------------------------------------------------------ windows across epoch boundaries
def _fit(dataset: Path, root: Path, max_epochs: int, ckpt_path: str | None = None, stop_after: int = 0):
    """16 images, global batch 4, nominal batch 12: 4 batches per epoch, a window of 3 (not a divisor)."""
    L.seed_everything(0, workers=True)
    module = YOLO11Module(
        scale="n", num_classes=3, optimizer="SGD", warmup_epochs=0.0, nominal_batch=12, log_images=0
    )
    data = YOLODataModule(
        str(dataset), batch_size=4, image_size=64, num_workers=0, pin_memory=False, close_mosaic=0
    )
    callbacks: list[L.Callback] = [LastCheckpoint(dirpath=str(root))]
    if stop_after:
        callbacks.append(_StopAfterEpochs(stop_after))
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=max_epochs, logger=False, limit_val_batches=0, callbacks=callbacks,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(root),
    )  # fmt: skip
    trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
    return trainer, module


class _StopAfterEpochs(L.Callback):
    def __init__(self, epochs: int) -> None:
        self.epochs = epochs

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch + 1 >= self.epochs:
            trainer.should_stop = True


def test_windows_carry_over_epoch_ends_and_resume_exactly_from_an_epoch_end(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    """The reference steps after global batches 2 and 5 of 8 (windows of 3, one open at each epoch end);
    Lightning alone would step 4 times. Cut at the end of epoch 0, with a window of 1 batch open, the
    resumed run ends in the uninterrupted run's state."""
    whole, whole_module = _fit(tiny_dataset, tmp_path / "whole", max_epochs=2)
    assert whole.global_step == 2

    cut, _ = _fit(tiny_dataset, tmp_path / "cut", max_epochs=2, stop_after=1)
    assert cut.global_step == 1
    saved = torch.load(tmp_path / "cut" / "last.ckpt", map_location="cpu", weights_only=True)
    assert saved["carried_gradients"], "the open window's gradient must be in the epoch-end checkpoint"
    assert saved["callbacks"]["LoopRecipe"]["last_step_index"] == 2

    resumed, resumed_module = _fit(
        tiny_dataset, tmp_path / "resumed", max_epochs=2, ckpt_path=str(tmp_path / "cut" / "last.ckpt")
    )
    assert resumed.global_step == 2
    for (name, a), b in zip(whole_module.state_dict().items(), resumed_module.state_dict().values()):
        assert torch.allclose(a.float(), b.float(), rtol=1e-5, atol=1e-6), name


def test_a_non_finite_loss_in_a_carried_window_survives_a_checkpoint() -> None:
    from yolo11_lightning.training.nonfinite_steps import NonFiniteStepGuard

    guard = NonFiniteStepGuard(max_consecutive=5)
    guard.observe(torch.tensor([1.0, float("nan")]))  # the window is still open at the epoch end
    resumed = NonFiniteStepGuard(max_consecutive=5)
    resumed.load_state_dict(guard.state_dict())
    assert resumed.should_skip() and resumed.skipped == 1
    clean = NonFiniteStepGuard()
    clean.load_state_dict({"skipped": 2, "consecutive": 0})  # a checkpoint from before the flag
    assert not clean.should_skip() and clean.skipped == 2
