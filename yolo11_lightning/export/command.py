"""``yolo11-lightning export``: a training checkpoint as deployable files, ONNX or a weights-only file.

    yolo11-lightning export --ckpt_path runs/.../best.ckpt --format onnx --image-size 640
    yolo11-lightning export --ckpt_path runs/.../best.ckpt --format weights
    yolo11-lightning export --ckpt_path runs/.../best.ckpt --format onnx --check-data data.yaml

A Lightning checkpoint keeps the EMA weights in ``state_dict`` (``WeightAveraging`` moves the raw ones to
``current_model_state``): those averaged weights are what validation scored and what is exported. The ONNX
file is ``export.onnx``'s; the weights-only file ``model_files.weights``'. ``--check-data`` validates the
checkpoint and the ONNX file on a dataset and prints both mAPs (``export.check``, imports Lightning).
Imports torch, onnx (and onnxruntime for the checks: the ``onnx`` extra, ``extras.require``), never Lightning
unless ``--check-data`` is given.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from yolo11_lightning.export.onnx import export_onnx, onnx_output_diffs, onnx_output_names, onnx_tolerance
from yolo11_lightning.extras import MissingExtraError, require
from yolo11_lightning.model_files.image_size import choose_image_size, file_image_size
from yolo11_lightning.model_files.weights import load_model, save_weights
from yolo11_lightning.nn.yolo11 import YOLO11

FORMATS = ("onnx", "weights")


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
    p.add_argument("--image-size", "--image_size", dest="image_size", type=int, nargs="+", default=None,
                   help="ONNX input size: S or H W, multiples of 32 (default: the size the model was trained "
                   "at, as its file records it, else 640)")  # fmt: skip
    p.add_argument("--opset", type=int, default=17, help="ONNX opset (default 17)")
    p.add_argument("--dynamic", action="store_true",
                   help="ONNX height and width as free axes (any multiple of 32; the batch axis always is)")  # fmt: skip
    p.add_argument("--no-check", action="store_true",
                   help="skip the ONNX Runtime parity check (it runs when onnxruntime is installed)")  # fmt: skip
    check = p.add_argument_group("accuracy check (--check-data): validate the checkpoint and the ONNX file")
    check.add_argument("--check-data", "--check_data", dest="check_data", default=None, metavar="DATA_YAML",
                       help="dataset yaml (or 'synthetic'): print both mAPs on its val split")  # fmt: skip
    check.add_argument("--batch-size", "--batch_size", dest="batch_size", type=int, default=16,
                       help="validation batch (default 16)")  # fmt: skip
    check.add_argument("--num-workers", "--num_workers", dest="num_workers", type=int, default=2,
                       help="validation loader processes (default 2)")  # fmt: skip
    check.add_argument("--accelerator", default="auto", help="Lightning accelerator (default auto)")
    check.add_argument("--max-map-difference", dest="max_difference", type=float, default=1e-3,
                       help="exit 1 when |mAP50-95 ONNX - checkpoint| exceeds this (default 0.001)")  # fmt: skip
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """``yolo11-lightning export``; returns the exit code."""
    args = _parse(argv)
    if args.image_size is not None and len(args.image_size) not in (1, 2):
        print("error: --image-size takes S or H W", file=sys.stderr)
        return 2
    try:
        model = load_model(args.ckpt_path, task=None)  # the task the file holds
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    source = Path(args.ckpt_path)
    trained = file_image_size(source)
    if args.format == "weights":  # the trained size travels with the weights
        out = save_weights(model, args.out or source.with_suffix(".pth"), trained)
        print(f"weights: {out} ({_describe(model)})")
        return 0
    try:
        require("onnx", "onnx", "export")
    except MissingExtraError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    given = args.image_size
    if given is not None and len(given) == 2 and given[0] == given[1]:
        given = given[:1]
    if args.check_data and not args.dynamic and given is not None and len(given) != 1:
        print("error: --check-data needs a square --image-size S, or --dynamic", file=sys.stderr)
        return 2
    if given is not None and len(given) == 2:
        size: int | tuple[int, int] = (given[0], given[1])
        print(f"image size {given[0]}x{given[1]} (--image-size)")
    else:
        size, said = choose_image_size(given[0] if given else None, trained)
        print(said)
    try:
        out = export_onnx(model, args.out or source.with_suffix(".onnx"), size, args.opset, args.dynamic)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    shape = "dynamic batch, height and width" if args.dynamic else "dynamic batch"
    outputs = " + ".join(onnx_output_names(model))
    print(f"onnx: {out} ({_describe(model)}, input {size}, {shape}, outputs {outputs})")
    h, w = (size, size) if isinstance(size, int) else size
    if not args.no_check and not _parity_check(model, out, (h, w), args.dynamic):
        return 1
    if args.check_data:
        return _accuracy_check(model, out, (h, w), args)
    return 0


def _describe(model: YOLO11) -> str:
    task = "" if model.task == "detect" else f", task {model.task}"
    return f"YOLO11-{model.scale}, {model.num_classes} classes{task}"


def _parity_check(model: YOLO11, path: Path, size: tuple[int, int], dynamic: bool) -> bool:
    """onnxruntime vs PyTorch on random images at the export size (and a second size when dynamic)."""
    try:
        require("onnxruntime", "onnx", "the parity check")
    except MissingExtraError as e:
        print(f"parity check skipped: {e}")
        return True
    shapes = [size, (size[0] + 32, max(size[1] - 32, 32))] if dynamic else [size]
    for h, w in shapes:
        images = torch.rand(2, 3, h, w, generator=torch.Generator().manual_seed(0))
        diffs, tolerance = onnx_output_diffs(model, path, images), onnx_tolerance(model, images)
        shown = ", ".join(f"{name} {diff:.2e}" for name, diff in diffs.items())
        print(
            f"onnxruntime vs PyTorch, batch of 2 at {h}x{w}: max |diff| {shown} (tolerance {tolerance:.1e})"
        )
        for name, diff in diffs.items():
            if not diff <= tolerance:
                print(f"error: {path}: ONNX {name} differs from PyTorch by {diff:.3g}", file=sys.stderr)
                return False
    return True


def _accuracy_check(model: YOLO11, path: Path, size: tuple[int, int], args: argparse.Namespace) -> int:
    """``--check-data``: both mAPs on the dataset's val split; 1 when they differ by more than allowed."""
    from yolo11_lightning.export.check import compare

    try:
        result = compare(
            model, path, args.check_data, size, args.dynamic, batch_size=args.batch_size,
            num_workers=args.num_workers, accelerator=args.accelerator,
        )  # fmt: skip
    except (FileNotFoundError, ValueError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"accuracy check ({result.setting}):\n{result.table()}")
    metric, difference = result.worst_difference()
    if not difference <= args.max_difference:
        print(
            f"error: {path}: {metric} differs from the checkpoint's by {difference:.4f} "
            f"(allowed {args.max_difference})",
            file=sys.stderr,
        )
        return 1
    return 0
