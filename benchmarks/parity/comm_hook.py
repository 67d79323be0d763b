"""Gradient compression in DDP: how far a bf16 / fp16 all-reduce moves the training trajectory (2 gloo ranks).

    python benchmarks/parity/comm_hook.py   # yolo11n, 96 px, global batch 16, 40 SGD steps; ~10 minutes
    python benchmarks/parity/comm_hook.py --steps 60 --image-size 64

The same short training runs once per variant through the real ``fit`` loop (Lightning ``DDPStrategy`` on 2
gloo ranks, one thread each, data loaded in the rank's own process, an optimiser step every batch, SGD, no
warmup, fixed seed, the synthetic shapes dataset): ``none`` is DDP's own fp32 all-reduce; ``fp32 noise``
the same all-reduce with every averaged gradient then moved by one float32 ulp up or down (seeded, the same
on both ranks): the size of the difference another reduction order makes (NCCL's ring against its tree, another
world size, non-deterministic GPU kernels do that at every op), the floor of run-to-run float noise;
``fp16`` and ``bf16`` are torch's ``fp16_compress_hook`` / ``bf16_compress_hook``: the gradient bucket is cast
to 16 bits, all-reduced (half the bytes on the wire) and cast back. Lightning registers ``ddp_comm_hook`` on
CUDA only, so the worker registers it on the gloo model the same way.

Printed per reported step, for each variant against ``none``: the relative difference of the loss (the global
box + cls + dfl loss of that batch, computed before that step's update), and of the raw parameters:
``|Δθ|/|θ|`` over all parameters as one vector, the largest and the mean of that ratio per tensor, and
``|Δθ|/|θ - θ0|``, the difference as a share of the distance training has moved the weights from their
initialisation. Also the largest |averaged gradient| of the run (fp16 overflows above 65504).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers (_common, ...)

import _common as C
import _fit as F
import torch

VARIANTS = ("none", "fp32 noise", "fp16", "bf16")
TRAIN_IMAGES = 160  # 10 global batches of 16 per epoch


def fp32_noise_hook(state, bucket):  # no annotations: DDP checks them against dist.GradBucket at run time
    """DDP's fp32 all-reduce, then each averaged gradient moved by one float32 ulp up or down at random."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    generator = fp32_noise_hook.generator

    def perturb(future: torch.futures.Future) -> torch.Tensor:
        grad = future.value()[0]
        up = torch.rand(grad.shape, generator=generator) < 0.5
        inf = torch.tensor(math.inf, dtype=grad.dtype)
        return grad.copy_(torch.where(up, torch.nextafter(grad, inf), torch.nextafter(grad, -inf)))

    return allreduce_hook(state, bucket).then(perturb)


fp32_noise_hook.generator = torch.Generator().manual_seed(0)


def hook_of(variant: str):  # type: ignore[no-untyped-def]
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return {
        "none": None,
        "fp32 noise": fp32_noise_hook,
        "fp16": default_hooks.fp16_compress_hook,
        "bf16": default_hooks.bf16_compress_hook,
    }[variant]


def run_variant(args: argparse.Namespace) -> None:
    """One training run on 2 gloo ranks (Lightning's launcher starts rank 1 as this same command)."""
    import lightning as L
    from lightning.pytorch.strategies import DDPStrategy

    torch.set_num_threads(1)
    report = set(report_steps(args.steps))
    losses: list[float] = []
    snapshots: dict[int, dict[str, torch.Tensor]] = {}
    largest_gradient = [0.0]

    class Record(L.Callback):
        def on_fit_start(self, trainer, pl_module) -> None:  # type: ignore[no-untyped-def]
            snapshots[0] = {k: v.detach().clone() for k, v in pl_module.model.named_parameters()}
            hook = hook_of(args.variant)
            if hook is not None:  # what DDPStrategy._register_ddp_hooks does on CUDA
                trainer.strategy.model.register_comm_hook(state=None, hook=hook)

        def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:  # type: ignore[no-untyped-def]
            grads = [p.grad.abs().max() for p in pl_module.model.parameters() if p.grad is not None]
            largest_gradient[0] = max(largest_gradient[0], float(torch.stack(grads).max()))

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:  # type: ignore[no-untyped-def]
            metrics = trainer.callback_metrics
            losses.append(sum(float(metrics[f"train/{n}_loss"]) for n in ("box", "cls", "dfl")))
            if trainer.global_step in report:
                state = {k: v.detach().clone() for k, v in pl_module.model.named_parameters()}
                snapshots[trainer.global_step] = state

    from yolo11_lightning.training.callbacks.checkpoints import BestCheckpoint, LastCheckpoint

    L.seed_everything(0)  # the same initial weights in every variant
    global_batch = 2 * args.per_rank_batch
    strategy = DDPStrategy(
        process_group_backend="gloo", find_unused_parameters=False, gradient_as_bucket_view=True
    )
    trainer, module, data = F.our_fit_parts(
        args.yaml, "n", args.image_size, global_batch, 0, args.steps, args.workdir, callbacks=[Record()],
        module_options={"optimizer": "SGD", "nominal_batch": global_batch},
        trainer_options={
            "accelerator": "cpu", "devices": 2, "strategy": strategy, "enable_progress_bar": False,
            "enable_checkpointing": False,
            # The LR decays linearly over max_epochs (to lrf = 1% of lr0): over the whole run, not its first epoch.
            "max_epochs": math.ceil(args.steps * global_batch / TRAIN_IMAGES),
        },
        without=(BestCheckpoint, LastCheckpoint),
    )  # fmt: skip
    trainer.fit(module, data)
    if trainer.is_global_zero:
        out = Path(args.workdir) / f"{args.variant.replace(' ', '_')}.pt"
        skipped = module.step_guard.skipped
        torch.save({"snapshots": snapshots, "losses": losses, "largest_gradient": largest_gradient[0],
                    "skipped": skipped}, out)  # fmt: skip
        C.emit({"file": str(out)})


def report_steps(steps: int) -> list[int]:
    """The steps the table shows: 1, 2, 5, 10, then every 10, and the last."""
    return sorted({s for s in (1, 2, 5, *range(10, steps + 1, 10), steps) if s <= steps})


def differences(
    reference: dict[str, torch.Tensor], other: dict[str, torch.Tensor], start: dict[str, torch.Tensor]
) -> tuple[float, float, float, float]:
    """(|Δθ|/|θ| over all parameters, largest and mean of it per tensor, |Δθ|/|θ - θ0|)."""
    per_tensor = [
        float((other[k] - ref).norm() / ref.norm().clamp(min=1e-12)) for k, ref in reference.items()
    ]
    delta = math.sqrt(sum(float((other[k] - ref).square().sum()) for k, ref in reference.items()))
    norm = math.sqrt(sum(float(ref.square().sum()) for ref in reference.values()))
    moved = math.sqrt(sum(float((ref - start[k]).square().sum()) for k, ref in reference.items()))
    return delta / norm, max(per_tensor), sum(per_tensor) / len(per_tensor), delta / max(moved, 1e-30)


def main() -> None:
    parser = C.parser(__doc__, worker=True, hidden=("--yaml", "--workdir", "--variant"))
    parser.add_argument("--steps", type=int, default=40, help="optimiser steps per run")
    parser.add_argument("--image-size", type=int, default=96)
    parser.add_argument("--per-rank-batch", type=int, default=8)
    parser.add_argument("--reuse", action="store_true", help="tabulate the runs already in the work folder")
    args = parser.parse_args()
    if C.run_as_worker(args, run_variant):
        return

    workdir = C.default_workdir() / "comm_hook"
    workdir.mkdir(parents=True, exist_ok=True)
    yaml = C.synthetic_yaml(
        C.default_workdir(), num_train=TRAIN_IMAGES, num_val=8, image_size=args.image_size
    )
    C.print_machine_info(1)
    runs = {}
    for variant in VARIANTS:
        file = workdir / f"{variant.replace(' ', '_')}.pt"
        if not args.reuse:
            C.run_worker(__file__, [
                "--variant", variant, "--steps", str(args.steps), "--image-size", str(args.image_size),
                "--per-rank-batch", str(args.per_rank_batch), "--yaml", str(yaml), "--workdir", str(workdir),
            ], threads=1)  # fmt: skip
            print(f"  {variant}: done (load {C.load_average()})", flush=True)
        runs[variant] = torch.load(file, weights_only=True)

    base = runs["none"]
    start = base["snapshots"][0]
    rows = []
    for variant in VARIANTS[1:]:
        run = runs[variant]
        for step in report_steps(args.steps):
            ref_loss, loss = base["losses"][step - 1], run["losses"][step - 1]
            rows.append([
                variant, step, abs(loss - ref_loss) / abs(ref_loss),
                *differences(base["snapshots"][step], run["snapshots"][step], start),
            ])  # fmt: skip
    caption = (
        f"yolo11n, {args.image_size} px, global batch {2 * args.per_rank_batch} on 2 gloo ranks, {TRAIN_IMAGES} "
        f"images, SGD lr 0.01 momentum 0.937 decaying linearly over the run, no warmup, seed 0, an optimiser step "
        f"every batch; each variant against `none` "
        f"(loss: the batch's loss before that step's update)"
    )
    headers = ["all-reduce", "step", "loss rel. diff", "|Δθ|/|θ|", "max per tensor", "mean per tensor",
               "|Δθ|/|θ-θ0|"]  # fmt: skip
    C.print_table(caption, headers, rows)
    last = min(10, args.steps)
    C.print_table(
        f"Per run: the loss at step 1 and over the last {last} steps (mean of one batch each), the largest "
        "|averaged gradient| (fp16's largest value is 65504), NaN/inf steps skipped",
        ["all-reduce", "loss, step 1", f"loss, last {last} steps", "largest |gradient|", "skipped steps"],
        [[v, runs[v]["losses"][0], sum(runs[v]["losses"][-last:]) / last, runs[v]["largest_gradient"],
          runs[v].get("skipped", "-")] for v in VARIANTS],
    )  # fmt: skip


if __name__ == "__main__":
    main()
