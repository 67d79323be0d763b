"""What every exporter shares: the float32 CPU copy it traces, that copy's eval outputs, the file's metadata, and
which graph nodes are the head's decode (kept in float by INT8 quantization).

Exporting and checking work on a copy, so the caller's model (a GPU model in a notebook, a half-precision one,
one in train mode) stays as it was. Imports torch; never Lightning.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable

import torch

from yolo11_lightning.model_files.onnx_metadata import metadata_props
from yolo11_lightning.nn.yolo11 import YOLO11
from yolo11_lightning.tasks import get_task
from yolo11_lightning.version import package_version

__all__ = ["cpu_eval_copy", "decode_nodes", "eval_outputs", "model_metadata"]

# A node the exporter names without a module scope (``/Add_3``, ``/Sigmoid``) or in the DFL (``/dfl/Softmax``): the
# head's decode after its last convolutions (anchor grid, DFL expectation, box and keypoint maths, angle, the
# concatenation of pixel boxes with [0, 1] scores). Quantizing those tensors to 8 bits would put boxes in pixels
# and scores on one scale; INT8 leaves them in float, every convolution and linear layer is quantized.
DECODE_NODE = re.compile(r"^/(dfl/)?[A-Za-z]+(_\d+)?$")


def cpu_eval_copy(model: YOLO11) -> YOLO11:
    """A float32 eval-mode copy of ``model`` on the CPU."""
    return copy.deepcopy(model).float().cpu().eval()


def eval_outputs(model: YOLO11, images: torch.Tensor) -> list[torch.Tensor]:
    """The eval outputs of ``model`` on the CPU as a list, in the task's output order."""
    with torch.no_grad():
        out = cpu_eval_copy(model)(images.float().cpu())
    return list(out) if isinstance(out, tuple | list) else [out]


def model_metadata(
    model: YOLO11,
    size: tuple[int, int],
    dynamic: bool = False,
    opset: int | None = None,
    half: bool = False,
    int8: bool = False,
) -> dict[str, str]:
    """The metadata of a file exported from ``model`` at ``size`` (H, W): ``onnx_metadata.metadata_props``."""
    return metadata_props(
        scale=model.scale,
        names=model.names or [str(i) for i in range(model.num_classes)],
        size=size,
        stride=max(model.strides),
        dynamic=dynamic,
        opset=opset,
        version=package_version(),
        task=model.task,
        task_props=get_task(model.task).onnx_metadata(model),
        half=half,
        int8=int8,
    )


def decode_nodes(names: Iterable[str]) -> list[str]:
    """The node names among ``names`` (ONNX node names, or OpenVINO friendly names of a model converted from
    ONNX) that are the head's decode (``DECODE_NODE``)."""
    return [name for name in names if DECODE_NODE.match(name)]
