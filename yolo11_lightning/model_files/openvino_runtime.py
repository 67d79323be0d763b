"""Run an exported OpenVINO IR model in place of ``YOLO11`` for validate, test and predict.

The model is ``export.openvino``'s folder ``<stem>_openvino_model/`` holding ``<stem>.xml``, ``<stem>.bin`` and
``metadata.yaml`` (the keys ``model_files.onnx_metadata.metadata_props`` writes, as the reference's loader reads
them); the folder or its ``.xml`` may be named. ``OpenVinoModel`` compiles it for the CPU with float32 inference
precision (an fp16 IR's weights are widened; an INT8 IR runs its quantized layers) and gives what
``YOLO11.eval()`` gives. Imports torch, and openvino when a model is opened (the ``openvino`` extra); never
Lightning.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import yaml

from yolo11_lightning.extras import require
from yolo11_lightning.model_files.exported_model import ExportedModel, existing
from yolo11_lightning.model_files.onnx_metadata import read_metadata
from yolo11_lightning.tasks import DEFAULT_TASK

__all__ = ["OPENVINO_METADATA", "OpenVinoModel", "is_openvino_model", "openvino_xml"]

OPENVINO_METADATA = "metadata.yaml"  # beside the .xml (the reference's name)
OPENVINO_FOLDER_SUFFIX = "_openvino_model"


def is_openvino_model(path: str | os.PathLike | None) -> bool:
    """True for an ``.xml`` path or a folder named ``*_openvino_model`` (it need not exist yet)."""
    if path is None:
        return False
    name = str(path).rstrip("/\\").lower()
    return name.endswith(".xml") or name.endswith(OPENVINO_FOLDER_SUFFIX)


def openvino_xml(path: str | os.PathLike) -> Path:
    """The ``.xml`` of an OpenVINO model given as the file or its folder; FileNotFoundError naming the path."""
    found = existing(path, "OpenVINO model")
    if found.is_dir():
        xmls = sorted(found.glob("*.xml"))
        if len(xmls) != 1:
            raise FileNotFoundError(f"{found}: an OpenVINO model folder holds one .xml, found {len(xmls)}")
        return xmls[0]
    return found


def _dims(shape: Any) -> list[int | str]:
    """An OpenVINO partial shape as ints (static axes) and names (free axes)."""
    return [d.get_length() if d.is_static else f"dim{i}" for i, d in enumerate(shape)]


class OpenVinoModel(ExportedModel):
    """An exported OpenVINO IR model run by the OpenVINO runtime on the CPU (arguments as ``OnnxDetector``'s;
    ``path``: the ``_openvino_model`` folder or its ``.xml``)."""

    runtime: ClassVar[str] = "OpenVINO"

    def __init__(
        self, path: str | os.PathLike, num_classes: int | None = None, task: str | None = DEFAULT_TASK
    ) -> None:
        super().__init__()
        ov = require("openvino", "openvino", f"running {path}")
        xml = openvino_xml(path)
        self.path = Path(path)
        meta = xml.parent / OPENVINO_METADATA
        try:
            props = yaml.safe_load(meta.read_text()) if meta.is_file() else {}
        except yaml.YAMLError as e:
            raise ValueError(f"{meta}: not YAML: {e}") from e
        if not isinstance(props, dict):
            raise ValueError(f"{meta}: expected a mapping of metadata keys")
        info = read_metadata(meta, {str(k): v if isinstance(v, str) else repr(v) for k, v in props.items()})
        core = ov.Core()
        try:
            model = core.read_model(str(xml), str(xml.with_suffix(".bin")))
        except Exception as e:  # openvino raises RuntimeError for unreadable IR
            raise ValueError(f"{xml}: not a readable OpenVINO model ({type(e).__name__}: {e})") from e
        if len(model.inputs) != 1:
            raise ValueError(f"{xml}: expected one input (images), got {len(model.inputs)}")
        in_shape = _dims(model.inputs[0].get_partial_shape())
        out_shapes = [_dims(o.get_partial_shape()) for o in model.outputs]
        order = self._check(info, in_shape, out_shapes, num_classes, task)
        self.__dict__["session"] = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
        self._outputs = [self.session.outputs[i] for i in order]

    def _run(self, images: np.ndarray) -> list[np.ndarray]:
        result = self.session(images)
        return [result[o] for o in self._outputs]
