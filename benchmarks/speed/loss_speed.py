"""Detection (or segmentation) loss forward+backward time, ours vs the reference package's, side by side.

    python benchmarks/speed/loss_speed.py [--batch 16] [--imgsz 640] [--boxes 10 100] [--repeats 5] [--device cpu]
    python benchmarks/speed/loss_speed.py --task segment    # SegmentationLoss vs v8SegmentationLoss, same batch

``--task segment`` adds 32 mask coefficients per anchor, (B, 32, H/4, W/4) protos and overlap-encoded
ground-truth masks (one index map per image at 1/4 resolution, larger objects first, the data default).
``--keep-host-memory``: glibc keeps freed memory in the process (``training.host_memory``, what CPU training
runs with by default) for both sides, which share this process: the mask term's (R, H/4, W/4) tensors are
far above glibc's mmap threshold and are otherwise mapped and zero-filled afresh on every call.

Prints one row per boxes-per-image setting: median seconds per call and ours/reference ratio (< 1 means
ours is faster). The reference (ultralytics, AGPL) is a comparison oracle only, imported here, never
by the package.
"""

from __future__ import annotations

import os
import statistics
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers (_common, ...)

import _common as C
import torch

from yolo11_lightning.loss.detection import DetectionLoss
from yolo11_lightning.tasks.segment.loss import SegmentationLoss

STRIDES = (8, 16, 32)
NUM_MASKS = 32


def make_inputs(batch: int, imgsz: int, boxes: int, nc: int, device: str, seed: int = 0):
    """Head-like random maps (class logits near the reference bias init) and `boxes` targets per image."""
    g = torch.Generator().manual_seed(seed)
    feats = []
    for s in STRIDES:
        f = torch.randn(batch, 64 + nc, imgsz // s, imgsz // s, generator=g)
        f[:, 64:] -= 8.0  # log(5 / nc / (640 / s)^2) is about -8 to -11
        feats.append(f.to(device))
    n = batch * boxes
    image = torch.arange(batch).repeat_interleave(boxes).float()[:, None]
    cls = torch.randint(0, nc, (n, 1), generator=g).float()
    wh = torch.rand(n, 2, generator=g) * 0.3 + 0.01
    cxcy = wh / 2 + torch.rand(n, 2, generator=g) * (1 - wh)
    return feats, torch.cat((image, cls, cxcy, wh), 1).to(device)


def make_seg_inputs(batch: int, imgsz: int, boxes: int, nc: int, device: str, seed: int = 0):
    """``make_inputs`` plus the seg head's coefficients (B, 32, A) and protos (B, 32, imgsz/4, imgsz/4), and
    overlap masks (B, imgsz/4, imgsz/4) uint8: the ellipse in each box, value k = the image's k-th row."""
    feats, targets = make_inputs(batch, imgsz, boxes, nc, "cpu", seed)
    g = torch.Generator().manual_seed(seed + 1)
    anchors = sum((imgsz // s) ** 2 for s in STRIDES)
    m = imgsz // 4
    coefficients = torch.randn(batch, NUM_MASKS, anchors, generator=g) * 0.5
    protos = torch.randn(batch, NUM_MASKS, m, m, generator=g)
    grid = (torch.arange(m, dtype=torch.float32) + 0.5) / m
    cx, cy, w, h = (targets[:, i].view(-1, 1, 1) for i in range(2, 6))
    inside = ((grid.view(1, 1, m) - cx) / (w / 2)).square() + (
        (grid.view(1, m, 1) - cy) / (h / 2)
    ).square() <= 1
    masks = torch.zeros(batch, m, m, dtype=torch.uint8)
    for image in range(batch):
        rows = (targets[:, 0] == image).nonzero().flatten().tolist()
        for k in sorted(range(len(rows)), key=lambda k: -float(inside[rows[k]].sum())):  # larger first
            masks[image][inside[rows[k]]] = k + 1
    preds = ([f.to(device) for f in feats], coefficients.to(device), protos.to(device))
    return preds, targets.to(device), masks.to(device)


def reference_loss(nc: int, device: str, task: str = "detect"):
    os.environ.setdefault("YOLO_OFFLINE", "1")
    from ultralytics.utils.loss import v8DetectionLoss, v8SegmentationLoss

    head = types.SimpleNamespace(
        nc=nc, reg_max=16, no=nc + 64, stride=torch.tensor(STRIDES, dtype=torch.float32)
    )
    anchor = torch.nn.Parameter(torch.zeros(1, device=device))
    hyp = types.SimpleNamespace(box=7.5, cls=0.5, dfl=1.5, overlap_mask=True)
    model = types.SimpleNamespace(args=hyp, model=[head], parameters=lambda: iter([anchor]))
    if task == "segment":
        seg_criterion = v8SegmentationLoss(model)

        def seg_call(preds, targets, masks):
            batch = {
                "batch_idx": targets[:, 0],
                "cls": targets[:, 1:2],
                "bboxes": targets[:, 2:],
                "masks": masks,
            }
            loss, _ = seg_criterion(preds, batch)
            return loss.sum() / preds[0][0].shape[0]

        return seg_call
    criterion = v8DetectionLoss(model)

    def call(feats, targets):
        batch = {"batch_idx": targets[:, 0], "cls": targets[:, 1:2], "bboxes": targets[:, 2:]}
        loss, _ = criterion(feats, batch)
        return loss.sum() / feats[0].shape[0]

    return call


def _call(fn, feats, targets):
    """One forward + backward of ``fn`` on fresh leaves (the timed unit)."""

    def run() -> None:
        leaves = [f.detach().requires_grad_() for f in feats]
        out = fn(leaves, targets)
        (out[0] if isinstance(out, tuple) else out).backward()

    return run


def _seg_call(fn, preds, targets, masks):
    """One forward + backward of a segmentation loss on fresh leaves (maps, coefficients, protos)."""

    def run() -> None:
        maps, coefficients, protos = preds
        leaves = [f.detach().requires_grad_() for f in (*maps, coefficients, protos)]
        out = fn((leaves[:3], leaves[3], leaves[4]), targets, masks)
        (out[0] if isinstance(out, tuple) else out).backward()

    return run


def time_pair(ours, reference, feats, targets, repeats: int, device: str) -> tuple[float, float]:
    """Median seconds of each, calls alternated so that load from other processes hits both alike."""
    t_ours, t_ref = C.alternate(
        [_call(ours, feats, targets), _call(reference, feats, targets)], rounds=repeats, device=device
    )
    return statistics.median(t_ours), statistics.median(t_ref)


def main() -> None:
    parser = C.parser(__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--boxes", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--classes", type=int, default=80)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--task", choices=("detect", "segment"), default="detect")
    parser.add_argument("--keep-host-memory", action="store_true", help="as CPU training does (both sides)")
    args = parser.parse_args()
    if args.keep_host_memory:
        from yolo11_lightning.training.host_memory import keep_freed_host_memory

        if not keep_freed_host_memory():
            parser.error("--keep-host-memory: not available here (needs Linux with glibc)")

    loss_class = SegmentationLoss if args.task == "segment" else DetectionLoss
    ours = loss_class(args.classes).to(args.device)
    reference = reference_loss(args.classes, args.device, args.task)
    C.print_machine_info()
    print(
        f"{args.task} loss forward+backward, batch {args.batch}, {args.imgsz}x{args.imgsz}, {args.classes} classes, "
        f"{args.device}, torch {torch.__version__}, {torch.get_num_threads()} threads, median of {args.repeats}"
        + (", freed host memory kept" if args.keep_host_memory else "")
    )
    print(f"{'boxes/img':>9} | {'ours s':>8} | {'reference s':>11} | {'ours/ref':>8}")
    for boxes in args.boxes:
        if args.task == "segment":
            preds, targets, masks = make_seg_inputs(args.batch, args.imgsz, boxes, args.classes, args.device)
            t_ours, t_ref = map(statistics.median, C.alternate(
                [_seg_call(ours, preds, targets, masks), _seg_call(reference, preds, targets, masks)],
                rounds=args.repeats, device=args.device,
            ))  # fmt: skip
        else:
            feats, targets = make_inputs(args.batch, args.imgsz, boxes, args.classes, args.device)
            t_ours, t_ref = time_pair(ours, reference, feats, targets, args.repeats, args.device)
        print(f"{boxes:>9} | {t_ours:>8.3f} | {t_ref:>11.3f} | {t_ours / t_ref:>8.2f}")


if __name__ == "__main__":
    main()
