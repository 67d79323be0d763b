"""Run an exported ExecuTorch program (``.pte``) in place of ``YOLO11`` for validate, test and predict.

The file is ``export.executorch``'s: a ``forward`` method taking (1, 3, H, W) float RGB in [0, 1] at its
export size (XNNPACK-delegated, fp32) and a constant method ``metadata`` returning JSON of the keys
``model_files.onnx_metadata.metadata_props`` writes. The program's tensors are planned for batch 1, so
``ExecuTorchModel`` runs a batch one image at a time and stacks the outputs, which are what ``YOLO11.eval()``
gives. Imports torch, and executorch's runtime when a file is opened (the ``executorch`` extra); never
Lightning.
"""

from __future__ import annotations

import json
import os
from typing import ClassVar

import numpy as np
import torch

from yolo11_lightning.extras import require
from yolo11_lightning.model_files.exported_model import ExportedModel, existing
from yolo11_lightning.model_files.onnx_metadata import read_metadata
from yolo11_lightning.tasks import DEFAULT_TASK

__all__ = ["EXECUTORCH_METADATA", "ExecuTorchModel", "is_executorch_file"]

EXECUTORCH_METADATA = "metadata"  # the program's constant method returning the metadata JSON


def is_executorch_file(path: str | os.PathLike | None) -> bool:
    """True for a path named ``*.pte``."""
    return path is not None and str(path).lower().endswith(".pte")


class ExecuTorchModel(ExportedModel):
    """An exported ``.pte`` program run by the ExecuTorch runtime on the CPU (arguments as
    ``OnnxDetector``'s)."""

    runtime: ClassVar[str] = "ExecuTorch"
    _shared: ClassVar[tuple[str, ...]] = ("session", "_forward")

    def __init__(
        self, path: str | os.PathLike, num_classes: int | None = None, task: str | None = DEFAULT_TASK
    ) -> None:
        super().__init__()
        require("executorch", "executorch", f"running {path}")
        runtime = require("executorch.runtime", "executorch", f"running {path}")
        self.path = existing(path, "ExecuTorch program")
        try:
            program = runtime.Runtime.get().load_program(str(self.path))
        except RuntimeError as e:  # the runtime's one error type for an unreadable program
            raise ValueError(f"{self.path}: not a readable ExecuTorch program ({e})") from e
        if EXECUTORCH_METADATA not in program.method_names or "forward" not in program.method_names:
            raise ValueError(
                f"{self.path}: expected the methods forward and {EXECUTORCH_METADATA} (a yolo11-lightning "
                f"export), found {sorted(program.method_names)}"
            )
        returned = program.load_method(EXECUTORCH_METADATA).execute([])
        try:
            props = json.loads(returned[0] if len(returned) == 1 else None)
        except (TypeError, json.JSONDecodeError) as e:
            raise ValueError(f"{self.path}: method {EXECUTORCH_METADATA} does not return JSON: {e}") from e
        info = read_metadata(
            self.path, {str(k): v if isinstance(v, str) else repr(v) for k, v in props.items()}
        )
        forward = program.load_method("forward")
        meta = forward.metadata
        in_shape = list(meta.input_tensor_meta(0).sizes())
        out_shapes = [list(meta.output_tensor_meta(i).sizes()) for i in range(meta.num_outputs())]
        if meta.num_inputs() != 1 or in_shape[:2] != [1, 3]:
            raise ValueError(f"{self.path}: expected one input (1, 3, H, W), got {in_shape}")
        self._order = self._check(info, in_shape, out_shapes, num_classes, task)
        self.__dict__["session"] = program  # not copied: a copy runs the same loaded program
        self.__dict__["_forward"] = forward

    def _run(self, images: np.ndarray) -> list[np.ndarray]:
        per_image = [self._forward.execute([torch.from_numpy(image[None])]) for image in images]
        stacked = [np.concatenate([outs[i].numpy() for outs in per_image]) for i in range(len(per_image[0]))]
        return [stacked[i] for i in self._order]
