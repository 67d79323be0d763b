"""Detection loss forward+backward time, ours vs the reference package's, side by side.

    python benchmarks/loss_speed.py [--batch 16] [--imgsz 640] [--boxes 10 100] [--repeats 5] [--device cpu]

Prints one row per boxes-per-image setting: median seconds per call and ours/reference ratio (< 1 means
ours is faster). The reference (ultralytics, AGPL) is a comparison oracle only, imported here, never
by the package.
"""

from __future__ import annotations

import os
import statistics
import types

import _common as C
import torch

from yolo11_lightning.loss import DetectionLoss

STRIDES = (8, 16, 32)


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


def reference_loss(nc: int, device: str):
    os.environ.setdefault("YOLO_OFFLINE", "1")
    from ultralytics.utils.loss import v8DetectionLoss

    head = types.SimpleNamespace(
        nc=nc, reg_max=16, no=nc + 64, stride=torch.tensor(STRIDES, dtype=torch.float32)
    )
    anchor = torch.nn.Parameter(torch.zeros(1, device=device))
    hyp = types.SimpleNamespace(box=7.5, cls=0.5, dfl=1.5)
    model = types.SimpleNamespace(args=hyp, model=[head], parameters=lambda: iter([anchor]))
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
    args = parser.parse_args()

    ours = DetectionLoss(args.classes).to(args.device)
    reference = reference_loss(args.classes, args.device)
    C.print_machine_info()
    print(
        f"loss forward+backward, batch {args.batch}, {args.imgsz}x{args.imgsz}, {args.classes} classes, "
        f"{args.device}, torch {torch.__version__}, {torch.get_num_threads()} threads, median of {args.repeats}"
    )
    print(f"{'boxes/img':>9} | {'ours s':>8} | {'reference s':>11} | {'ours/ref':>8}")
    for boxes in args.boxes:
        feats, targets = make_inputs(args.batch, args.imgsz, boxes, args.classes, args.device)
        t_ours, t_ref = time_pair(ours, reference, feats, targets, args.repeats, args.device)
        print(f"{boxes:>9} | {t_ours:>8.3f} | {t_ref:>11.3f} | {t_ours / t_ref:>8.2f}")


if __name__ == "__main__":
    main()
