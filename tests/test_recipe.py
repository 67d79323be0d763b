"""The reference loop recipe callback (training/recipe.py): its state, and checkpoints from before it."""

from __future__ import annotations

from yolo11_lightning.training.module import YOLO11Module
from yolo11_lightning.training.recipe import ReferenceRecipe


def test_last_step_index_round_trips_through_the_callback_state() -> None:
    recipe = ReferenceRecipe()
    recipe.last_step_index = 41
    restored = ReferenceRecipe()
    restored.load_state_dict(recipe.state_dict())
    assert restored.last_step_index == 41


def test_checkpoints_from_before_the_callback_keep_their_accumulation_window() -> None:
    recipe = ReferenceRecipe()
    recipe.on_load_checkpoint(None, None, {"last_step_batch_index": 17})  # type: ignore[arg-type]
    assert recipe.last_step_index == 17
    recipe.on_load_checkpoint(None, None, {})  # type: ignore[arg-type]  # a new checkpoint: state rules
    assert recipe.last_step_index == 17


def test_the_module_hands_lightning_its_recipe_callback() -> None:
    module = YOLO11Module(scale="n", num_classes=2, log_images=0, ema=False)

    class FakeTrainer:
        class state:
            fn = "fit"

    module._trainer = FakeTrainer()  # type: ignore[assignment]
    callbacks = module.configure_callbacks()
    assert module.loop_recipe in callbacks
