"""The export formats: each one's name, file suffix, precision, the extra that installs it and what runs it.

``yolo11-lightning export --format F`` and ``benchmark`` take these names. A format's file is written by its own
module (``export.onnx``, ``export.onnx_precision``, ``export.torchscript``, ``export.openvino``,
``export.executorch``) and run by its
runtime in ``model_files`` (``exported_files.open_exported`` picks it from the file name). ``export_file`` writes
one; an INT8 format needs calibration images (``export.calibration``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from yolo11_lightning.errors import UserInputError
from yolo11_lightning.export.executorch import export_executorch
from yolo11_lightning.export.onnx import export_onnx
from yolo11_lightning.export.onnx_precision import export_onnx_fp16, export_onnx_int8
from yolo11_lightning.export.openvino import export_openvino
from yolo11_lightning.export.torchscript import export_torchscript
from yolo11_lightning.extras import MissingExtraError, require
from yolo11_lightning.nn.yolo11 import YOLO11

__all__ = ["FORMATS", "ExportFormat", "export_file", "get_format", "missing_extra", "output_path"]


@dataclass(frozen=True)
class ExportFormat:
    """One export format.

    ``suffix`` follows the checkpoint's stem in the default output name (a folder for OpenVINO); ``needs``: the
    packages exporting it imports, installed by ``extra`` (which installs its runtime too); ``runtime``: what runs
    the file."""

    name: str
    suffix: str
    precision: str  # fp32, fp16 or int8
    runtime: str
    extra: str
    needs: tuple[str, ...]
    write: Callable[..., Path]

    @property
    def calibrated(self) -> bool:
        """INT8: quantized on calibration images of a dataset's training split."""
        return self.precision == "int8"


def _onnx(model: YOLO11, path: Path, size: tuple[int, int], opset: int, dynamic: bool, calibration) -> Path:
    return export_onnx(model, path, size, opset, dynamic)


def _onnx_fp16(
    model: YOLO11, path: Path, size: tuple[int, int], opset: int, dynamic: bool, calibration
) -> Path:
    return export_onnx_fp16(model, path, size, opset)


def _onnx_int8(
    model: YOLO11, path: Path, size: tuple[int, int], opset: int, dynamic: bool, calibration
) -> Path:
    return export_onnx_int8(model, path, size, calibration, opset)


def _torchscript(
    model: YOLO11, path: Path, size: tuple[int, int], opset: int, dynamic: bool, calibration
) -> Path:
    return export_torchscript(model, path, size)


def _executorch(
    model: YOLO11, path: Path, size: tuple[int, int], opset: int, dynamic: bool, calibration
) -> Path:
    return export_executorch(model, path, size)


def _openvino(half: bool) -> Callable[..., Path]:
    def write(
        model: YOLO11, path: Path, size: tuple[int, int], opset: int, dynamic: bool, calibration
    ) -> Path:
        return export_openvino(model, path, size, half=half, calibration=calibration)

    return write


FORMATS: dict[str, ExportFormat] = {
    f.name: f
    for f in (
        ExportFormat("onnx", ".onnx", "fp32", "ONNX Runtime", "onnx", ("onnx",), _onnx),
        ExportFormat("onnx-fp16", "_fp16.onnx", "fp16", "ONNX Runtime", "onnx", ("onnx",), _onnx_fp16),
        ExportFormat("onnx-int8", "_int8.onnx", "int8", "ONNX Runtime", "onnx", ("onnx",), _onnx_int8),
        ExportFormat("torchscript", ".torchscript", "fp32", "TorchScript", "", (), _torchscript),
        ExportFormat(
            "openvino", "_openvino_model", "fp32", "OpenVINO", "openvino", ("onnx", "openvino"), _openvino(False)
        ),
        ExportFormat(
            "openvino-fp16", "_fp16_openvino_model", "fp16", "OpenVINO", "openvino", ("onnx", "openvino"),
            _openvino(True),
        ),
        ExportFormat(
            "openvino-int8", "_int8_openvino_model", "int8", "OpenVINO", "int8", ("onnx", "openvino", "nncf"),
            _openvino(False),
        ),
        ExportFormat(
            "executorch", ".pte", "fp32", "ExecuTorch (XNNPACK)", "executorch", ("executorch",), _executorch
        ),
    )
}  # fmt: skip


def get_format(name: str) -> ExportFormat:
    """The format called ``name``; UserInputError listing the known ones in one line otherwise."""
    if name not in FORMATS:
        raise UserInputError(f"unknown export format {name!r}; known: {', '.join(FORMATS)}, weights")
    return FORMATS[name]


def missing_extra(fmt: ExportFormat) -> str | None:
    """None when every package exporting to ``fmt`` needs imports, else the one line that names the extra."""
    for module in fmt.needs:
        try:
            require(module, fmt.extra, "export")
        except MissingExtraError as e:
            return str(e)
    return None


def output_path(fmt: ExportFormat, source: str | os.PathLike) -> Path:
    """Where ``fmt``'s file of the model in ``source`` goes by default: beside it, ``<stem><suffix>``."""
    source = Path(source)
    return source.with_name(source.stem + fmt.suffix)


def export_file(
    fmt: ExportFormat,
    model: YOLO11,
    path: str | os.PathLike,
    size: tuple[int, int],
    opset: int = 17,
    dynamic: bool = False,
    calibration: np.ndarray | None = None,
) -> Path:
    """Write ``model`` at ``size`` (H, W) as ``fmt`` to ``path``; ``calibration`` images (N, 3, H, W) for INT8.

    Raises MissingExtraError (one line naming the extra) when a package it needs is not installed."""
    problem = missing_extra(fmt)
    if problem is not None:
        raise MissingExtraError(problem)
    if dynamic and fmt.name != "onnx":
        raise UserInputError(f"--dynamic is for --format onnx; a {fmt.name} file takes its export size only")
    if fmt.calibrated and (calibration is None or not len(calibration)):
        raise UserInputError(f"--format {fmt.name} needs calibration images (--calibration-data DATA_YAML)")
    return fmt.write(model, Path(path), size, opset, dynamic, calibration if fmt.calibrated else None)
