"""Training throughput: images/s of our real ``fit`` loop beside the oracle trainer, same settings.

    python benchmarks/speed/throughput.py                      # yolo11n at 320; about 3 minutes on 2 cores
    python benchmarks/speed/throughput.py --full   # yolo11n and yolo11s at 320 and 640 (long on CPU)
    python benchmarks/speed/throughput.py --switches   # also ours in NCHW layout (channels_last=False)
    python benchmarks/speed/throughput.py --task segment       # yolo11n-seg on the synthetic segmentation set

Both sides train the same synthetic dataset (mosaic on, reference augmentation) with the same batch,
image size, torch threads and DataLoader workers; warmup and close-mosaic are off on both (the oracle
ramps its accumulation during warmup) and the oracle's CPU overrides (0 workers, cores - 1 threads) are
undone. Each run is a fresh process; the throughput is images over the time of whole accumulation
cycles after the first one. Rounds alternate ours / oracle; the ratio is the median over rounds of
(ours / oracle in that round), so slow phases of a shared machine hit both sides of a ratio alike.
The oracle (ultralytics ``DetectionTrainer``, AGPL; ``SegmentationTrainer`` for ``--task segment``) is
imported in its worker process only.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers (_common, ...)

import _common as C
import _fit as F
import torch


def _settings(args: argparse.Namespace) -> tuple[int, int]:
    accumulate = max(round(64 / args.batch), 1)
    return accumulate, accumulate * (1 + args.cycles)  # (cycle length, batches per run)


def run_ours(args: argparse.Namespace) -> dict[str, Any]:

    torch.set_num_threads(args.threads)
    accumulate, batches = _settings(args)
    # The window steady_rate reads: from the end of the first cycle to the end of the last one.
    stamps_callback, stamps = F.batch_end_stamps(synced=C.window_ends(batches, accumulate, accumulate))
    options = {"channels_last": not args.nchw, "compile": args.compile}
    trainer, module, data = F.our_fit_parts(
        args.yaml, args.scale, args.image_size, args.batch, args.workers, batches // accumulate, args.workdir,
        callbacks=[stamps_callback], module_options=options, task=args.task,
    )  # fmt: skip
    trainer.fit(module, data)
    return {"stamps": stamps, "accumulate": accumulate}  # the module rewrites Lightning's per batch


def run_oracle(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    _, batches = _settings(args)
    trainer = F.oracle_trainer_for(args)
    stamps: list[float] = []

    def stamp(tr: Any) -> bool:
        if len(stamps) in C.window_ends(batches, tr.accumulate, tr.accumulate):  # the window's ends only
            C.sync(tr.device)
        stamps.append(time.perf_counter())
        return len(stamps) >= batches

    F.train_oracle_until(trainer, stamp)
    return {"stamps": stamps, "accumulate": trainer.accumulate}


def main() -> None:
    parser = C.parser(__doc__, worker=("ours", "oracle"), hidden=("--scale", "--yaml", "--workdir"))
    parser.add_argument("--scales", default="n")
    parser.add_argument("--sizes", default="320")
    parser.add_argument("--full", action="store_true", help="scales n,s and sizes 320,640")
    parser.add_argument("--task", choices=("detect", "segment"), default="detect",
                        help="segment: yolo11*-seg on the synthetic segmentation set (YOLO-seg rows)")  # fmt: skip
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each training process")
    parser.add_argument("--workers", type=int, default=1, help="DataLoader workers (both sides)")
    parser.add_argument("--cycles", type=int, default=2, help="measured accumulation cycles per run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--switches", action="store_true", help="add ours with channels_last=False")
    parser.add_argument("--compile", action="store_true", help="add ours with compile=True")
    parser.add_argument("--image-size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--nchw", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if C.run_as_worker(args, {"ours": run_ours, "oracle": run_oracle}):
        return

    scales = ["n", "s"] if args.full else args.scales.split(",")
    sizes = [320, 640] if args.full else [int(s) for s in args.sizes.split(",")]
    accumulate, batches = _settings(args)
    workdir = C.default_workdir()
    variants: list[tuple[str, list[str]]] = [("ours", [])]
    if args.switches:
        variants.append(("ours NCHW", ["--nchw"]))
    if args.compile:
        variants.append(("ours compile", ["--compile"]))
    if C.oracle_available():
        variants.append(("oracle", []))
    C.print_machine_info(args.threads)
    rows = []
    suffix = F.ORACLE_TRAINERS[args.task]
    for scale in scales:
        for size in sizes:
            yaml = C.synthetic_yaml(
                workdir, num_train=max(batches * args.batch, 64), num_val=8, image_size=size, task=args.task
            )
            rates: dict[str, list[float]] = {name: [] for name, _ in variants}
            for r, (name, flags) in C.rounds(variants, args.rounds):
                side = "oracle" if name == "oracle" else "ours"
                worker_args = [
                    side, "--task", args.task, "--scale", scale, "--image-size", str(size), "--batch", str(args.batch),
                    "--threads", str(args.threads), "--workers", str(args.workers), "--cycles",
                    str(args.cycles), "--yaml", str(yaml), "--workdir", str(workdir / "throughput"), *flags,
                ]  # fmt: skip
                out = C.run_worker(__file__, worker_args, args.threads)
                rate = C.steady_rate(
                    out["stamps"], args.batch, skip=out["accumulate"], cycle=out["accumulate"]
                )
                rates[name].append(rate)
                print(f"  yolo11{scale}{suffix} {size} round {r + 1} {name}: {rate:.2f} img/s (load {C.load_average()})",
                      flush=True)  # fmt: skip
            oracle = rates.get("oracle", [])
            for name, _ in variants:
                if name == "oracle":
                    continue
                per_round = [o / t for o, t in zip(rates[name], oracle)]
                rows.append([
                    f"yolo11{scale}{suffix}", size, name, C.median(rates[name]), C.median(oracle) if oracle else float("nan"),
                    f"{C.median(per_round):.2f}" if per_round else "-", f"{C.spread(per_round):.0f}%" if per_round else "-",
                ])  # fmt: skip
    caption = (
        f"images/s of training (batch {args.batch}, accumulate {accumulate}, {args.threads} threads, "
        f"{args.workers} workers, mosaic on), median of {args.rounds} alternating rounds"
    )
    headers = ["model", "size", "variant", "ours img/s", "oracle img/s", "ours/oracle", "± (half range)"]
    C.print_table(caption, headers, rows)
    print(f"\nload average at the end: {C.load_average()}")


if __name__ == "__main__":
    main()
