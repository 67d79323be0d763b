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
from typing import Any

import torch

from yolo11_lightning.errors import UserInputError
from yolo11_lightning.export.formats import (
    FORMATS,
    ExportFormat,
    export_file,
    get_format,
    missing_extra,
    output_path,
)
from yolo11_lightning.export.onnx import onnx_output_names, onnx_tolerance
from yolo11_lightning.export.parity import exported_output_diffs
from yolo11_lightning.extras import MissingExtraError
from yolo11_lightning.model_files.image_size import choose_image_size, file_image_size
from yolo11_lightning.model_files.weights import load_model, save_weights
from yolo11_lightning.nn.yolo11 import YOLO11

# the default allowed |mAP50-95 file - checkpoint| of an INT8 file (fp32 and fp16: 0.001); measured gaps:
# benchmarks/deploy/RESULTS.md
INT8_MAX_DIFFERENCE = 0.02


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="yolo11-lightning export",
        description="Export a checkpoint (its EMA weights) to a deployment format or to a weights-only file.",
    )
    p.add_argument("--ckpt_path", "--ckpt-path", "--weights", dest="ckpt_path", required=True,
                   help="Lightning .ckpt, weights file or reference .pt")  # fmt: skip
    p.add_argument("--format", default="onnx", metavar="FORMAT",
                   help=f"one of {', '.join(FORMATS)}, weights (default onnx)")  # fmt: skip
    p.add_argument("--out", default=None,
                   help="output file (an OpenVINO folder; default: beside the checkpoint, named by the format)")  # fmt: skip
    p.add_argument("--image-size", "--image_size", dest="image_size", type=int, nargs="+", default=None,
                   help="input size: S or H W, multiples of 32 (default: the size the model was trained "
                   "at, as its file records it, else 640)")  # fmt: skip
    p.add_argument("--opset", type=int, default=17, help="ONNX opset (default 17)")
    p.add_argument("--dynamic", action="store_true",
                   help="ONNX height and width as free axes (any multiple of 32; the batch axis always is)")  # fmt: skip
    p.add_argument("--no-check", action="store_true",
                   help="skip the parity check of the file's outputs against PyTorch's")  # fmt: skip
    int8 = p.add_argument_group("INT8 calibration (onnx-int8, openvino-int8)")
    int8.add_argument("--calibration-data", "--calibration_data", dest="calibration_data", default=None,
                      metavar="DATA_YAML", help="dataset whose training split calibrates (default: --check-data)")  # fmt: skip
    int8.add_argument("--calibration-images", "--calibration_images", dest="calibration_images", type=int,
                      default=64, help="training images spread over the split (default 64)")  # fmt: skip
    check = p.add_argument_group(
        "accuracy check (--check-data): validate the checkpoint and the exported file"
    )
    check.add_argument("--check-data", "--check_data", dest="check_data", default=None, metavar="DATA_YAML",
                       help="dataset yaml (or 'synthetic'): print both mAPs on its val split")  # fmt: skip
    check.add_argument("--batch-size", "--batch_size", dest="batch_size", type=int, default=16,
                       help="validation batch (default 16)")  # fmt: skip
    check.add_argument("--num-workers", "--num_workers", dest="num_workers", type=int, default=2,
                       help="validation loader processes (default 2)")  # fmt: skip
    check.add_argument("--accelerator", default="auto", help="Lightning accelerator (default auto)")
    check.add_argument("--max-map-difference", dest="max_difference", type=float, default=None,
                       help="exit 1 when |mAP50-95 file - checkpoint| exceeds this (default 0.001; INT8: "
                       f"{INT8_MAX_DIFFERENCE})")  # fmt: skip
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """``yolo11-lightning export``; returns the exit code."""
    args = _parse(argv)
    if args.image_size is not None and len(args.image_size) not in (1, 2):
        print("error: --image-size takes S or H W", file=sys.stderr)
        return 2
    try:
        fmt = None if args.format == "weights" else get_format(args.format)
    except UserInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        model = load_model(args.ckpt_path, task=None)  # the task the file holds
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    source = Path(args.ckpt_path)
    trained = file_image_size(source)
    if fmt is None:  # the trained size travels with the weights
        out = save_weights(model, args.out or source.with_suffix(".pth"), trained)
        print(f"weights: {out} ({_describe(model)})")
        return 0
    problem = missing_extra(fmt)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
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
    h, w = (size, size) if isinstance(size, int) else size
    try:
        calibration = _calibration(fmt, model, (h, w), args)
        out = export_file(fmt, model, args.out or output_path(fmt, source), (h, w), args.opset, args.dynamic,
                          calibration)  # fmt: skip
    except (UserInputError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    shape = "dynamic batch, height and width" if args.dynamic else "dynamic batch"
    outputs = " + ".join(onnx_output_names(model))
    print(f"{fmt.name}: {out} ({_describe(model)}, input {size}, {shape}, outputs {outputs})")
    if not args.no_check and not _parity_check(model, fmt, out, (h, w), args.dynamic):
        return 1
    if args.check_data:
        return _accuracy_check(model, fmt, out, (h, w), args)
    return 0


def _calibration(fmt: ExportFormat, model: YOLO11, size: tuple[int, int], args: argparse.Namespace) -> Any:
    """The calibration images of an INT8 format (None for the others)."""
    if not fmt.calibrated:
        return None
    dataset = args.calibration_data or args.check_data
    if dataset is None:
        raise UserInputError(
            f"--format {fmt.name} is calibrated on a training split: give --calibration-data DATA_YAML "
            "(or --check-data)"
        )
    if size[0] != size[1]:
        raise UserInputError(f"--format {fmt.name} needs a square --image-size S (calibration letterboxes)")
    from yolo11_lightning.export.calibration import calibration_images

    images = calibration_images(dataset, model.task, size[0], args.calibration_images)
    print(f"INT8 calibration: {len(images)} images of the training split of {dataset}")
    return images


def _describe(model: YOLO11) -> str:
    task = "" if model.task == "detect" else f", task {model.task}"
    return f"YOLO11-{model.scale}, {model.num_classes} classes{task}"


def _parity_check(model: YOLO11, fmt: ExportFormat, path: Path, size: tuple[int, int], dynamic: bool) -> bool:
    """The file's runtime vs PyTorch on random images at the export size (and a second size when dynamic);
    fp32 must agree within ``onnx_tolerance``, fp16 and INT8 are printed only (their check is --check-data)."""
    shapes = [size, (size[0] + 32, max(size[1] - 32, 32))] if dynamic else [size]
    for h, w in shapes:
        images = torch.rand(2, 3, h, w, generator=torch.Generator().manual_seed(0))
        try:
            diffs = exported_output_diffs(model, path, images)
        except MissingExtraError as e:
            print(f"parity check skipped: {e}")
            return True
        tolerance = onnx_tolerance(model, images)
        shown = ", ".join(f"{name} {diff:.2e}" for name, diff in diffs.items())
        if fmt.precision != "fp32":
            print(f"{fmt.runtime} vs PyTorch, batch of 2 at {h}x{w}: max |diff| {shown} ({fmt.precision})")
            continue
        print(
            f"{fmt.runtime} vs PyTorch, batch of 2 at {h}x{w}: max |diff| {shown} (tolerance {tolerance:.1e})"
        )
        for name, diff in diffs.items():
            if not diff <= tolerance:
                print(f"error: {path}: {fmt.name} {name} differs from PyTorch by {diff:.3g}", file=sys.stderr)
                return False
    return True


def _accuracy_check(
    model: YOLO11, fmt: ExportFormat, path: Path, size: tuple[int, int], args: argparse.Namespace
) -> int:
    """``--check-data``: both mAPs on the dataset's val split; 1 when they differ by more than allowed."""
    from yolo11_lightning.export.check import compare

    try:
        result = compare(
            model, path, args.check_data, size, args.dynamic, batch_size=args.batch_size,
            num_workers=args.num_workers, accelerator=args.accelerator, label=fmt.name,
        )  # fmt: skip
    except (FileNotFoundError, ValueError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"accuracy check ({result.setting}):\n{result.table()}")
    allowed = args.max_difference
    if allowed is None:
        allowed = INT8_MAX_DIFFERENCE if fmt.calibrated else 1e-3
    metric, difference = result.worst_difference()
    if not difference <= allowed:
        print(
            f"error: {path}: {metric} differs from the checkpoint's by {difference:.4f} (allowed {allowed})",
            file=sys.stderr,
        )
        return 1
    return 0
