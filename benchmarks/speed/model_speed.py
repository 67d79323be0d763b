"""Model speed: our YOLO11 beside the reference's DetectionModel, same weights, same run.

For each scale and image size, time per image of
  * eval        - ``model.eval()`` forward under ``torch.inference_mode`` (decoded output),
  * eval-fused  - the same after folding BN into the convs (what deployment runs),
  * train       - ``model.train()`` forward + backward of a dummy loss on the level maps,
on the current device (CUDA when present, else CPU). Rounds alternate between the two models so
machine noise hits both alike; the table shows the best round of each (timeit's advice on a shared machine: noise only adds time)
and the ratio ours / reference (< 1: we are faster).

    python benchmarks/speed/model_speed.py                     # n, s at 320 and 640; short on CPU
    python benchmarks/speed/model_speed.py --all --reps 10     # every scale

The reference package (ultralytics, AGPL) is imported here only, as an oracle.
"""

from __future__ import annotations

import copy
import os
import sys
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("YOLO_OFFLINE", "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers (_common, ...)

import _common as C
import torch
from torch import nn

from yolo11_lightning.model_files.weights import load_model


def _eval_step(model: nn.Module, x: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        with torch.inference_mode():
            model(x)

    return step


def _train_step(model: nn.Module, x: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        maps = model(x)
        sum(m.float().square().mean() for m in maps).backward()
        model.zero_grad(set_to_none=True)

    return step


def compare(
    ours: Callable[[], None], ref: Callable[[], None], device: torch.device, warmup: int, reps: int
) -> tuple[float, float]:
    """Best seconds per call of each, measured in alternating rounds."""
    t_ours, t_ref = C.alternate([ours, ref], rounds=reps, warmup=warmup, device=device)
    return min(t_ours), min(t_ref)


def main() -> None:
    parser = C.parser(__doc__.split("\n")[0])
    parser.add_argument("--scales", default="n,s")
    parser.add_argument("--all", action="store_true", help="every scale n,s,m,l,x")
    parser.add_argument("--sizes", default="320,640")
    parser.add_argument("--batch", type=int, default=None, help="default 1 on CPU, 16 on CUDA")
    parser.add_argument("--reps", type=int, default=None, help="default 5 on CPU, 20 on CUDA")
    parser.add_argument("--warmup", type=int, default=None, help="default 1 on CPU, 5 on CUDA")
    parser.add_argument("--modes", default="eval,eval-fused,train")
    args = parser.parse_args()

    from ultralytics.nn.tasks import DetectionModel  # oracle only

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.type == "cuda"
    batch = args.batch or (16 if cuda else 1)
    reps = args.reps or (20 if cuda else 5)
    warmup = args.warmup or (5 if cuda else 1)
    scales = list("nsmlx") if args.all else args.scales.split(",")
    sizes = [int(s) for s in args.sizes.split(",")]
    modes = args.modes.split(",")
    if cuda:
        torch.backends.cudnn.benchmark = True
    C.print_machine_info()
    print(f"batch {batch}; best of {reps} alternating rounds; ms per image")
    print(f"{'scale':<6}{'size':>5}  {'mode':<11}{'ours':>9}{'reference':>11}{'ours/ref':>10}")

    for scale in scales:
        torch.manual_seed(0)
        ref = DetectionModel(f"yolo11{scale}.yaml", nc=80, verbose=False)
        ours = load_model(ref.state_dict())  # same weights
        ref.to(device), ours.to(device)
        for size in sizes:
            x = torch.rand(batch, 3, size, size, device=device)
            for mode in modes:
                if mode == "train":
                    a, b = ours.train(), ref.train()
                    steps = _train_step(a, x), _train_step(b, x)
                else:
                    a, b = ours.eval(), ref.eval()
                    if mode == "eval-fused":
                        a, b = copy.deepcopy(a).fuse(), copy.deepcopy(b).fuse(verbose=False)
                    steps = _eval_step(a, x), _eval_step(b, x)
                t_ours, t_ref = compare(*steps, device, warmup, reps)
                print(
                    f"{scale:<6}{size:>5}  {mode:<11}{1e3 * t_ours / batch:>9.2f}{1e3 * t_ref / batch:>11.2f}"
                    f"{t_ours / t_ref:>10.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
