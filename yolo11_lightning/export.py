"""Turn a training checkpoint into deployable files: ONNX, or a weights-only file that needs no Lightning.

    yolo11-lightning export --ckpt_path runs/.../best.ckpt --format onnx --image-size 640
    yolo11-lightning export --ckpt_path runs/.../best.ckpt --format weights

A Lightning checkpoint keeps the EMA weights in ``state_dict`` (``WeightAveraging`` moves the raw ones to
``current_model_state``): those averaged weights are what validation scored and what is exported.

ONNX: input ``images`` float (B, 3, H, W) RGB in [0, 1]; output ``output0`` (B, 4 + nc, A), xywh boxes in input
pixels then class scores (no NMS), exactly ``YOLO11.eval()``'s output. The batch axis is dynamic; the image
size is fixed at export, because the head's anchor grid is computed from the concrete feature-map sizes.
Imports torch (and onnx/onnxruntime when present), never Lightning. Reading model files is ``nn.weights``;
``load_model``, ``load_weights`` and ``save_weights`` are re-exported here for code that imports them from
``yolo11_lightning.export``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from yolo11_lightning.nn import YOLO11
from yolo11_lightning.nn.weights import load_model, load_weights, save_weights

__all__ = [
    "export_onnx",
    "load_model",
    "load_weights",
    "main",
    "onnx_max_abs_diff",
    "onnx_tolerance",
    "save_weights",
]

FORMATS = ("onnx", "weights")
ONNX_INPUT, ONNX_OUTPUT = "images", "output0"


def export_onnx(
    model: YOLO11, path: str | os.PathLike, image_size: int | tuple[int, int] = 640, opset: int = 17
) -> Path:
    """Export ``model`` (eval mode) to ONNX with a dynamic batch axis at a fixed (H, W) image size.

    Uses the TorchScript-based exporter (no extra dependency). Class names, scale and image size go into the
    file's metadata when the ``onnx`` package is installed.
    """
    height, width = (image_size, image_size) if isinstance(image_size, int) else image_size
    model = model.eval()
    model.check_input(torch.zeros(1, 3, height, width, device="meta"))  # clear error for a bad size
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    dummy = torch.zeros(1, 3, height, width, device=next(model.parameters()).device)
    with warnings.catch_warnings():
        # Expected: the legacy exporter announces its deprecation, and the tracer notes that shape checks and
        # the anchor grid become constants, which is what a fixed image size means.
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
        torch.onnx.export(
            model,
            (dummy,),
            str(path),
            dynamo=False,
            input_names=[ONNX_INPUT],
            output_names=[ONNX_OUTPUT],
            dynamic_axes={ONNX_INPUT: {0: "batch"}, ONNX_OUTPUT: {0: "batch"}},
            opset_version=opset,
            do_constant_folding=True,
        )
    _add_metadata(path, model, (height, width))
    return path


def _add_metadata(path: Path, model: YOLO11, size: tuple[int, int]) -> None:
    try:
        import onnx
    except ImportError:  # metadata is a convenience; the graph is complete without it
        return
    proto = onnx.load(str(path))
    meta = {
        "producer": "yolo11_lightning",
        "scale": model.scale,
        "image_size": json.dumps(list(size)),
        "names": json.dumps(model.names or [str(i) for i in range(model.num_classes)]),
        "input": "float RGB (B, 3, H, W) in [0, 1], letterboxed with fill 114/255",
        "output": "(B, 4 + nc, A): cx, cy, w, h in input pixels, then class scores; no NMS",
    }
    for key, value in meta.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(proto, str(path))


def onnx_max_abs_diff(model: YOLO11, onnx_path: str | os.PathLike, images: torch.Tensor) -> float:
    """Largest |ONNX Runtime - PyTorch| over the eval outputs for float ``images`` (B, 3, H, W)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    cpu_model = model.eval().cpu()
    with torch.no_grad():
        expected = cpu_model(images.float().cpu()).numpy()
    (got,) = session.run([ONNX_OUTPUT], {ONNX_INPUT: images.float().cpu().numpy()})
    if got.shape != expected.shape:
        raise ValueError(f"{onnx_path}: output shape {got.shape} differs from PyTorch's {expected.shape}")
    return float(np.abs(got - expected).max())


def onnx_tolerance(model: YOLO11, images: torch.Tensor) -> float:
    """Allowed parity gap: 1e-4 plus a few float32 steps of the largest output (boxes are in pixels, and at
    640 px one float32 step is already 6e-5)."""
    with torch.no_grad():
        largest = float(model.eval().cpu()(images.float().cpu()).abs().max())
    return 1e-4 + 1e-6 * largest


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="yolo11-lightning export",
        description="Export a checkpoint (its EMA weights) to ONNX or to a weights-only file.",
    )
    p.add_argument("--ckpt_path", "--ckpt-path", "--weights", dest="ckpt_path", required=True,
                   help="Lightning .ckpt, weights file or reference .pt")  # fmt: skip
    p.add_argument("--format", choices=FORMATS, default="onnx", help="onnx (default) or weights")
    p.add_argument("--out", default=None,
                   help="output file (default: beside the checkpoint, .onnx or .pth)")  # fmt: skip
    p.add_argument("--image-size", "--image_size", dest="image_size", type=int, nargs="+", default=[640],
                   help="ONNX input size: S or H W, multiples of 32 (default 640)")  # fmt: skip
    p.add_argument("--opset", type=int, default=17, help="ONNX opset (default 17)")
    p.add_argument("--no-check", action="store_true",
                   help="skip the ONNX Runtime parity check (it runs when onnxruntime is installed)")  # fmt: skip
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """``yolo11-lightning export``; returns the exit code."""
    args = _parse(argv)
    if len(args.image_size) not in (1, 2):
        print("error: --image-size takes S or H W", file=sys.stderr)
        return 2
    try:
        model = load_model(args.ckpt_path)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    source = Path(args.ckpt_path)
    if args.format == "weights":
        out = save_weights(model, args.out or source.with_suffix(".pth"))
        print(f"weights: {out} (YOLO11-{model.scale}, {model.num_classes} classes)")
        return 0
    size = args.image_size[0] if len(args.image_size) == 1 else tuple(args.image_size)
    try:
        out = export_onnx(model, args.out or source.with_suffix(".onnx"), size, args.opset)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"onnx: {out} (YOLO11-{model.scale}, {model.num_classes} classes, input {size}, dynamic batch)")
    if args.no_check:
        return 0
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        print("parity check skipped: onnxruntime is not installed")
        return 0
    h, w = (size, size) if isinstance(size, int) else size
    images = torch.rand(2, 3, h, w, generator=torch.Generator().manual_seed(0))
    diff, tolerance = onnx_max_abs_diff(model, out, images), onnx_tolerance(model, images)
    print(f"onnxruntime vs PyTorch, batch of 2: max |diff| = {diff:.2e} (tolerance {tolerance:.1e})")
    if not diff <= tolerance:
        print(f"error: {out}: ONNX output differs from PyTorch by {diff:.3g}", file=sys.stderr)
        return 1
    return 0
