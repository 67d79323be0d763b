"""OpenVINO IR export of a ``YOLO11``: fp32, fp16 (weights stored in half precision) or INT8 (NNCF).

The model is converted from the ONNX graph ``export.onnx`` writes (fixed image size, free batch axis) by
``openvino.convert_model`` and saved as ``<stem>.xml`` + ``<stem>.bin`` in the folder ``<stem>_openvino_model/``
with ``metadata.yaml`` beside them (``onnx_metadata.metadata_props``' keys), the layout the reference's OpenVINO
loader reads; our runtime is ``model_files.openvino_runtime``. INT8 is NNCF's post-training quantization
calibrated on the images it is given (``export.calibration``), the head's last convolutions and its decode
left in float (``tracing.float_nodes``). Imports torch, openvino (the ``openvino``
extra) and nncf for INT8 (the ``int8`` extra).
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import numpy as np
import yaml

from yolo11_lightning.export.onnx import export_onnx
from yolo11_lightning.export.tracing import float_nodes, model_metadata
from yolo11_lightning.extras import require
from yolo11_lightning.model_files.onnx_metadata import typed_metadata
from yolo11_lightning.model_files.openvino_runtime import OPENVINO_METADATA
from yolo11_lightning.nn.yolo11 import YOLO11

__all__ = ["export_openvino"]


def export_openvino(
    model: YOLO11,
    folder: str | os.PathLike,
    image_size: tuple[int, int],
    half: bool = False,
    calibration: np.ndarray | None = None,
) -> Path:
    """Write ``model`` as OpenVINO IR into ``folder`` (named ``<stem>_openvino_model``); returns the folder.

    ``half``: weights stored in float16. ``calibration``: float32 (N, 3, H, W) images; given, the model is
    quantized to INT8 by NNCF on them."""
    ov = require("openvino", "openvino", "export --format openvino")
    nncf = require("nncf", "int8", "OpenVINO INT8 export") if calibration is not None else None
    folder = Path(folder)
    stem = folder.name.removesuffix("_openvino_model") or "model"
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = export_onnx(model, Path(tmp) / f"{stem}.onnx", image_size)
        converted = ov.convert_model(str(onnx_path))
    if nncf is not None:
        nncf.set_log_level(logging.ERROR)  # its per-node INFO lines would bury the command's output
        dataset = nncf.Dataset(list(calibration), lambda image: image[None])
        kept = float_nodes(op.get_friendly_name() for op in converted.get_ops())
        converted = nncf.quantize(
            converted, dataset, preset=nncf.QuantizationPreset.MIXED, subset_size=len(calibration),
            ignored_scope=nncf.IgnoredScope(names=kept, validate=False),
        )  # fmt: skip
    xml = folder / f"{stem}.xml"
    ov.save_model(converted, str(xml), compress_to_fp16=half)
    metadata = typed_metadata(model_metadata(model, image_size, half=half, int8=calibration is not None))
    (folder / OPENVINO_METADATA).write_text(yaml.safe_dump(metadata, sort_keys=False))
    return folder
