"""ONNX exports at lower precision: fp16 (weights and activations in half precision) and INT8 (QDQ).

fp16: the weights are stored in float16 and widened where the graph reads them, so the file is half the size and
the arithmetic stays float32 (as OpenVINO's fp16 IR runs on a CPU; a graph computing in float16 moves boxes in
pixels by float16 steps, and ONNX Runtime's CPU kernels are float32 anyway). INT8: the fp32 graph of
``export.onnx`` quantized by ONNX Runtime's static quantization in the QDQ format, weights per channel,
activations calibrated (min-max) on the images it is given (``export.calibration``); the head's last
convolutions and its decode stay in float (``tracing.float_nodes``). Both keep the metadata, with
``args`` saying ``half`` / ``int8``. Imports torch, onnx and onnxruntime (the ``onnx`` extra).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from yolo11_lightning.export.onnx import ONNX_INPUT, export_onnx
from yolo11_lightning.export.tracing import float_nodes, model_metadata
from yolo11_lightning.extras import require
from yolo11_lightning.nn.yolo11 import YOLO11

__all__ = ["export_onnx_fp16", "export_onnx_int8"]


def _set_metadata(path: Path, props: dict[str, str]) -> None:
    onnx = require("onnx", "onnx", "export")
    proto = onnx.load(str(path))
    del proto.metadata_props[:]
    for key, value in props.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    proto.ir_version = min(proto.ir_version, 10)  # newer IR versions are refused by older ONNX Runtimes
    onnx.save(proto, str(path))


def export_onnx_fp16(
    model: YOLO11, path: str | os.PathLike, image_size: tuple[int, int], opset: int = 17
) -> Path:
    """``model`` at ``image_size`` (H, W) to ``path`` with its float weights stored in float16, each widened by a
    ``Cast`` where the graph reads it: half the file, float32 input, arithmetic and outputs."""
    onnx = require("onnx", "onnx", "export")
    from onnx import TensorProto, helper, numpy_helper

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        proto = onnx.load(str(export_onnx(model, Path(tmp) / "fp32.onnx", image_size, opset)))
    graph = proto.graph
    casts, kept = [], []
    for init in graph.initializer:
        if init.data_type != TensorProto.FLOAT:
            kept.append(init)
            continue
        half = numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float16), f"{init.name}_fp16")
        kept.append(half)
        casts.append(
            helper.make_node(
                "Cast", [half.name], [init.name], name=f"{init.name}_widen", to=TensorProto.FLOAT
            )
        )
    del graph.initializer[:]
    graph.initializer.extend(kept)
    nodes = [*casts, *graph.node]
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.save(proto, str(path))
    _set_metadata(path, model_metadata(model, image_size, opset=opset, half=True))
    return path


class _Reader:
    """ONNX Runtime's calibration reader over float32 (N, 3, H, W) images, one image per call."""

    def __init__(self, images: np.ndarray) -> None:
        self.images = iter(list(images))

    def get_next(self) -> dict[str, np.ndarray] | None:
        image = next(self.images, None)
        return None if image is None else {ONNX_INPUT: image[None]}


def export_onnx_int8(
    model: YOLO11,
    path: str | os.PathLike,
    image_size: tuple[int, int],
    calibration: np.ndarray,
    opset: int = 17,
) -> Path:
    """``model`` at ``image_size`` (H, W) quantized to INT8 (QDQ) on the ``calibration`` images, to ``path``."""
    onnx = require("onnx", "onnx", "ONNX INT8 export")
    require("onnxruntime", "onnx", "ONNX INT8 export")
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        fp32 = export_onnx(model, Path(tmp) / "fp32.onnx", image_size, opset)
        prepared = Path(tmp) / "prepared.onnx"
        quant_pre_process(str(fp32), str(prepared), skip_symbolic_shape=True)
        quantize_static(
            str(prepared), str(path), _Reader(calibration), quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=True,
            calibrate_method=CalibrationMethod.MinMax,
            nodes_to_exclude=float_nodes(n.name for n in onnx.load(str(prepared)).graph.node),
        )  # fmt: skip
    _set_metadata(path, model_metadata(model, image_size, opset=opset, int8=True))
    return path
