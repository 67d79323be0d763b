"""Decide which dataset splits a stage reads, and refuse a dataset without them, naming what to do.

fit trains on ``train`` and validates on ``val``; validate reads ``val``, test ``test``; predict reads ``test``,
else ``val``. A missing split is an error, not a fall-back: numbers reported as test results must come from the
test split.
"""

from __future__ import annotations

from yolo11_lightning.data.sources.config import MissingSplitError


def stage_splits(stage: str | None, has_test: bool) -> list[tuple[str, bool]]:
    """(split, augmented) of the datasets ``stage`` builds; an unknown stage or None builds fit's."""
    wanted = {
        "fit": [("train", True), ("val", False)],
        "validate": [("val", False)],
        "test": [("test", False)],
        "predict": [("test" if has_test else "val", False)],
    }
    return wanted.get(stage, wanted["fit"]) if stage else wanted["fit"]


def split_of(key: str, has_test: bool) -> str:
    """The split a dataset key reads (``predict`` reads test, else val)."""
    return ("test" if has_test else "val") if key == "predict" else key


def check_stage_splits(stage: str | None, defined: list[str], name: str) -> None:
    """Raise MissingSplitError when ``defined`` (the splits dataset ``name`` has) lacks one that ``stage`` reads,
    naming the splits it has and what to do."""
    have = f"defined: {', '.join(defined) or 'none'}"
    if stage == "predict":
        if not {"test", "val"} & set(defined):
            raise MissingSplitError(
                f"{name} has neither a `test` nor a `val` split ({have}); predict reads test, else val: "
                "add one of them to the yaml, or use `predict --source <images>`"
            )
        return
    wanted = {"validate": ["val"], "test": ["test"]}.get(stage or "fit", ["train", "val"])
    missing = next((split for split in wanted if split not in defined), None)
    if missing is None:
        return
    other = {"val": "test", "test": "val"}.get(missing)  # the other evaluation split, and its command
    if stage == "fit" and missing == "val":
        hint = "fit validates on it after each epoch: add `val:` to the yaml"
    elif stage in ("validate", "test") and other in defined:
        command = "validate" if other == "val" else "test"
        hint = f"use `{command}` to evaluate on {other}, or add `{missing}:` to the yaml"
    else:
        hint = f"add `{missing}:` to the yaml"
    raise MissingSplitError(f"{name} has no `{missing}` split ({have}); {hint}")
