"""``yolo11-lightning info``: layers, parameters and GFLOPs of every YOLO11 scale, for a task (``--task
detect``, the default, or ``segment`` for YOLO11-seg); the header line names the task.

FLOPs are counted with ``torch.utils.flop_counter.FlopCounterMode`` on the meta device (shapes only,
no memory, no compute). Convention: GFLOPs = 2 × multiply-adds / 1e9 for one image. The ``GFLOPs``
column counts convolutions only, which is the convention of the published figures (6.5 / 21.5 / 68.0 /
86.9 / 194.9 at 640); ``+attn`` adds the attention matmuls of C2PSA, which those figures leave out.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import torch
from torch.utils.flop_counter import FlopCounterMode

from yolo11_lightning.nn.scales import SCALES
from yolo11_lightning.nn.yolo11 import YOLO11
from yolo11_lightning.tasks import TASKS, create_model, get_task

# Task -> (words in the header, suffix of the model names, as the reference files are named).


def count_flops(model: YOLO11, imgsz: tuple[int, int]) -> tuple[float, float]:
    """(conv GFLOPs, total GFLOPs) of one eval forward at (H, W), on the model's device (for segmentation
    the mask prototypes and coefficients included, not the per-instance mask products after NMS)."""
    device = next(model.parameters()).device
    x = torch.zeros(1, 3, *imgsz, device=device)
    was_training = model.training
    model.eval()
    try:
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            model(x)
    finally:
        model.train(was_training)
    by_op = counter.get_flop_counts().get("Global", {})
    conv = sum(v for k, v in by_op.items() if "convolution" in str(k))
    return conv / 1e9, counter.get_total_flops() / 1e9


def summarize(
    scale: str, num_classes: int = 80, imgsz: tuple[int, int] = (640, 640), task: str = "detect"
) -> dict[str, float]:
    """Layers (leaf modules, as the reference counts them), parameters and GFLOPs of one scale and task."""
    with torch.device("meta"):
        model = create_model(scale, num_classes, task=task)
    layers = sum(1 for m in model.modules() if not m._modules)
    params = sum(p.numel() for p in model.parameters())
    conv, total = count_flops(model.fuse(), imgsz)  # fused: BN is free at inference
    return {"layers": layers, "parameters": params, "gflops": conv, "gflops_total": total}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="yolo11-lightning info", description="Print layers, parameters and GFLOPs of YOLO11 scales."
    )
    parser.add_argument("--scales", default=",".join(SCALES), help="comma-separated scales (default: all)")
    parser.add_argument("--num-classes", type=int, default=80)
    parser.add_argument(
        "--task",
        choices=list(TASKS),
        default="detect",
        help=", ".join(f"{name} (YOLO11{t.model_suffix})" for name, t in TASKS.items())
        + "; detect by default",
    )
    parser.add_argument("--imgsz", type=int, nargs="+", default=[640], help="H [W], multiples of 32")
    args = parser.parse_args(list(argv) if argv is not None else None)

    scales = [s.strip() for s in args.scales.split(",") if s.strip()]
    unknown = [s for s in scales if s not in SCALES]
    if unknown or not scales:
        parser.error(f"unknown scale(s) {unknown}; choose from {', '.join(SCALES)}")
    if len(args.imgsz) > 2 or any(v <= 0 or v % 32 for v in args.imgsz):
        parser.error(f"--imgsz takes H [W], positive multiples of 32; got {args.imgsz}")
    if args.num_classes < 1:
        parser.error(f"--num-classes must be positive, got {args.num_classes}")
    h, w = (args.imgsz * 2)[:2]

    out = sys.stdout
    spec = get_task(args.task)
    words, suffix = spec.title, spec.model_suffix
    out.write(f"YOLO11 {words} models (task {args.task}), {args.num_classes} classes, input {h}x{w}\n")
    width = 9 + len(suffix)
    out.write(f"{'model':<{width}}{'layers':>8}{'parameters':>14}{'GFLOPs':>10}{'+attn':>10}\n")
    for scale in scales:
        row = summarize(scale, args.num_classes, (h, w), args.task)
        out.write(
            f"{'yolo11' + scale + suffix:<{width}}{row['layers']:>8}{row['parameters']:>14,}"
            f"{row['gflops']:>10.1f}{row['gflops_total']:>10.2f}\n"
        )
    out.write(
        "GFLOPs = 2 x multiply-adds / 1e9 per image, BN folded; 'GFLOPs' counts convolutions (the\n"
        "convention of the published YOLO11 figures), '+attn' adds the C2PSA attention matmuls.\n"
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
