"""What every exporter shares: the float32 CPU copy it traces, that copy's eval outputs, the file's metadata, and
which graph nodes INT8 quantization keeps in float (the head's last convolutions and its decode).

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

__all__ = ["cpu_eval_copy", "eval_outputs", "float_nodes", "model_metadata"]

# A node the exporter names without a module scope (``/Add_3``, ``/Sigmoid``) or in the DFL (``/dfl/Softmax``): the
# head's decode after its last convolutions (anchor grid, DFL expectation, box and keypoint maths, angle, the
# concatenation of pixel boxes with [0, 1] scores). Quantizing those tensors to 8 bits would put boxes in pixels
# and scores on one scale; INT8 leaves them in float.
DECODE_NODE = re.compile(r"^/(dfl/)?[A-Za-z]+(_\d+)?$")
# The last convolution of each head branch at each level (``/cv2.0.2/Conv``: box distributions, ``cv3``: class
# logits, ``cv4``: the OBB angle, the pose keypoints, the mask coefficients; OpenVINO splits one into
# ``.../Conv/WithoutBiases`` and its bias ``Add`` named ``.../Conv``): its outputs are the raw values the decode
# reads through a softmax, a sigmoid, cos/sin or a scale to pixels, so an 8-bit step there moves boxes, angles and
# keypoints. INT8 keeps them in float (a few thousand weights); every other convolution is quantized.
HEAD_OUTPUT_CONV = re.compile(r"^/cv[234]\.\d+\.2/Conv(/WithoutBiases)?$")


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


def float_nodes(names: Iterable[str]) -> list[str]:
    """The node names among ``names`` (ONNX node names, or OpenVINO friendly names of a model converted from
    ONNX) that INT8 quantization leaves in float: the head's decode (``DECODE_NODE``) and its last convolutions
    (``HEAD_OUTPUT_CONV``)."""
    return [name for name in names if DECODE_NODE.match(name) or HEAD_OUTPUT_CONV.match(name)]
