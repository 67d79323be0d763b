"""ONNX export of a ``YOLO11``, and its parity with PyTorch under ONNX Runtime.

Input ``images`` float (B, 3, H, W) RGB in [0, 1]; output ``output0`` (B, 4 + nc, A), xywh boxes in input pixels
then class scores (no NMS), exactly ``YOLO11.eval()``'s output. A segmentation model has two outputs,
``output0`` (B, 4 + nc + 32, A) (each anchor's 32 mask coefficients after the scores) and ``output1`` the
prototypes (B, 32, H/4, W/4), and the metadata says ``task: segment``. The batch axis is dynamic; the image size
is fixed at export (the anchor grid becomes constants) unless ``dynamic=True``, which makes height and width
free axes (multiples of 32; the anchor grid is then computed in the graph). The metadata (``model_files.onnx_metadata``)
holds the keys the reference's ONNX loader reads, beside ours, so its ``YOLO("model.onnx", task="detect")``
predicts and validates the file. Imports torch, onnx when exporting and onnxruntime when checking (the ``onnx``
extra: ``extras.require``), never Lightning.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import torch

from yolo11_lightning.export.tracing import cpu_eval_copy, eval_outputs, model_metadata
from yolo11_lightning.extras import require
from yolo11_lightning.nn.yolo11 import YOLO11
from yolo11_lightning.tasks import get_task

__all__ = [
    "ONNX_INPUT",
    "export_onnx",
    "onnx_max_abs_diff",
    "onnx_output_diffs",
    "onnx_output_names",
    "onnx_tolerance",
]

ONNX_INPUT = "images"


def onnx_output_names(model: YOLO11) -> list[str]:
    """The model's task's outputs (``Task.onnx_outputs``): ``["output0"]`` for a detector, ``["output0",
    "output1"]`` (predictions, prototypes) for a segmenter."""
    return list(get_task(model.task).onnx_outputs)


def export_onnx(
    model: YOLO11,
    path: str | os.PathLike,
    image_size: int | tuple[int, int] = 640,
    opset: int = 17,
    dynamic: bool = False,
) -> Path:
    """Export ``model`` (eval mode) to ONNX with a dynamic batch axis, traced at ``image_size`` (S or (H, W)).

    ``dynamic``: height and width become free axes too (any multiple of 32); otherwise the file accepts only
    ``image_size``. Uses the TorchScript-based exporter, which needs the ``onnx`` package (the ``onnx`` extra;
    without it ``extras.MissingExtraError`` says so in one line), and writes the metadata
    (``model_files.onnx_metadata.metadata_props``). A float32 CPU copy is traced: ``model`` keeps its device, dtype and mode.
    """
    require("onnx", "onnx", "export")  # before tracing: torch's exporter fails late, in a long traceback
    height, width = (image_size, image_size) if isinstance(image_size, int) else image_size
    model = cpu_eval_copy(model)
    model.check_input(torch.zeros(1, 3, height, width, device="meta"))  # clear error for a bad size
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    dummy = torch.zeros(1, 3, height, width)
    outputs = onnx_output_names(model)
    output_axes = get_task(model.task).onnx_output_axes(dynamic)
    axes = {ONNX_INPUT: {0: "batch", 2: "height", 3: "width"} if dynamic else {0: "batch"}}
    axes.update(zip(outputs, output_axes))
    with warnings.catch_warnings():
        # Expected: the legacy exporter announces its deprecation, and the tracer notes that shape checks (and,
        # at a fixed size, the anchor grid) become constants, which is what tracing at one size means.
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
        torch.onnx.export(
            model,
            (dummy,),
            str(path),
            dynamo=False,
            input_names=[ONNX_INPUT],
            output_names=outputs,
            dynamic_axes=axes,
            opset_version=opset,
            do_constant_folding=True,
        )
    _add_metadata(path, model, (height, width), dynamic, opset)
    return path


def _add_metadata(path: Path, model: YOLO11, size: tuple[int, int], dynamic: bool, opset: int) -> None:
    onnx = require("onnx", "onnx", "export")
    proto = onnx.load(str(path))
    for key, value in model_metadata(model, size, dynamic, opset).items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    # Shape inference leaves the channel axes (4 + nc [+ 32], 32) and the spatial ones symbolic; all are known
    # except those of a file with free height and width.
    known = get_task(model.task).onnx_output_dims(model, size, dynamic)
    for output, axes in zip(proto.graph.output, known):
        dims = output.type.tensor_type.shape.dim
        for axis, value in axes.items():
            dims[axis].ClearField("dim_param")
            dims[axis].dim_value = value
    proto.ir_version = min(proto.ir_version, 10)  # newer IR versions are refused by older ONNX Runtimes
    onnx.save(proto, str(path))


def onnx_max_abs_diff(model: YOLO11, onnx_path: str | os.PathLike, images: torch.Tensor) -> float:
    """Largest |ONNX Runtime - PyTorch| over the eval outputs (both, for a segmenter) for float ``images``
    (B, 3, H, W)."""
    return max(onnx_output_diffs(model, onnx_path, images).values())


def onnx_output_diffs(model: YOLO11, onnx_path: str | os.PathLike, images: torch.Tensor) -> dict[str, float]:
    """Output name -> largest |ONNX Runtime - PyTorch| of that output for float ``images`` (B, 3, H, W).

    Raises ValueError naming the file when its outputs differ in number or shape from the model's.
    """
    ort = require("onnxruntime", "onnx", "the ONNX parity check")
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    expected = [t.numpy() for t in eval_outputs(model, images)]
    names = [o.name for o in session.get_outputs()]
    if len(names) != len(expected):
        raise ValueError(f"{onnx_path}: {len(names)} outputs {names}, PyTorch gives {len(expected)}")
    got = session.run(names, {ONNX_INPUT: images.float().cpu().numpy()})
    diffs = {}
    for name, a, b in zip(names, got, expected):
        if a.shape != b.shape:
            raise ValueError(f"{onnx_path}: output {name} shape {a.shape} differs from PyTorch's {b.shape}")
        diffs[name] = float(np.abs(a - b).max())
    return diffs


def onnx_tolerance(model: YOLO11, images: torch.Tensor) -> float:
    """Allowed parity gap: 1e-4 plus a few float32 steps of the largest output (boxes are in pixels, and at
    640 px one float32 step is already 6e-5), times the task's ``onnx_tolerance_gain``."""
    largest = max(float(t.abs().max()) for t in eval_outputs(model, images))
    return (1e-4 + 1e-6 * largest) * get_task(model.task).onnx_tolerance_gain
