"""Reading reference (Ultralytics) YOLO11 checkpoints without the reference package.

A reference ``.pt`` is a ``torch.save``d dict whose ``model``/``ema`` entry is a pickled model of its task
(``DetectionModel``, ``SegmentationModel``, ``PoseModel``, ``OBBModel``, ``ClassificationModel``: each task's
``Task.reference_class``) in fp16. We read it with ``torch_file.load_reference`` (checked archive, restricted
unpickler: reference classes become inert stand-ins, any other global is refused), walk the stand-ins'
``_modules``/``_parameters``/``_buffers`` to rebuild the state dict (keys ``model.<layer>.<path>``) and read the
plain values the model carries (``names``, and the task options its modules set: ``Task.option_keys``); infer
task, scale, class count (and the task's options, ``Task.options_from``) from the tensors (``Task.matches_reference``) and rename the keys to ours (``layers.<i>.`` before
the task's head, ``head.`` for it: ``Task.head_index``, 23, or 10 for classification). The model's expected state
dicts come from the caller (``model_files.weights``): this module does not import the model.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from torch import Tensor

from yolo11_lightning.model_files import torch_file
from yolo11_lightning.model_files.safe_pickle import StandIn
from yolo11_lightning.model_files.torch_file import CheckpointError
from yolo11_lightning.tasks import DEFAULT_TASK, TASKS, get_task
from yolo11_lightning.tasks.base.model import TaskModel

__all__ = [
    "CheckpointError",
    "Reference",
    "ReferenceModel",
    "WrongTaskError",
    "infer_and_map",
    "load_reference",
    "reference_task",
    "rename_key",
    "state_task",
]

_MAX_MODULES = 100_000  # a real model has a few hundred; more means a crafted file
# the module attributes that hold a task's options (a pose head's keypoint shape): ``Task.option_keys``
_OPTION_KEYS = tuple(dict.fromkeys(key for task in TASKS.values() for key in task.option_keys))
# Reference model classes of other model families (their files may share the backbone, not the head).
_OTHER_FAMILIES = {
    "WorldModel": "open-vocabulary (YOLO-World)",
    "YOLOEModel": "open-vocabulary (YOLOE)",
    "RTDETRDetectionModel": "RT-DETR",
}


class ReferenceModel(NamedTuple):
    """What a reference file holds: its state dict (keys ``model.<i>...``), class names (or None), a label for
    errors (the file and entry), and the task options its modules declare (``Task.option_keys``, unchecked: the
    first value of each in the walk; a pose head's keypoint shape)."""

    state: dict[str, Tensor]
    names: list[str] | None
    label: str
    declared: dict[str, Any]


class Reference(NamedTuple):
    """A reference state dict understood: scale, class count, task, the task's options (``create_model``'s
    keywords: a pose model's keypoint shape) and the tensors under our keys in fp32 (``infer_and_map``)."""

    scale: str
    num_classes: int
    task: str
    options: dict[str, Any]
    state: dict[str, Tensor]


class WrongTaskError(CheckpointError):
    """A reference file of another task (segmentation, classification, ...); ``task`` names it."""

    def __init__(self, message: str, task: str) -> None:
        super().__init__(message)
        self.task = task


def load_reference(
    source: str | os.PathLike | Mapping[str, Any], any_task: bool = False, task: str | None = None
) -> ReferenceModel:
    """The reference file's (or loaded dict's) state dict, class names, label and declared task options.

    A pickled model of a family we do not read (RT-DETR, YOLO-World, ...), or of another task than ``task`` when
    it is given, raises WrongTaskError unless ``any_task``.
    """
    if isinstance(source, Mapping):
        return _extract(source, "state dict", any_task, task)
    label = os.fspath(source)
    if not os.path.isfile(label):
        raise CheckpointError(f"{label}: no such checkpoint file")
    obj = torch_file.load_reference(label)  # CheckpointError naming the file: unsafe, truncated, ...
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"{label}: expected a dict, the file holds a {type(obj).__name__}")
    return _extract(obj, label, any_task, task)


def _extract(
    obj: Mapping[str, Any], label: str, any_task: bool = False, wanted: str | None = None
) -> ReferenceModel:
    """Find the model in a loaded checkpoint dict (``ema`` first, as the reference does) or accept a
    plain state dict."""
    if "ema" in obj or "model" in obj:
        entry_name = "ema" if obj.get("ema") is not None else "model"
        entry = obj.get(entry_name)
        if isinstance(entry, StandIn):
            cls_name = entry.qualname.rpartition(".")[2]
            task = _OTHER_FAMILIES.get(cls_name)
            ours = next((t for t in TASKS.values() if t.reference_class == cls_name), None)
            if ours is not None and wanted is not None and ours.name != wanted:
                task = ours.words
            if task is not None and not any_task:
                raise WrongTaskError(
                    f"{label}: holds a {task} model ({entry.qualname}), {_not_a(wanted)}", task
                )
            state, names, declared = _walk_module(entry, f"{label}['{entry_name}']")
            return ReferenceModel(state, names, f"{label}['{entry_name}'] ({entry.qualname})", declared)
        if isinstance(entry, Mapping):
            where = f"{label}['{entry_name}']"
            return ReferenceModel(_tensor_dict(entry, where), None, where, {})
        raise CheckpointError(
            f"{label}: entry {entry_name!r} is a {type(entry).__name__}, not a pickled model or state dict"
        )
    return ReferenceModel(_tensor_dict(obj, label), None, label, {})


def reference_task(obj: Any) -> str | None:
    """The task name of a reference checkpoint object (as ``torch_file.peek`` or ``load_reference`` return it):
    from its pickled model class, or for a plain state dict from the keys (``state_task``). None when it says
    nothing we know (another model family, or not a reference checkpoint)."""
    if not isinstance(obj, Mapping):
        return None
    entry = obj.get("ema") if obj.get("ema") is not None else obj.get("model", obj)
    if isinstance(entry, StandIn):
        cls_name = entry.qualname.rpartition(".")[2]
        return next((t.name for t in TASKS.values() if t.reference_class == cls_name), None)
    if not isinstance(entry, Mapping) or not any(str(k).startswith("model.") for k in entry):
        return None
    return state_task(entry)


def state_task(state: Mapping[str, Any]) -> str:
    """The task of a reference state dict from its keys: the first task in registry order that claims it
    (``Task.matches_reference``), else detection."""
    return next((t.name for t in TASKS.values() if t.matches_reference(state)), DEFAULT_TASK)


def _not_a(wanted: str | None) -> str:
    """The tail of a wrong-task message: what was wanted and which file to use."""
    files = {t.name: f"yolo11n{t.model_suffix}.pt" for t in TASKS.values()}
    if wanted is None:
        words = " or ".join(t.words for t in TASKS.values())
        return f"not a {words} model; use a {words} file ({', '.join(files.values())})"
    word = get_task(wanted).words
    others = [f for name, f in files.items() if name != wanted]
    return f"not a {word} model; use a {word} file ({files[wanted]}, not {' or '.join(others)})"


def _tensor_dict(obj: Mapping[str, Any], label: str) -> dict[str, Tensor]:
    bad = [k for k, v in obj.items() if not isinstance(k, str) or not isinstance(v, Tensor)]
    if bad:
        raise CheckpointError(
            f"{label}: not a state dict: entry {bad[0]!r} is a {type(obj[bad[0]]).__name__}, not a tensor"
        )
    return dict(obj)


def _walk_module(root: StandIn, label: str) -> tuple[dict[str, Tensor], list[str] | None, dict[str, Any]]:
    """State dict of a pickled nn.Module stand-in tree, its ``names`` attribute as a list, and the first value
    of each task option (``Task.option_keys``) a module of it sets (a pose head's keypoint shape)."""
    if not isinstance(root.state, dict) or "_modules" not in root.state:
        raise CheckpointError(f"{label}: {root.qualname} is not a pickled torch module")
    out: dict[str, Tensor] = {}
    stack: list[tuple[str, Any]] = [("", root)]
    seen = 0
    declared: dict[str, Any] = {}
    while stack:
        prefix, module = stack.pop()
        seen += 1
        if seen > _MAX_MODULES:
            raise CheckpointError(f"{label}: more than {_MAX_MODULES} modules, not a YOLO11 model")
        state = module.state if isinstance(module, StandIn) else None
        if not isinstance(state, dict):
            raise CheckpointError(
                f"{label}: submodule {prefix.rstrip('.') or '<root>'} is not a pickled module"
            )
        for key in _OPTION_KEYS:
            if key not in declared and state.get(key) is not None:
                declared[key] = state[key]
        skip = state.get("_non_persistent_buffers_set") or set()
        for group in ("_parameters", "_buffers"):
            for name, value in (state.get(group) or {}).items():
                if value is None or (group == "_buffers" and name in skip):
                    continue
                if not isinstance(value, Tensor):
                    raise CheckpointError(
                        f"{label}: {prefix}{name} is a {type(value).__name__}, not a tensor"
                    )
                out[f"{prefix}{name}"] = value
        children = [(f"{prefix}{name}.", child) for name, child in (state.get("_modules") or {}).items()]
        stack.extend(c for c in reversed(children) if c[1] is not None)
    return out, _names(root.state.get("names")), declared


def _names(names: Any) -> list[str] | None:
    """Reference names are {index: name}; a list[str] when the indices are exactly 0..n-1."""
    if isinstance(names, Mapping) and sorted(names) == list(range(len(names))):
        names = [names[i] for i in range(len(names))]
    if isinstance(names, (list, tuple)) and names and all(isinstance(n, str) for n in names):
        return list(names)
    return None


def rename_key(key: str, head_index: int = 23) -> str:
    """``model.<i>.<path>`` -> ``layers.<i>.<path>``, or ``head.<path>`` for the head (layer ``head_index``)."""
    _, index, rest = key.split(".", 2)
    return f"head.{rest}" if int(index) == head_index else f"layers.{index}.{rest}"


def infer_and_map(
    state: Mapping[str, Tensor],
    label: str,
    expected_state: Callable[[str, int, str, Mapping[str, Any]], Mapping[str, Tensor]],
    scales: Iterable[str],
    declared: Mapping[str, Any] | None = None,
) -> Reference:
    """Infer (scale, num_classes, task, options) from a reference state dict and return them with it under our
    keys, in fp32. The task is ``state_task``'s; the class count the first dimension of the task's ``class_key``;
    the task's options those the file ``declared`` (``Task.options_from``; one that does not hold is not taken),
    else what the tensors imply (a pose model's keypoint shape from its keypoint outputs).

    ``expected_state(scale, num_classes, task, options)`` is the state dict (shapes only: meta tensors do) the
    model of that scale expects, the ``checkpoint_filter_fn(state_dict, model)`` pattern of timm: the reader checks
    the file against what the model needs without building one, so this module never imports the model.
    """
    keys = list(state)
    ref_keys = [k for k in keys if k.startswith("model.") and k.split(".")[1].isdigit() and k.count(".") >= 2]
    if not ref_keys or len(ref_keys) != len(keys):
        odd = next((k for k in keys if k not in set(ref_keys)), None) if ref_keys else keys[:3]
        raise CheckpointError(
            f"{label}: not a reference YOLO state dict: expected only 'model.<layer>.*' keys, found {odd!r}"
        )
    task = state_task(state)
    spec = get_task(task)
    cls_key, stem_key = _reference_key(spec.class_key, spec), "model.0.conv.weight"
    for key, ndim in ((cls_key, 4 if spec.has_neck else 2), (stem_key, 4)):
        if key not in state or state[key].ndim != ndim:
            raise CheckpointError(
                f"{label}: not a YOLO11 {spec.words} checkpoint: no {ndim}-d tensor {key!r}"
            )
    nc = int(state[cls_key].shape[0])
    ours = {rename_key(k, spec.head_index): v for k, v in state.items()}
    try:
        options = spec.options_from(declared or {}, label, ours)
    except ValueError:  # a declared value that does not hold: the tensors tell
        options = spec.options_from({}, label, ours)
    problems: list[str] = []
    for scale in scales:
        expected = expected_state(scale, nc, task, options)
        if expected["layers.0.conv.weight"].shape != state[stem_key].shape:
            continue
        problems = _compare(expected, ours, spec)
        if not problems:
            fp32 = {k: v.float() if v.is_floating_point() else v for k, v in ours.items()}
            return Reference(scale, nc, task, options, fp32)
        problems = [f"scale {scale}: {p}" for p in problems]
    detail = "; ".join(problems[:4]) if problems else f"stem width {state[stem_key].shape[0]} fits no scale"
    raise CheckpointError(f"{label}: not a YOLO11 {spec.words} checkpoint (nc={nc}): {detail}")


def _compare(expected: Mapping[str, Tensor], got: Mapping[str, Tensor], spec: TaskModel) -> list[str]:
    """Up to six differences between our expected state dict and a renamed one, named in the file's keys."""
    ref_name = {k: _reference_key(k, spec) for k in (*expected, *got)}
    missing = [ref_name[k] for k in expected if k not in got]
    extra = [ref_name[k] for k in got if k not in expected]
    shapes = [
        f"{ref_name[k]!r} is {tuple(got[k].shape)}, expected {tuple(v.shape)}"
        for k, v in expected.items()
        if k in got and got[k].shape != v.shape
    ]
    out = [f"missing key {k!r}" for k in missing[:2]] + [f"unexpected key {k!r}" for k in extra[:2]]
    return out + shapes[:2]


def _reference_key(key: str, spec: TaskModel) -> str:
    """Inverse of ``rename_key`` for ``spec``'s network."""
    if key.startswith("head."):
        return f"model.{spec.head_index}.{key[5:]}"
    return f"model.{key[len('layers.') :]}"
