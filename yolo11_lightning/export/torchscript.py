"""TorchScript export of a ``YOLO11``: ``torch.jit.trace`` of the eval model at one image size.

The file (``<stem>.torchscript``) takes float (B, 3, H, W) RGB in [0, 1] at the traced size, any batch, and gives
``YOLO11.eval()``'s outputs. Its metadata is the archive's extra file ``config.txt`` (JSON of
``onnx_metadata.metadata_props``' keys), where the reference's TorchScript loader reads it; our runtime is
``model_files.torchscript_runtime``. Imports torch only.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import torch

from yolo11_lightning.export.tracing import cpu_eval_copy, model_metadata
from yolo11_lightning.model_files.onnx_metadata import typed_metadata
from yolo11_lightning.model_files.torchscript_runtime import TORCHSCRIPT_METADATA
from yolo11_lightning.nn.yolo11 import YOLO11

__all__ = ["export_torchscript"]


def export_torchscript(model: YOLO11, path: str | os.PathLike, image_size: tuple[int, int]) -> Path:
    """Trace ``model`` (a float32 CPU copy) at ``image_size`` (H, W) and save it with its metadata to ``path``."""
    height, width = image_size
    model = cpu_eval_copy(model)
    model.check_input(torch.zeros(1, 3, height, width, device="meta"))  # clear error for a bad size
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(), torch.no_grad():
        # Expected: shape checks and the anchor grid become constants, which is what tracing at one size means.
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        traced = torch.jit.trace(model, torch.zeros(1, 3, height, width), strict=False)
    metadata = json.dumps(typed_metadata(model_metadata(model, (height, width))))
    torch.jit.save(traced, str(path), _extra_files={TORCHSCRIPT_METADATA: metadata})
    return path
