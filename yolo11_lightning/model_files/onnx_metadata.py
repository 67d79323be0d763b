"""The metadata an exported file carries (ONNX, TorchScript, OpenVINO), written and read back.

Two sets of keys sit side by side (string key -> string value) in an ONNX file's ``metadata_props``, a
TorchScript file's ``config.txt`` (JSON) and an OpenVINO model's ``metadata.yaml``:

* the reference ecosystem's, as its ONNX loader parses them (``int()`` for ``stride``, ``batch``,
  ``channels``; ``ast.literal_eval`` for ``imgsz``, ``names``, ``args``; ``task`` as is; ``args["dynamic"]``
  decides whether it may feed other input shapes, ``args["nms"]`` whether NMS is inside the graph). Viewers
  and deployment tools that were written for reference exports read the same keys;
* ours, in JSON: ``producer``, ``scale``, ``image_size`` ([H, W] at export), ``class_names`` (a list),
  ``input`` and ``output`` (what the tensors mean).

``read_metadata`` accepts either set, so a reference export of a YOLO11 detector can be validated too.
Imports only the standard library; ``onnx`` / ``onnxruntime`` are imported by the callers.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from yolo11_lightning.tasks import DEFAULT_TASK, TASKS, get_task

PRODUCER = "yolo11_lightning"
INPUT_DOC = "float RGB (B, 3, H, W) in [0, 1], letterboxed with fill 114/255"


def metadata_props(
    *,
    scale: str,
    names: Sequence[str],
    size: tuple[int, int],
    stride: int,
    dynamic: bool,
    opset: int | None,
    version: str,
    task: str = "detect",
    task_props: Mapping[str, str] | None = None,
    half: bool = False,
    int8: bool = False,
) -> dict[str, str]:
    """Every key -> string value for an exported detector or segmenter.

    Args:
        scale: model scale (n, s, m, l, x).
        names: class names, index = class id.
        size: (H, W) the graph was traced at; the only size a fixed-shape file accepts.
        stride: largest stride (32): dynamic inputs must be multiples of it.
        dynamic: height and width are free axes (the batch axis always is).
        opset: ONNX opset of the graph (None: not an ONNX graph).
        version: this package's version.
        task: a task of ``tasks.TASKS``: its ``noun`` describes the model, its ``onnx_output_doc`` the outputs.
        task_props: the task's own keys (``Task.onnx_metadata``: a pose model's keypoint shape).
        half, int8: the weights are stored in float16 / quantized to 8 bits (``args``, as the reference writes).
    """
    spec = get_task(task)  # a clear error naming the known tasks
    kind = spec.noun
    reference_names = {i: str(n) for i, n in enumerate(names)}
    args: dict[str, Any] = {"batch": 1, "dynamic": bool(dynamic), "half": half, "nms": False}
    if int8:
        args["int8"] = True
    if opset is not None:
        args["opset"] = int(opset)
    reference = {
        "description": f"yolo11_lightning YOLO11{scale} {kind}, {len(names)} classes",
        "author": PRODUCER,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "version": version,
        "license": "Apache-2.0",
        "stride": str(int(stride)),
        "task": task,
        # Images per call the reference validator uses when the shape is fixed; the batch axis is dynamic.
        "batch": "1",
        "imgsz": repr([int(size[0]), int(size[1])]),
        "names": repr(reference_names),  # a dict literal: ast.literal_eval gives {0: 'name', ...}
        "args": repr(args),
        "channels": "3",
    }
    ours = {
        "producer": PRODUCER,
        "scale": scale,
        "image_size": json.dumps([int(size[0]), int(size[1])]),
        "class_names": json.dumps([str(n) for n in names]),
        "input": INPUT_DOC,
        "output": spec.onnx_output_doc,
    }
    return {**reference, **dict(task_props or {}), **ours}


# The reference's keys with a value of their own type in a YAML or JSON metadata file (its OpenVINO loader reads
# ``batch`` and ``args`` before any parsing); every other key stays a string.
_INTEGER_KEYS = ("stride", "batch", "channels")
_LITERAL_KEYS = ("imgsz", "names", "args")


def typed_metadata(props: Mapping[str, str]) -> dict[str, Any]:
    """``props`` (``metadata_props``' strings) with the reference's typed keys as ints, lists and dicts: what a
    TorchScript ``config.txt`` or an OpenVINO ``metadata.yaml`` holds. ``read_metadata`` reads either form
    once every value is a string again (``repr`` of the typed ones)."""
    typed: dict[str, Any] = dict(props)
    for key in _INTEGER_KEYS:
        if key in typed:
            typed[key] = int(typed[key])
    task_keys = {key for spec in TASKS.values() for key in spec.option_keys}  # Python literals too
    for key in (*_LITERAL_KEYS, *sorted(task_keys)):
        if key in typed:
            typed[key] = ast.literal_eval(typed[key])
    return typed


@dataclass(frozen=True)
class OnnxModelInfo:
    """What a detector or segmenter ONNX file says about itself.

    ``names`` is None when the file has no class names; ``size`` is the (H, W) of its metadata (the traced
    size); ``stride`` defaults to 32 and ``task`` to ``detect`` when absent.
    """

    names: list[str] | None
    size: tuple[int, int] | None
    stride: int
    task: str
    producer: str | None
    scale: str | None
    # the task's options (``Task.option_keys``, checked by ``Task.options_from``: a pose model's keypoint shape)
    options: dict[str, Any] = field(default_factory=dict)


def _literal(path: Path | str, key: str, value: str) -> Any:
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError) as e:
        raise ValueError(f"{path}: ONNX metadata {key!r} is not a Python literal: {value[:80]!r}") from e


def _names(path: Path | str, props: Mapping[str, str]) -> list[str] | None:
    if "class_names" in props:
        try:
            names = json.loads(props["class_names"])
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: ONNX metadata 'class_names' is not JSON: {e}") from e
        if not isinstance(names, list):
            raise ValueError(
                f"{path}: ONNX metadata 'class_names' must be a list, got {type(names).__name__}"
            )
        return [str(n) for n in names]
    if "names" not in props:
        return None
    names = _literal(path, "names", props["names"])
    if isinstance(names, Mapping):
        keys = sorted(int(k) for k in names)
        if keys != list(range(len(keys))):
            raise ValueError(f"{path}: ONNX metadata 'names' must number classes 0..n-1, got ids {keys[:10]}")
        return [str(names[k]) if k in names else str(names[str(k)]) for k in keys]
    if isinstance(names, list | tuple):
        return [str(n) for n in names]
    raise ValueError(f"{path}: ONNX metadata 'names' must be a dict or a list, got {type(names).__name__}")


def _size(path: Path | str, props: Mapping[str, str]) -> tuple[int, int] | None:
    key = "image_size" if "image_size" in props else "imgsz" if "imgsz" in props else None
    if key is None:
        return None
    value = _literal(path, key, props[key])
    if isinstance(value, int):
        value = [value, value]
    if not (isinstance(value, list | tuple) and len(value) == 2 and all(isinstance(v, int) for v in value)):
        raise ValueError(f"{path}: ONNX metadata {key!r} must be [H, W], got {props[key]!r}")
    return int(value[0]), int(value[1])


def read_metadata(path: Path | str, props: Mapping[str, str]) -> OnnxModelInfo:
    """Parse ``props`` (``metadata_props`` / onnxruntime's ``custom_metadata_map``) of the file at ``path``.

    Raises ValueError naming the file and the key for a value that does not parse.
    """
    stride = props.get("stride", "32")
    try:
        stride_value = int(stride)
    except ValueError as e:
        raise ValueError(f"{path}: ONNX metadata 'stride' must be an integer, got {stride!r}") from e
    task = props.get("task", DEFAULT_TASK)
    return OnnxModelInfo(
        names=_names(path, props),
        size=_size(path, props),
        stride=stride_value,
        task=task,
        producer=props.get("producer"),
        scale=props.get("scale"),
        options=_options(path, props, task),
    )


def _options(path: Path | str, props: Mapping[str, str], task: str) -> dict[str, Any]:
    """The task's options the metadata holds, parsed and checked (none for a task we do not know: the runtime
    refuses it)."""
    spec = TASKS.get(task)
    if spec is None:
        return {}
    values = {key: _literal(path, key, props[key]) for key in spec.option_keys if key in props}
    return spec.options_from(values, f"{path}: ONNX metadata")
