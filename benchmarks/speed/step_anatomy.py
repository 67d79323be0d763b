"""Step anatomy: where one training step's time goes, ours (the real ``fit`` loop) beside the oracle trainer.

    python benchmarks/speed/step_anatomy.py                        # yolo11n, 320, batch 16; about 2-3 minutes
    python benchmarks/speed/step_anatomy.py --scale s --image-size 640 --rounds 3 --threads 2 --workers 0
    python benchmarks/speed/step_anatomy.py --no-oracle --throughput both   # the Throughput callback on vs off
    python benchmarks/speed/step_anatomy.py --task segment   # yolo11n-seg on the synthetic segmentation set

Per training step (mean over whole accumulation cycles, so the optimiser share is exact), the time in
  data wait        waiting for the DataLoader (0 when the workers keep up),
  to device+float  moving the batch to the device and making float images of the uint8 ones
                   (Lightning's batch_to_device + our model_input / the oracle's preprocess_batch),
  forward          the detector's forward,
  loss+assigner    the detection loss with the task-aligned assigner (``--task segment``: the segmentation
                   loss, its mask term included),
  backward         autograd,
  optimiser+EMA    clipping, optimiser step, zero_grad, EMA update (every ``accumulate`` steps),
  logging+loop     ``self.log``, the progress bar, loggers and the rest of the loop's bookkeeping,
beside the compute floor: the same model's bare forward + backward (a sum of squares of the head maps,
and for segment of the mask coefficients and protos too; no loss, no data), timed inside the same run once per accumulation cycle so load from other processes
hits the floor and the step alike. Overhead = step / floor - 1.

Ours is timed with a Lightning ``Profiler`` that records every hook start/stop plus forward hooks on the
detector and the loss; each event's exclusive time goes to one category. The oracle
(ultralytics ``DetectionTrainer``, AGPL, an oracle only) is timed by wrapping its preprocess, forward,
loss, ``Tensor.backward`` and ``optimizer_step`` (the same for its ``SegmentationTrainer``). Each side runs in
its own process, rounds alternate.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers (_common, ...)

import _common as C
import _fit as F
import torch

from yolo11_lightning.tasks import create_model

CATEGORIES = (
    "data wait", "to device+float", "forward", "loss+assigner", "backward", "optimiser+EMA", "logging+loop",
)  # fmt: skip

# Lightning profiler action (substring) -> category; the first match wins, unmatched time is logging+loop.
OUR_ACTIONS = (
    ("#floor", None),
    ("#forward", "forward"),
    ("#loss", "loss+assigner"),
    ("train_dataloader_next", "data wait"),
    ("#input", "to device+float"),
    ("batch_to_device", "to device+float"),
    ("batch_transfer", "to device+float"),
    ("backward", "backward"),
    ("optimizer_step", "optimiser+EMA"),
    ("zero_grad", "optimiser+EMA"),
    ("gradient_clipping", "optimiser+EMA"),
    ("ModelEMA.on_train_batch_end", "optimiser+EMA"),
)


# ------------------------------------------------------------------------------------ floor
def head_tensors(output: Any) -> list[torch.Tensor]:
    """Every tensor of a train-mode output: the level maps (detect), plus coefficients and protos (segment)."""
    if isinstance(output, torch.Tensor):
        return [output]
    return [t for item in output for t in head_tensors(item)]


def bare_step(model: torch.nn.Module, batch: int, image_size: int, channels_last: bool) -> Callable[[], None]:
    """The compute floor: forward + backward of a sum of squares of the head maps (model_speed's train step)."""
    device = next(model.parameters()).device
    x = torch.rand(batch, 3, image_size, image_size, device=device)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)

    def step() -> None:
        maps = head_tensors(model(x))
        sum(m.float().square().mean() for m in maps).backward()
        model.zero_grad(set_to_none=True)

    return step


# ------------------------------------------------------------------------------------ cycles
def cycles(
    steps: list[dict[str, float]], floors: list[float], worker_cpu: list[float], skip: int, cycle: int
) -> list[dict[str, float]]:
    """One record per whole accumulation cycle after the first ``skip`` steps.

    Each holds the mean per step of every category and of the step, the floor timed at the end of that
    cycle, and the DataLoader workers' CPU seconds per step over the cycle (``worker_cpu`` is cumulative,
    sampled at the end of each cycle).
    """
    out = []
    for k in range(skip // cycle, len(steps) // cycle):
        chunk = steps[k * cycle : (k + 1) * cycle]
        record = {c: sum(s.get(c, 0.0) for s in chunk) / cycle for c in (*CATEGORIES, "step")}
        record["floor"] = floors[k] if k < len(floors) else float("nan")
        cpu = worker_cpu[k] - worker_cpu[k - 1] if 0 < k < len(worker_cpu) else float("nan")
        record["worker cpu"] = cpu / cycle
        out.append(record)
    if not out:
        raise ValueError(f"only {len(steps)} steps recorded; need more than {skip} + {cycle}")
    return out


# ------------------------------------------------------------------------------------ ours
def run_ours(args: argparse.Namespace) -> dict[str, Any]:
    import lightning as L
    from lightning.pytorch.profilers import Profiler

    torch.set_num_threads(args.threads)

    class EventRecorder(Profiler):
        """Every profiled action's start and stop, in order."""

        def __init__(self) -> None:
            super().__init__()
            self.events: list[tuple[float, bool, str]] = []

        def start(self, action_name: str) -> None:
            self.events.append((time.perf_counter(), True, action_name))

        def stop(self, action_name: str) -> None:
            self.events.append((time.perf_counter(), False, action_name))

        def summary(self) -> str:
            return ""

    # The recipe's nominal-batch rule (warmup, which ramps it, is off). The module rewrites Lightning's
    # accumulate_grad_batches batch by batch, so that cannot tell the cycle length.
    accumulate = max(round(64 / args.batch), 1)
    recorder = EventRecorder()
    floor_model: list[Any] = []
    worker_cpu: list[float] = []

    class Floor(L.Callback):
        """Once per accumulation cycle, time the bare forward + backward (excluded from the step)."""

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if (batch_idx + 1) % accumulate:
                return
            if not floor_model:
                model = create_model(args.scale, pl_module.hparams.num_classes, task=args.task)
                model = model.to(pl_module.device).train()
                if not args.nchw:  # the floor runs in the layout of the module measured
                    model = model.to(memory_format=torch.channels_last)
                floor_model.append(bare_step(model, args.batch, args.image_size, not args.nchw))
            worker_cpu.append(F.children_cpu_seconds())
            recorder.start("#floor")
            C.sync(pl_module.device)
            floor_model[0]()
            C.sync(pl_module.device)
            recorder.stop("#floor")

    from yolo11_lightning.training.callbacks.throughput import Throughput

    trainer, module, data = F.our_fit_parts(
        args.yaml, args.scale, args.image_size, args.batch, args.workers, args.steps // accumulate, args.workdir,
        callbacks=[Floor()], trainer_options={"profiler": recorder},
        module_options={"channels_last": not args.nchw, "compile": args.compile},
        without=(Throughput,) if args.no_throughput else (), task=args.task,
    )  # fmt: skip

    def hooks(module_: torch.nn.Module, name: str) -> None:
        module_.register_forward_pre_hook(lambda *_: recorder.start(name))
        module_.register_forward_hook(lambda *_: recorder.stop(name))

    hooks(module.model, "#forward")
    hooks(module.criterion, "#loss")
    to_input = module.model_input

    def timed_input(images: torch.Tensor) -> torch.Tensor:  # the uint8 -> float conversion on the device
        recorder.start("#input")
        try:
            return to_input(images)
        finally:
            recorder.stop("#input")

    module.model_input = timed_input
    trainer.fit(module, data)
    steps, floors = our_steps(recorder.events)
    return {
        "steps": steps,
        "floors": floors,
        "worker_cpu": worker_cpu,
        "accumulate": accumulate,
    }


def _category(action: str) -> str | None:
    for key, category in OUR_ACTIONS:
        if key in action:
            return category
    return "logging+loop"


def our_steps(events: list[tuple[float, bool, str]]) -> tuple[list[dict[str, float]], list[float]]:
    """Split the event stream at each ``train_dataloader_next`` start; exclusive time per category."""
    starts = [i for i, (_, first, name) in enumerate(events) if first and "train_dataloader_next" in name]
    # The last step ends with its last on_train_batch_end hook (no next fetch follows it).
    ends = [i for i, (_, first, name) in enumerate(events) if not first and "on_train_batch_end" in name]
    if starts and ends and ends[-1] > starts[-1]:
        events = [*events[: ends[-1] + 1], (events[ends[-1]][0], True, "#end")]
        starts.append(len(events) - 1)
    steps, floors = [], []
    for a, b in itertools.pairwise(starts):
        totals: dict[str, float] = defaultdict(float)
        stack: list[tuple[str, float, float]] = []  # (name, start, time of children)
        floor = 0.0
        for t, is_start, name in events[a:b]:
            if is_start:
                stack.append((name, t, 0.0))
                continue
            while stack and stack[-1][0] != name:  # an unmatched start (should not happen): drop it
                stack.pop()
            if not stack:
                continue
            _, t0, children = stack.pop()
            inclusive = t - t0
            if stack:
                parent = stack[-1]
                stack[-1] = (parent[0], parent[1], parent[2] + inclusive)
            category = _category(name)
            if category is None:
                floor += inclusive
            else:
                totals[category] += inclusive - children
        wall = events[b][0] - events[a][0] - floor
        totals["logging+loop"] += wall - sum(totals.values())  # unprofiled loop time
        totals["step"] = wall
        steps.append(dict(totals))
        if floor:
            floors.append(floor)
    return steps, floors


# ------------------------------------------------------------------------------------ oracle
def run_oracle(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    trainer = F.oracle_trainer_for(args)
    from ultralytics.nn.tasks import DetectionModel, SegmentationModel

    model_class = SegmentationModel if args.task == "segment" else DetectionModel
    model_yaml = f"yolo11{args.scale}{F.ORACLE_TRAINERS[args.task]}.yaml"

    clock: dict[str, float] = defaultdict(float)
    steps: list[dict[str, float]] = []
    floors: list[float] = []
    worker_cpu: list[float] = []
    state: dict[str, Any] = {"end": None, "start": None, "floor": None}

    def timed(fn: Callable, category: str) -> Callable:
        def wrapper(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                clock[category] += time.perf_counter() - t0

        return wrapper

    original_backward = torch.Tensor.backward
    torch.Tensor.backward = timed(original_backward, "backward")  # the oracle's loop calls loss.backward()

    def on_start(tr: Any) -> None:  # the model exists now: wrap its forward and loss
        model = tr.model
        model.predict = timed(model.predict, "forward")
        model.loss = timed(model.loss, "#loss-with-forward")
        tr.preprocess_batch = timed(tr.preprocess_batch, "to device+float")
        tr.optimizer_step = timed(tr.optimizer_step, "optimiser+EMA")
        nc = tr.data["nc"]
        floor_net = model_class(model_yaml, nc=nc, verbose=False).to(tr.device).train()
        state["floor"] = bare_step(floor_net, args.batch, args.image_size, False)
        state["end"] = time.perf_counter()

    def on_batch_start(tr: Any) -> None:
        clock.clear()
        state["start"] = time.perf_counter()
        clock["data wait"] = state["start"] - state["end"]

    def on_batch_end(tr: Any) -> bool:
        end = time.perf_counter()
        step = dict(clock)
        step["loss+assigner"] = step.pop("#loss-with-forward", 0.0) - step.get("forward", 0.0)
        step["step"] = end - state["end"]
        step["logging+loop"] = step["step"] - sum(step.get(c, 0.0) for c in CATEGORIES[:-1])
        steps.append(step)
        if len(steps) % tr.accumulate == 0:
            worker_cpu.append(F.children_cpu_seconds())
            floors.append(C.time_call(state["floor"], tr.device))
        if len(steps) >= args.steps:
            return True
        state["end"] = time.perf_counter()
        return False

    trainer.add_callback("on_train_start", on_start)
    trainer.add_callback("on_train_batch_start", on_batch_start)
    try:
        F.train_oracle_until(trainer, on_batch_end)
    finally:
        torch.Tensor.backward = original_backward
    return {"steps": steps, "floors": floors, "worker_cpu": worker_cpu, "accumulate": trainer.accumulate}


# ------------------------------------------------------------------------------------ parent
def main() -> None:
    parser = C.parser(__doc__, worker=("ours", "oracle"), hidden=("--yaml", "--workdir"))
    parser.add_argument("--task", choices=("detect", "segment"), default="detect",
                        help="segment: yolo11*-seg on the synthetic segmentation set (YOLO-seg rows)")  # fmt: skip
    parser.add_argument("--scale", default="n")
    parser.add_argument("--image-size", type=int, default=320)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the training process")
    parser.add_argument("--workers", type=int, default=1, help="DataLoader workers (both sides)")
    parser.add_argument("--cycles", type=int, default=2, help="measured accumulation cycles per run")
    parser.add_argument("--rounds", type=int, default=2, help="runs per side, alternating")
    parser.add_argument("--nchw", action="store_true", help="ours with channels_last=False (NCHW)")
    parser.add_argument("--compile", action="store_true", help="ours with compile=True")
    parser.add_argument("--no-oracle", action="store_true")
    parser.add_argument(
        "--throughput", choices=("on", "off", "both"), default="on",
        help="ours with the Throughput callback (a default callback), without it, or both as two sides",
    )  # fmt: skip
    parser.add_argument("--no-throughput", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if C.run_as_worker(args, {"ours": run_ours, "oracle": run_oracle}):
        return

    accumulate = max(round(64 / args.batch), 1)
    skip = accumulate  # the first cycle warms allocator and caches up
    steps = skip + args.cycles * accumulate
    workdir = C.default_workdir()
    yaml = C.synthetic_yaml(
        workdir, num_train=max(steps * args.batch, 64), num_val=8, image_size=args.image_size, task=args.task
    )
    common = [
        "--task", args.task, "--scale", args.scale, "--image-size", str(args.image_size), "--batch", str(args.batch),
        "--threads", str(args.threads), "--workers", str(args.workers), "--yaml", str(yaml),
        "--steps", str(steps), "--workdir", str(workdir / "anatomy"),
    ]  # fmt: skip
    ours_flags = [
        *(["--nchw"] if args.nchw else []),
        *(["--compile"] if args.compile else []),
    ]
    sides = ["ours"] + ([] if args.no_oracle or not C.oracle_available() else ["oracle"])
    if args.throughput == "both":  # "oracle" column: ours without the callback
        sides = ["ours", "ours-off"]
    elif args.throughput == "off":
        ours_flags.append("--no-throughput")
    C.print_machine_info(args.threads)
    results: dict[str, list[dict[str, float]]] = {s: [] for s in sides}
    for r, side in C.rounds(sides, args.rounds):
        flags = (
            ours_flags if side == "ours" else [*ours_flags, "--no-throughput"] if side == "ours-off" else []
        )
        worker = "ours" if side.startswith("ours") else side
        out = C.run_worker(__file__, [worker, *common, *flags], args.threads)
        runs = cycles(out["steps"], out["floors"], out["worker_cpu"], skip, out["accumulate"])
        results[side] += runs
        step, floor = C.median([c["step"] for c in runs]), C.median([c["floor"] for c in runs])
        print(f"  round {r + 1} {side}: {step * 1e3:.0f} ms/step, floor {floor * 1e3:.0f} ms "
              f"(load {C.load_average()})", flush=True)  # fmt: skip
    print_report(args, results, accumulate)


def print_report(
    args: argparse.Namespace, results: dict[str, list[dict[str, float]]], accumulate: int
) -> None:
    """Medians over all measured accumulation cycles of all runs of a side."""

    other = "ours-off" if "ours-off" in results else "oracle"

    def figure(side: str, key: str) -> float:
        side = other if side == "oracle" else side
        return C.median([c[key] for c in results.get(side, [])])

    def overhead(side: str, minus: str | None = None) -> float:
        side = other if side == "oracle" else side
        ratios = [(c["step"] - (c[minus] if minus else 0.0)) / c["floor"] - 1 for c in results.get(side, [])]
        return 100 * C.median(ratios)

    switches = [s for s, on in (("NCHW", args.nchw), ("compile", args.compile)) if on]
    caption = (
        f"yolo11{args.scale}{F.ORACLE_TRAINERS[args.task]}, {args.image_size}x{args.image_size}, batch {args.batch} (accumulate {accumulate}), "
        f"{args.threads} threads, {args.workers} workers{', ours with ' + ' + '.join(switches) if switches else ''}; "
        f"ms per step (mean over an accumulation cycle), median of {len(results['ours'])} cycles from "
        f"{args.rounds} runs per side"
    )
    rows = []
    ours_step, ref_step = figure("ours", "step"), figure("oracle", "step")
    for category in CATEGORIES:
        o, t = figure("ours", category), figure("oracle", category)
        rows.append([category, 1e3 * o, f"{100 * o / ours_step:.1f}%", 1e3 * t, C.ratio(o, t)])
    rows.append(["**step**", 1e3 * ours_step, "100%", 1e3 * ref_step, C.ratio(ours_step, ref_step)])
    fo, ft = figure("ours", "floor"), figure("oracle", "floor")
    rows.append(["bare fwd+bwd (floor)", 1e3 * fo, f"{100 * fo / ours_step:.1f}%", 1e3 * ft, C.ratio(fo, ft)])
    rows.append(["**overhead over floor**", f"{overhead('ours'):.1f}%", "", f"{overhead('oracle'):.1f}%", ""])
    rows.append(["  without data wait", f"{overhead('ours', 'data wait'):.1f}%", "",
                 f"{overhead('oracle', 'data wait'):.1f}%", ""])  # fmt: skip
    wo, wt = figure("ours", "worker cpu"), figure("oracle", "worker cpu")
    rows.append(["worker CPU per step", 1e3 * wo, "", 1e3 * wt, C.ratio(wo, wt)])
    right = "without Throughput" if other == "ours-off" else "oracle"
    C.print_table(caption, ["", "ours ms", "share", f"{right} ms", f"ours/{right}"], rows)
    noise = {s: C.spread([c["step"] / c["floor"] for c in results[s]]) for s in results}
    print(
        "\nspread of step/floor over cycles (half range / median): "
        + ", ".join(f"{s} {n:.1f}%" for s, n in noise.items())
        + f"; load average now {C.load_average()}"
    )


if __name__ == "__main__":
    main()
