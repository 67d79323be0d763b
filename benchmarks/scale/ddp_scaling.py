"""DDP weak scaling on CPU: 1 rank vs 2 ranks (gloo), one thread each, the same batch per rank.

    python benchmarks/scale/ddp_scaling.py   # yolo11n, 320, 16 images per rank; about 2 minutes
    python benchmarks/scale/ddp_scaling.py --per-rank-batch 8 --image-size 256 --rounds 3

Both runs go through the real ``fit`` loop (Lightning ``DDPStrategy`` with the options of
configs/trainer/ddp_8gpu.yaml - no unused-parameter search, gradients as bucket views - on gloo), data
loaded in each rank's own process (0 workers) so that each rank uses exactly one core, no validation,
and one optimiser step per batch (``nominal_batch`` = the global batch): every step all-reduces the gradients, plus the loss
normaliser and the logged loss terms (the world-size-invariant loss needs both). Images/s come from rank
0's step end times over the steps after ``--skip``. Efficiency = images/s on 2 ranks / (2 x images/s on 1).
Rounds alternate 1 and 2 ranks; on a shared machine, other processes on the two cores show as lost
efficiency (the load average is printed with every run).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers (_common, ...)

import _common as C
import _fit as F
import torch


def run_ours(args: argparse.Namespace) -> None:
    import lightning as L
    from lightning.pytorch.strategies import DDPStrategy

    torch.set_num_threads(1)
    stamps: list[float] = []
    cpu: list[float] = []

    class Stamps(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            stamps.append(time.perf_counter())
            cpu.append(time.process_time())  # this rank's CPU seconds, all its threads (gloo's included)

    global_batch = args.per_rank_batch * args.devices
    # The options of configs/trainer/ddp_8gpu.yaml, on gloo.
    strategy = DDPStrategy(
        process_group_backend="gloo", find_unused_parameters=False, gradient_as_bucket_view=True
    ) if args.devices > 1 else "auto"  # fmt: skip
    trainer, module, data = F.our_fit_parts(
        args.yaml, args.scale, args.image_size, global_batch, 0, args.skip + args.steps, args.workdir,
        callbacks=[Stamps()], module_options={"nominal_batch": global_batch},
        trainer_options={
            "accelerator": "cpu", "devices": args.devices, "strategy": strategy,
            "enable_progress_bar": False,
        },
    )  # fmt: skip
    if (
        args.without_stop_check
    ):  # LastCheckpoint agrees on stop signals (one scalar all-reduce) per optimiser step
        from yolo11_lightning.training.callbacks.checkpoints import LastCheckpoint

        trainer.callbacks = [c for c in trainer.callbacks if not isinstance(c, LastCheckpoint)]
    trainer.fit(module, data)
    if trainer.is_global_zero:
        rate = C.steady_rate(stamps, global_batch, skip=args.skip)
        cpu_per_step = (cpu[-1] - cpu[args.skip - 1]) / (len(cpu) - args.skip)
        C.emit({"rate": rate, "cpu_per_step": cpu_per_step})


def compare_stop_check(args: argparse.Namespace, yaml, workdir) -> None:
    """2 ranks with and without the stop-signal agreement, alternating; an optimiser step every batch (worst case)."""
    rates: dict[bool, list[float]] = {True: [], False: []}
    for r, with_check in C.rounds((True, False), args.rounds):
        out = C.run_worker(__file__, [
            "--devices", "2", "--scale", args.scale, "--image-size", str(args.image_size),
            "--per-rank-batch", str(args.per_rank_batch), "--steps", str(args.steps), "--skip", str(args.skip),
            "--yaml", str(yaml), "--workdir", str(workdir / "ddp-stop"),
            *([] if with_check else ["--without-stop-check"]),
        ], threads=1)  # fmt: skip
        rates[with_check].append(out["rate"])
        print(f"  round {r + 1}, stop check {'on' if with_check else 'off'}: {out['rate']:.2f} img/s "
              f"(load {C.load_average()})", flush=True)  # fmt: skip
    on, off = C.median(rates[True]), C.median(rates[False])
    rows = [["stop check on", on, f"{on / off:.3f}"], ["stop check off", off, "1.000"]]
    print(C.format_table(["2 gloo ranks", "img/s", "ratio"], rows))


def main() -> None:
    parser = C.parser(__doc__, worker=True, hidden=("--yaml", "--workdir"))
    parser.add_argument("--scale", default="n")
    parser.add_argument("--image-size", type=int, default=320)
    parser.add_argument(
        "--per-rank-batch", type=int, default=16,
        help="16 or more keeps every mosaic partner pool on its rank (see data.dataset.partner_stride); "
        "with 8 per rank the pools of a 16-image global batch span both ranks and each rank decodes some of "
        "the other's images too",
    )  # fmt: skip
    parser.add_argument("--steps", type=int, default=8, help="measured steps per run")
    parser.add_argument("--skip", type=int, default=2, help="warm-up steps left out")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--stop-check", action="store_true",
        help="instead of 1 vs 2 ranks: 2 ranks with vs without LastCheckpoint's per-step stop-signal agreement",
    )  # fmt: skip
    parser.add_argument("--without-stop-check", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--devices", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if C.run_as_worker(args, run_ours):
        return

    workdir = C.default_workdir()
    images = (args.skip + args.steps + 1) * args.per_rank_batch * 2
    yaml = C.synthetic_yaml(workdir, num_train=max(images, 64), num_val=8, image_size=args.image_size)
    C.print_machine_info(1)
    if args.stop_check:
        compare_stop_check(args, yaml, workdir)
        return
    rates: dict[int, list[float]] = {1: [], 2: []}
    cpu: dict[int, list[float]] = {1: [], 2: []}
    for r, devices in C.rounds((1, 2), args.rounds):
        out = C.run_worker(
            __file__,
            [
                "--devices", str(devices), "--scale", args.scale, "--image-size", str(args.image_size),
                "--per-rank-batch", str(args.per_rank_batch), "--steps", str(args.steps), "--skip",
                str(args.skip), "--yaml", str(yaml), "--workdir", str(workdir / f"ddp{devices}"),
            ],
            threads=1,
        )  # fmt: skip
        rates[devices].append(out["rate"])
        cpu[devices].append(out["cpu_per_step"])
        print(f"  round {r + 1}, {devices} rank(s): {out['rate']:.2f} img/s, rank 0 CPU {out['cpu_per_step']:.2f} "
              f"s/step (load {C.load_average()})", flush=True)  # fmt: skip
    one, two = C.median(rates[1]), C.median(rates[2])
    per_round = [b / (2 * a) for a, b in zip(rates[1], rates[2])]
    caption = (
        f"yolo11{args.scale}, {args.image_size}x{args.image_size}, {args.per_rank_batch} images per rank, gloo, "
        f"1 thread per rank, 0 workers, an optimiser step (gradient all-reduce) every batch; "
        f"median of {args.rounds} alternating rounds"
    )
    cpu_one, cpu_two = C.median(cpu[1]), C.median(cpu[2])
    rows = [
        ["1 rank", args.per_rank_batch, one, "1.00", "100%", cpu_one, "100%"],
        ["2 ranks", 2 * args.per_rank_batch, two, f"{two / one:.2f}", f"{100 * C.median(per_round):.0f}%",
         cpu_two, f"{100 * cpu_one / cpu_two:.0f}%"],
    ]  # fmt: skip
    headers = [
        "run",
        "global batch",
        "img/s",
        "speed-up",
        "efficiency",
        "CPU s/step (rank 0)",
        "CPU efficiency",
    ]
    C.print_table(caption, headers, rows)
    print(
        "\nCPU efficiency = CPU seconds per step on 1 rank / on rank 0 of 2 ranks (same work per rank): the "
        "work DDP adds (gloo all-reduces, bucketing), blind to time lost waiting for a core, which the "
        "wall-clock efficiency includes."
    )
    print(
        f"\nefficiency per round: {', '.join(f'{100 * e:.0f}%' for e in per_round)}; "
        f"load average at the end {C.load_average()} (other processes on the 2 cores count against the 2-rank run)"
    )


if __name__ == "__main__":
    main()
