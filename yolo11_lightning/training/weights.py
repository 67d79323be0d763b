"""Start a model from pretrained weights: a reference ``.pt``, one of our checkpoints, or a weights file.

Weights that do not fit are refused rather than half-loaded: a file of another scale shares only the
BatchNorm counters, box biases and DFL weights with the model, so "something matched" means nothing. What
must match is every tensor outside the class branch of the head (``head.cv3.*``, whose widths follow the
class count and which is re-initialised when the count differs).
"""

from __future__ import annotations

import os
from pathlib import Path

from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor

from yolo11_lightning.export import load_model
from yolo11_lightning.nn import YOLO11
from yolo11_lightning.nn.checkpoint import HEAD_INDEX, WrongTaskError, load_reference, rename_key
from yolo11_lightning.nn.torch_file import CheckpointError

CLASS_HEAD = "head.cv3."  # the class branch: its widths depend on the class count
_LISTED = 6  # mismatches named in a message


class WeightsMismatchError(ValueError):
    """Pretrained weights that do not fit the model; the message says what the file holds."""


def load_pretrained(model: YOLO11, path: str | Path, strict: bool = True) -> tuple[int, list[str]]:
    """Copy the tensors of ``path`` whose name and shape match into ``model``; returns (loaded, not loaded).

    ``path`` is anything ``export.load_model`` reads (nothing from the file is executed). With ``strict``
    every tensor outside the class branch must load, else WeightsMismatchError says ``loaded k of n
    tensors``, the scale or task the file seems to hold and the shape mismatches. ``strict=False`` loads
    whatever fits (even from another task's file, layer by layer) and warns about the rest.
    """
    label = os.fspath(path)
    source, held = _source(label, strict)
    target = model.state_dict()
    matched = {k: v for k, v in source.items() if k in target and v.shape == target[k].shape}
    outside = [k for k in target if not k.startswith(CLASS_HEAD)]
    missing = [k for k in outside if k not in matched]
    mismatched = [
        f"{k} {tuple(source[k].shape)} vs {tuple(target[k].shape)}"
        for k in outside
        if k in source and k not in matched
    ]
    summary = f"{label}: loaded {len(matched)} of {len(target)} tensors into YOLO11-{model.scale}"
    if missing:
        detail = _detail(held, model, missing, mismatched)
        if strict:
            raise WeightsMismatchError(
                f"{summary}; {detail}. Pass --model.weights_strict false to load only the tensors that fit."
            )
        rank_zero_warn(f"{summary} (weights_strict off, the rest keeps its initialisation); {detail}")
    skipped = [k for k in target if k not in matched]
    model.load_state_dict({**target, **{k: v.to(target[k].dtype) for k, v in matched.items()}})
    head = [k for k in skipped if k.startswith(CLASS_HEAD)]
    if not missing:
        reset = f"; class head re-initialised ({len(head)} tensors)" if head else ""
        rank_zero_info(f"{summary} ({held}){reset}")  # shown by default, unlike a module logger's info
    return len(matched), skipped


def _source(label: str, strict: bool) -> tuple[dict[str, Tensor], str]:
    """The file's tensors under our names, and what it holds (``YOLO11-s weights, 80 classes``)."""
    try:
        source = load_model(label)
    except WrongTaskError as e:
        if strict:
            raise WeightsMismatchError(
                f"cannot start from {e}. Pass --model.weights_strict false to load the layers that fit."
            ) from None
        state, _, _ = load_reference(label, any_task=True)  # its layers, matched by name and shape
        return {rename_key(k): v for k, v in state.items() if _is_layer_key(k)}, f"a {e.task} model"
    except CheckpointError as e:
        raise WeightsMismatchError(f"cannot start from {e}") from None
    return source.state_dict(), f"YOLO11-{source.scale} weights, {source.num_classes} classes"


def _is_layer_key(key: str) -> bool:
    parts = key.split(".")
    return len(parts) >= 3 and parts[0] == "model" and parts[1].isdigit() and int(parts[1]) <= HEAD_INDEX


def _detail(held: str, model: YOLO11, missing: list[str], mismatched: list[str]) -> str:
    scale = held.split(" ")[0].removeprefix("YOLO11-") if held.startswith("YOLO11-") else None
    if scale is not None and scale != model.scale:
        reason = f"the file holds {held}, the model is YOLO11-{model.scale} (use --model.scale {scale})"
    else:
        reason = f"the file holds {held}"
    shapes = (
        f"; shape mismatches outside the class head: {', '.join(mismatched[:_LISTED])}" if mismatched else ""
    )
    more = f" (+{len(mismatched) - _LISTED} more)" if len(mismatched) > _LISTED else ""
    absent = len(missing) - len(mismatched)
    gone = f"; {absent} tensors missing from the file, e.g. {missing[0]}" if absent and not mismatched else ""
    return reason + shapes + more + gone
