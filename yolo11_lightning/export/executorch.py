"""ExecuTorch export of a ``YOLO11``: a ``.pte`` program whose graph runs on the XNNPACK delegate (fp32).

``torch.export`` of the float32 eval model at one image size and batch 1, lowered with the XNNPACK partitioner
(``to_edge_transform_and_lower``) and serialized (``to_executorch``). The program has two methods: ``forward``
((1, 3, H, W) RGB in [0, 1] -> ``YOLO11.eval()``'s outputs) and ``metadata``, a constant method returning the
JSON of ``onnx_metadata.metadata_props``' keys (typed as in a TorchScript ``config.txt``), so the one file
carries its task, names, image size, stride and the task's options. Our runtime is
``model_files.executorch_runtime``. Imports torch, and executorch when a file is written (the ``executorch``
extra).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from yolo11_lightning.export.tracing import cpu_eval_copy, model_metadata
from yolo11_lightning.extras import require
from yolo11_lightning.model_files.executorch_runtime import EXECUTORCH_METADATA
from yolo11_lightning.model_files.onnx_metadata import typed_metadata
from yolo11_lightning.nn.yolo11 import YOLO11

__all__ = ["export_executorch"]


def export_executorch(model: YOLO11, path: str | os.PathLike, image_size: tuple[int, int]) -> Path:
    """Export ``model`` (a float32 CPU copy) at ``image_size`` (H, W), batch 1, to the ExecuTorch program
    ``path`` with its graph delegated to XNNPACK and its metadata as the constant method ``metadata``."""
    exir = require("executorch.exir", "executorch", "export")
    xnnpack = require("executorch.backends.xnnpack.partition.xnnpack_partitioner", "executorch", "export")
    height, width = image_size
    model = cpu_eval_copy(model)
    model.check_input(torch.zeros(1, 3, height, width, device="meta"))  # clear error for a bad size
    metadata = json.dumps(typed_metadata(model_metadata(model, (height, width))))
    with torch.no_grad():
        exported = torch.export.export(model, (torch.zeros(1, 3, height, width),), strict=False)
    program = exir.to_edge_transform_and_lower(
        exported,
        partitioner=[xnnpack.XnnpackPartitioner()],
        constant_methods={EXECUTORCH_METADATA: metadata},
    ).to_executorch()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(program.buffer)
    return path
