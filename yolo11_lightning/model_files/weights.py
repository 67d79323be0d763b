"""Model files: every way a YOLO11 is written to or read from disk, in one place.

- the weights-only format (``save_weights``; read by ``load_model``): scale, class count, names, the task
  (absent for detection, ``tasks.DEFAULT_TASK``), the task's options (``Task.model_options``: a pose model's
  keypoint shape), the image size it was
  trained at (absent when unknown, and in files written before it was recorded) and the fp32 state dict,
  plain data that ``torch.load(weights_only=True)`` reads;
- ``load_model`` (also ``yolo11_lightning.load_model``): any model file a user has (a reference ``.pt`` of any
  task or its state dict, a weights-only file, a Lightning ``.ckpt`` of ``YOLO11Module``) as a YOLO11 in eval mode
  with its task, names and the task's options; a reference file's task (and a pose file's keypoint shape) is
  inferred from its tensors by ``model_files.reference``, which receives the expected state dicts from here and never
  builds a model itself;
- ``load_pretrained``: copy a file's tensors into an existing model, refusing weights that do not fit;
- ``file_task``: the task a file holds, from its pickle alone (no tensor read, no model built).

Every file is checked first (``model_files.torch_file``: archive structure, claimed sizes, restricted unpickler); ours
are then read by torch's ``weights_only`` loader, reference files by our restricted one. Imports torch only;
the model class itself does no file I/O.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from yolo11_lightning.errors import UserInputError
from yolo11_lightning.model_files import torch_file
from yolo11_lightning.model_files.reference import (
    WrongTaskError,
    infer_and_map,
    load_reference,
    reference_task,
    rename_key,
    state_task,
)
from yolo11_lightning.model_files.torch_file import CheckpointError
from yolo11_lightning.nn.scales import SCALES
from yolo11_lightning.nn.yolo11 import YOLO11
from yolo11_lightning.tasks import DEFAULT_TASK, create_model, get_task

__all__ = [
    "WEIGHTS_FORMAT",
    "WeightsMismatchError",
    "file_task",
    "load_model",
    "load_pretrained",
    "save_weights",
]

# Tag of a weights-only file (``save_weights``): plain types and tensors, readable with weights_only=True.
WEIGHTS_FORMAT = "yolo11_lightning.weights/1"
_LISTED = 6  # mismatches named in a message
log = logging.getLogger(__name__)


class WeightsMismatchError(UserInputError):
    """Pretrained weights that do not fit the model; the message says what the file holds."""


# -- the weights-only format -------------------------------------------------------------------------------
def write_weights(model: YOLO11, path: str | os.PathLike, image_size: int | None = None) -> None:
    """Write a weights-only file: scale, class count, names, task, the task's options, the trained ``image_size``
    (when known) and the fp32 state dict.

    It holds only strings, ints and tensors, so ``torch.load(path, weights_only=True)`` reads it and no
    code runs on loading; ``load_model`` rebuilds the model without Lightning.
    """
    state = {
        k: (v.float() if v.is_floating_point() else v).detach().cpu() for k, v in model.state_dict().items()
    }
    payload = {
        "format": WEIGHTS_FORMAT,
        "scale": model.scale,
        "num_classes": model.num_classes,
        "names": list(model.names) if model.names is not None else None,
        "state_dict": state,
    }
    if model.task != DEFAULT_TASK:  # a file without a task is a detection one
        payload["task"] = model.task
    payload.update(get_task(model.task).model_options(model))  # a pose model's keypoint shape
    if image_size is not None:  # predict and export default to it (``model_files.image_size``)
        payload["image_size"] = int(image_size)
    torch.save(payload, os.fspath(path))


def save_weights(model: YOLO11, path: str | os.PathLike, image_size: int | None = None) -> Path:
    """Write ``model`` as a weights-only file (``write_weights``), creating its folder; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_weights(model, path, image_size)
    return path


def _weights_model(payload: Mapping[str, Any], path: str) -> YOLO11:
    """Rebuild a model from the loaded contents of a ``save_weights`` file (in train mode, like any new module).

    Raises ValueError naming ``path`` when ``payload`` is not such a weights file.
    """
    found = payload.get("format")
    if found != WEIGHTS_FORMAT:
        raise ValueError(
            f"{path}: not a yolo11_lightning weights file (format {found!r}, expected {WEIGHTS_FORMAT!r}); "
            "any model file loads with yolo11_lightning.load_model"
        )
    task = payload.get("task", DEFAULT_TASK)
    model = create_model(
        payload["scale"], int(payload["num_classes"]), payload.get("names"), task=task,
        **get_task(task).options_from(payload, path),
    )  # fmt: skip
    model.load_state_dict(payload["state_dict"], strict=True)
    return model


# -- reference files ---------------------------------------------------------------------------------------
def _expected_state(
    scale: str, num_classes: int, task: str, options: Mapping[str, Any]
) -> Mapping[str, Tensor]:
    """The state dict (shapes only) of a YOLO11 of ``task`` and its ``options``: what a reference file must map
    onto."""
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        return create_model(scale, num_classes, task=task, **options).state_dict()


def _from_reference(source: str | os.PathLike | Mapping[str, Any], task: str | None = None) -> YOLO11:
    """Build from a reference ``.pt`` file (read without running code from it) or state dict.

    Task, scale and class count are inferred from the tensors, the task's options from the file (a pose model's
    keypoint shape from its head, or from the keypoint outputs' count); weights come back in fp32, ``names`` from
    the file when it has them. With ``task`` a file of another task raises
    WrongTaskError. Like any new module it is in train mode: call ``.eval()`` for decoded predictions.
    Raises ``CheckpointError`` (a ValueError) on anything else.
    """
    file = load_reference(source, task=task)
    ref = infer_and_map(file.state, file.label, _expected_state, SCALES, file.declared)
    if task is not None and ref.task != task:  # a plain state dict: no model class to tell it earlier
        raise WrongTaskError(
            f"{file.label}: holds a {get_task(ref.task).words} model, not a {get_task(task).words} model",
            get_task(ref.task).words,
        )
    model = create_model(ref.scale, ref.num_classes, task=ref.task, **ref.options)
    model.load_state_dict(ref.state, strict=True)
    names = file.names
    model.names = names if names is not None and len(names) == ref.num_classes else None
    return model


# -- any model file ----------------------------------------------------------------------------------------
def _checkpoint_model(path: str, checkpoint: Mapping[str, Any]) -> YOLO11:
    """A YOLO11 from a loaded Lightning checkpoint of ``YOLO11Module`` (EMA weights from ``state_dict``).

    A Lightning checkpoint keeps the EMA weights in ``state_dict`` (``WeightAveraging`` moves the raw ones to
    ``current_model_state``): those averaged weights are what validation scored.
    """
    hparams = checkpoint.get("hyper_parameters") or {}
    state = checkpoint.get("state_dict")
    if not isinstance(state, dict):
        raise ValueError(f"{path}: checkpoint has no `state_dict`")
    ours = {k[len("model.") :]: v for k, v in state.items() if k.startswith("model.")}
    if not ours:
        raise ValueError(f"{path}: no `model.*` tensors in `state_dict`; not a YOLO11Module checkpoint?")
    scale, num_classes, task = hparams.get("scale"), hparams.get("num_classes"), hparams.get("task")
    if scale is None or num_classes is None or task is None:
        raise ValueError(f"{path}: checkpoint hyper_parameters lack `scale`/`num_classes`/`task`")
    model = create_model(
        scale,
        int(num_classes),
        hparams.get("class_names"),
        task=task,
        **get_task(task).options_from(hparams, path),
    )
    model.load_state_dict(ours, strict=True)
    return model


def load_model(source: str | os.PathLike | Mapping[str, Tensor], task: str | None = None) -> YOLO11:
    """Any model file a user has, as a YOLO11 in eval mode on the CPU with its task, names and options.

    * a reference ``.pt`` release file of any task, or a reference state dict (no code from the file runs),
    * a weights-only file from ``export --format weights``,
    * a Lightning ``.ckpt`` of ``YOLO11Module`` (the EMA weights).

    Lightning is not imported. ``task``: the task the caller handles; a file of another task raises
    WrongTaskError (a ValueError) saying what it holds. None (the default) takes the task the file holds
    (``model.task`` tells).

    Raises FileNotFoundError or ValueError naming the file.
    """
    if isinstance(source, Mapping):
        model = _from_reference(source, task=task)
        return model.eval()
    path = os.fspath(source)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"model file not found: {path}")
    try:
        checkpoint = torch_file.load(path)
    except torch_file.ModelObjectsError:  # a reference release pickles model objects: its own reader
        return _from_reference(
            path, task=task
        ).eval()  # raises CheckpointError (a ValueError) naming the file
    if isinstance(checkpoint, dict) and "format" in checkpoint:
        model = _weights_model(checkpoint, path)  # ours, or a ValueError naming the file and its format
    elif isinstance(checkpoint, dict) and "state_dict" in checkpoint:
        model = _checkpoint_model(path, checkpoint)
    else:
        model = _from_reference(path, task=task)  # a plain reference state dict, or a clear error
    if task is not None and model.task != task:
        word = get_task(model.task).words
        raise WrongTaskError(
            f"{path}: holds a {word} model (YOLO11-{model.scale}, {model.num_classes} classes), not a "
            f"{get_task(task).words} model",
            word,
        )
    return model.eval()


def file_task(path: str | os.PathLike) -> str | None:
    """The task a model file holds, read from its pickle only (``torch_file.peek``: no tensor data, no model).

    A weights file's ``task`` (detection when absent), a Lightning checkpoint's ``hyper_parameters["task"]``,
    a reference file's model class or keys (``reference.reference_task``). None when the file says nothing we know, or cannot be
    read: the loader that reads it next reports why.
    """
    try:
        obj = torch_file.peek(path)
    except (OSError, CheckpointError):
        return None
    if isinstance(obj, Mapping) and obj.get("format") == WEIGHTS_FORMAT:
        task = obj.get("task", DEFAULT_TASK)
    elif isinstance(obj, Mapping) and "state_dict" in obj and "hyper_parameters" in obj:
        task = (obj.get("hyper_parameters") or {}).get("task")
    else:
        task = reference_task(obj)
    return task if isinstance(task, str) else None


# -- pretrained weights into an existing model -------------------------------------------------------------
def load_pretrained(
    model: YOLO11,
    path: str | Path,
    strict: bool = True,
    info: Callable[[str], Any] = log.info,
    warn: Callable[[str], Any] = warnings.warn,
) -> tuple[int, list[str]]:
    """Copy the tensors of ``path`` whose name and shape match into ``model``; returns (loaded, not loaded).

    Weights that do not fit are refused rather than half-loaded: a file of another scale shares only the
    BatchNorm counters, box biases and DFL weights with the model, so "something matched" means nothing. What
    must match is every tensor outside the class branch of the head (``Task.class_branch``: ``head.cv3.*``, or the
    classifier's ``head.linear.*``, whose widths follow the class count and which is re-initialised when the count
    differs).

    ``path`` is anything ``load_model`` reads (nothing from the file is executed). With ``strict``
    every tensor outside the class branch must load, else WeightsMismatchError says ``loaded k of n
    tensors``, the scale or task the file seems to hold and the shape mismatches. ``strict=False`` loads
    whatever fits (even from another task's file, layer by layer) and ``warn``s about the rest. ``info``
    receives the summary of a load that fitted (the training side passes Lightning's rank-zero loggers).
    """
    label = os.fspath(path)
    source, held = _source(label, strict, model.task)
    target = model.state_dict()
    matched = {k: v for k, v in source.items() if k in target and v.shape == target[k].shape}
    class_branch = get_task(model.task).class_branch
    outside = [k for k in target if not k.startswith(class_branch)]
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
        warn(f"{summary} (weights_strict off, the rest keeps its initialisation); {detail}")
    skipped = [k for k in target if k not in matched]
    model.load_state_dict({**target, **{k: v.to(target[k].dtype) for k, v in matched.items()}})
    head = [k for k in skipped if k.startswith(class_branch)]
    if not missing:
        reset = f"; class head re-initialised ({len(head)} tensors)" if head else ""
        info(f"{summary} ({held}){reset}")
    return len(matched), skipped


def _source(label: str, strict: bool, task: str) -> tuple[dict[str, Tensor], str]:
    """The file's tensors under our names, and what it holds (``YOLO11-s weights, 80 classes``); a file of
    another task than ``task`` is refused unless not ``strict``."""
    try:
        source = load_model(label, task=task)
    except WrongTaskError as e:
        if strict:
            raise WeightsMismatchError(
                f"cannot start from {e}. Pass --model.weights_strict false to load the layers that fit."
            ) from None
        try:  # a reference file: its layers, matched by name and shape
            state = load_reference(label, any_task=True).state
            head_index = get_task(state_task(state)).head_index
            layers = {rename_key(k, head_index): v for k, v in state.items() if _is_layer_key(k, head_index)}
        except CheckpointError:  # one of ours (weights-only file, checkpoint)
            layers = load_model(label, task=None).state_dict()
        return layers, f"a {e.task} model"
    except CheckpointError as e:
        raise WeightsMismatchError(f"cannot start from {e}") from None
    return source.state_dict(), f"YOLO11-{source.scale} weights, {source.num_classes} classes"


def _is_layer_key(key: str, head_index: int) -> bool:
    parts = key.split(".")
    return len(parts) >= 3 and parts[0] == "model" and parts[1].isdigit() and int(parts[1]) <= head_index


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
