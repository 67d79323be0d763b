"""GPU training figures: mixed precision, channels_last and torch.compile on/off; peak memory; host syncs.

    python benchmarks/gpu.py                     # needs CUDA; yolo11n at 640, batch 64; about 5 minutes
    python benchmarks/gpu.py --scale s --batch 32 --memory-scales n,s,m,l,x --memory-batches 16,32,64
    python benchmarks/gpu.py --cpu-smoke         # the same code paths on CPU at toy sizes (no figures)

Sections (each variant in a fresh process, so compile caches and memory counters start clean):
  1. step throughput through the real ``fit`` loop, fed from batches held in memory (the data pipeline
     would otherwise set the pace), for: fp32, bf16-mixed, bf16-mixed + channels_last, the same with
     ``compile``, and 16-mixed + channels_last. images/s over the steps after a warm-up (compile happens
     there);
  2. the same loop on the real data pipeline (mosaic, ``--workers`` loader processes), ours with
     16-mixed beside the oracle trainer with AMP (fp16 autocast), same batch and workers;
  3. peak GPU memory (``max_memory_allocated``) of a training step (forward, loss, backward, SGD step)
     per scale and batch, bf16-mixed;
  4. host syncs of the training step: the CUDA sync debug mode in "warn" during a few steps after
     warm-up, counted by the source line that asked (Lightning's progress bar reads the logged losses
     once per step, and the NaN/inf guard reads one flag per optimiser step: those are expected).
Not run by the test suite; prints "no CUDA" and exits when there is no GPU (unless --cpu-smoke).
"""

from __future__ import annotations

import argparse
import time
import traceback
import warnings
from collections import Counter
from typing import Any

import _common as C
import _fit as F
import torch

THROUGHPUT_VARIANTS = (
    # name, precision, channels_last, compile
    ("fp32", "32-true", False, False),
    ("bf16-mixed", "bf16-mixed", False, False),
    ("bf16 + channels_last", "bf16-mixed", True, False),
    ("bf16 + channels_last + compile", "bf16-mixed", True, True),
    ("fp16-mixed + channels_last", "16-mixed", True, False),
)


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


# ------------------------------------------------------------------------------------ in-memory data
def memory_datamodule(args: argparse.Namespace) -> Any:
    """A DataModule serving ``--held-batches`` real training batches from memory, over and over."""
    import lightning as L
    from torch.utils.data import DataLoader

    from yolo11_lightning import YOLODataModule

    source = YOLODataModule(
        dataset=args.yaml, batch_size=args.batch, image_size=args.image_size, num_workers=0, seed=0
    )
    source.setup("fit")
    loader = iter(source.train_dataloader())
    held = [next(loader) for _ in range(args.held_batches)]
    steps = args.warmup + args.steps

    class Held(L.LightningDataModule):
        batch_size = args.batch
        num_classes = source.num_classes
        class_names = source.class_names
        num_train_samples = source.num_train_samples  # optimizer 'auto' decides from it, as on real data

        def train_dataloader(self) -> DataLoader:
            batches = [held[i % len(held)] for i in range(steps)]
            return DataLoader(batches, batch_size=None, shuffle=False, pin_memory=True)

    return Held()


# ------------------------------------------------------------------------------------ workers
def run_step_variant(args: argparse.Namespace) -> dict[str, Any]:
    """One throughput variant (section 1 or ours in section 2); returns images/s."""
    import lightning as L

    from yolo11_lightning import YOLO11Module, YOLODataModule
    from yolo11_lightning.training.machine import MachineSettings

    stamps_callback, stamps = F.batch_end_stamps()
    if args.real_data:
        data = YOLODataModule(
            dataset=args.yaml,
            batch_size=args.batch,
            image_size=args.image_size,
            num_workers=args.workers,
            close_mosaic=0,
        )
    else:
        data = memory_datamodule(args)
    # nominal_batch = batch: one optimiser step per batch, as a GPU run with a large batch does.
    module = YOLO11Module(
        scale=args.scale, num_classes=data.num_classes, class_names=data.class_names,
        warmup_epochs=0.0, log_images=0, nominal_batch=args.batch, channels_last=args.channels_last,
    )  # fmt: skip
    trainer = L.Trainer(
        accelerator=_device(), devices=1, precision=args.precision, max_steps=args.warmup + args.steps,
        limit_val_batches=0, num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
        enable_model_summary=False, callbacks=[stamps_callback, MachineSettings(compile=args.compile)],
    )  # fmt: skip
    if torch.cuda.is_available():
        torch.backends.cudnn.benchmark = True
        torch.cuda.reset_peak_memory_stats()
    trainer.fit(module, data)
    rate = C.steady_rate(stamps, args.batch, skip=args.warmup)
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else float("nan")
    return {"rate": rate, "peak_gib": peak}


def run_oracle(args: argparse.Namespace) -> dict[str, Any]:
    """The oracle trainer with AMP on the real data pipeline (section 2)."""
    trainer = F.oracle_trainer(
        args.yaml, args.scale, args.image_size, args.batch, args.workers, torch.get_num_threads(),
        args.workdir, amp=torch.cuda.is_available(), nbs=args.batch,
    )  # fmt: skip
    stamps: list[float] = []

    def stamp(tr: Any) -> bool:
        C.sync(tr.device)
        stamps.append(time.perf_counter())
        return len(stamps) >= args.warmup + args.steps

    F.train_oracle_until(trainer, stamp)
    return {"rate": C.steady_rate(stamps, args.batch, skip=args.warmup), "peak_gib": float("nan")}


def run_memory(args: argparse.Namespace) -> dict[str, Any]:
    """Peak memory of a training step per scale and batch (section 3)."""
    from yolo11_lightning import YOLO11Module

    device = _device()
    out: dict[str, float] = {}
    for scale in args.memory_scales.split(","):
        for batch in (int(b) for b in args.memory_batches.split(",")):
            torch.manual_seed(0)
            module = YOLO11Module(scale=scale, num_classes=80, log_images=0).to(device).train()
            optimizer = torch.optim.SGD(module.parameters(), lr=1e-3, momentum=0.9, nesterov=True)
            images = torch.randint(0, 256, (batch, 3, args.image_size, args.image_size), dtype=torch.uint8)
            n = batch * 8  # 8 boxes per image
            targets = torch.cat([
                torch.arange(batch).repeat_interleave(8)[:, None].float(),  # image index
                torch.randint(0, 80, (n, 1)).float(),  # class
                torch.rand(n, 2) * 0.5 + 0.25,  # centre
                torch.rand(n, 2) * 0.25 + 0.05,  # size
            ], 1)  # fmt: skip
            images, targets = images.to(device), targets.to(device)
            try:
                if device == "cuda":
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats()
                for _ in range(2):
                    with torch.autocast(device, dtype=torch.bfloat16):
                        loss, _ = module.criterion(module.model(module._model_input(images)), targets)
                    loss.backward()
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                C.sync(device)
                peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
            except torch.OutOfMemoryError:
                peak = float("inf")
            out[f"{scale},{batch}"] = peak
            del module, optimizer, images, targets
    return {"memory": out}


def run_sync_audit(args: argparse.Namespace) -> dict[str, Any]:
    """Count host syncs per training step by source line (section 4)."""
    import lightning as L

    from yolo11_lightning import YOLO11Module

    data = memory_datamodule(args)
    module = YOLO11Module(
        scale=args.scale, num_classes=data.num_classes, class_names=data.class_names,
        warmup_epochs=0.0, log_images=0, nominal_batch=args.batch,
    )  # fmt: skip
    sites: Counter[str] = Counter()
    audited = {"steps": 0}

    def where() -> str:
        frames = [f for f in traceback.extract_stack()[:-3] if "warnings" not in f.filename]
        ours = [f for f in frames if "yolo11_lightning" in f.filename or "lightning" in f.filename]
        frame = (ours or frames)[-1]
        return f"{frame.filename.split('site-packages/')[-1].split('/work/main/')[-1]}:{frame.lineno} {frame.name}"

    class Audit(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            if batch_idx == args.warmup and torch.cuda.is_available():
                torch.cuda.set_sync_debug_mode("warn")

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if batch_idx >= args.warmup:
                audited["steps"] += 1

    def record(message, category, filename, lineno, file=None, line=None) -> None:
        if "synchroniz" in str(message):
            sites[where()] += 1

    trainer = L.Trainer(
        accelerator=_device(), devices=1, precision="bf16-mixed" if torch.cuda.is_available() else "32-true",
        max_steps=args.warmup + args.steps, limit_val_batches=0, num_sanity_val_steps=0, logger=False,
        enable_checkpointing=False, enable_model_summary=False, callbacks=[Audit()],
    )  # fmt: skip
    previous = warnings.showwarning
    warnings.showwarning = record
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = record
            trainer.fit(module, data)
    finally:
        if torch.cuda.is_available():
            torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning = previous
    steps = max(audited["steps"], 1)
    return {"sites": {k: v / steps for k, v in sites.most_common()}, "steps": steps}


# ------------------------------------------------------------------------------------ parent
def main() -> None:
    parser = C.parser(__doc__, worker=("step", "oracle", "memory", "sync"), hidden=("--yaml", "--workdir"))
    parser.add_argument("--scale", default="n")
    parser.add_argument("--image-size", type=int, default=640)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=30, help="measured steps per variant")
    parser.add_argument("--warmup", type=int, default=10, help="steps left out (compile happens here)")
    parser.add_argument("--held-batches", type=int, default=4, help="distinct batches held in memory")
    parser.add_argument("--workers", type=int, default=8, help="loader workers of the real-data runs")
    parser.add_argument("--memory-scales", default="n,s,m")
    parser.add_argument("--memory-batches", default="16,32,64")
    parser.add_argument("--sections", default="1,2,3,4")
    parser.add_argument("--cpu-smoke", action="store_true", help="run every section on CPU at toy sizes")
    parser.add_argument("--precision", default="32-true", help=argparse.SUPPRESS)
    parser.add_argument("--channels-last", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--compile", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--real-data", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    run = {"step": run_step_variant, "oracle": run_oracle, "memory": run_memory, "sync": run_sync_audit}
    if C.run_as_worker(args, run):
        return

    if not torch.cuda.is_available() and not args.cpu_smoke:
        print("no CUDA device: nothing to measure (use --cpu-smoke to exercise the code paths on CPU)")
        return
    if args.cpu_smoke:  # toy sizes: checks that every section runs, the figures mean nothing
        args.image_size, args.batch, args.steps, args.warmup, args.workers = 64, 4, 2, 1, 0
        args.memory_scales, args.memory_batches, args.held_batches = "n", "2", 2
    threads = torch.get_num_threads()
    workdir = C.default_workdir()
    images = max((args.warmup + args.steps) * args.batch, 64)
    yaml = C.synthetic_yaml(workdir, num_train=images, num_val=8, image_size=args.image_size)
    common = [
        "--scale", args.scale, "--image-size", str(args.image_size), "--batch", str(args.batch),
        "--steps", str(args.steps), "--warmup", str(args.warmup), "--held-batches", str(args.held_batches),
        "--workers", str(args.workers), "--yaml", str(yaml), "--workdir", str(workdir / "gpu"),
        "--memory-scales", args.memory_scales, "--memory-batches", args.memory_batches,
    ]  # fmt: skip
    sections = set(args.sections.split(","))
    C.print_machine_info(threads)

    def worker(kind: str, *flags: str) -> dict[str, Any]:
        return C.run_worker(__file__, [kind, *common, *flags], threads, timeout=1800)

    if "1" in sections:
        rows = []
        base = None
        for name, precision, channels_last, compile_ in THROUGHPUT_VARIANTS:
            if args.cpu_smoke and (precision == "16-mixed" or compile_):
                continue  # fp16 autocast needs a GPU; compiling on a small CPU takes minutes
            flags = ["--precision", precision, *(["--channels-last"] if channels_last else [])]
            flags += ["--compile"] if compile_ else []
            out = worker("step", *flags)
            base = base or out["rate"]
            rows.append([name, out["rate"], f"{out['rate'] / base:.2f}", out["peak_gib"]])
            print(f"  {name}: {out['rate']:.1f} img/s", flush=True)
        C.print_table(f"1. yolo11{args.scale} training step through fit, {args.image_size}x{args.image_size}, batch "
                      f"{args.batch}, batches held in memory; images/s over {args.steps} steps after {args.warmup}",
                      ["variant", "img/s", "vs fp32", "peak GiB"], rows)  # fmt: skip

    if "2" in sections:
        precision = "16-mixed" if torch.cuda.is_available() else "32-true"
        ours = worker("step", "--real-data", "--precision", precision)
        rows = [[f"ours ({precision})", ours["rate"], "-"]]
        if C.oracle_available():
            ref = worker("oracle")
            rows[0][2] = C.ratio(ours["rate"], ref["rate"])
            rows.append([f"oracle (AMP {'on' if torch.cuda.is_available() else 'off'})", ref["rate"], "1.00"])
        C.print_table(
            f"2. real data pipeline (mosaic, {args.workers} workers), yolo11{args.scale}, batch {args.batch}",
            ["side", "img/s", "ours/oracle"],
            rows,
        )

    if "3" in sections:
        memory = worker("memory")["memory"]
        scales = args.memory_scales.split(",")
        batches = args.memory_batches.split(",")
        rows = [[f"yolo11{s}", *(memory[f"{s},{b}"] for b in batches)] for s in scales]
        C.print_table(
            f"3. peak GPU memory (GiB) of a bf16-mixed training step at {args.image_size}x{args.image_size}",
            ["scale", *(f"batch {b}" for b in batches)],
            rows,
        )

    if "4" in sections:
        audit = worker("sync")
        rows = [[site, f"{count:.2f}"] for site, count in audit["sites"].items()] or [["none", "0"]]
        caption = f"4. host syncs per training step (bf16-mixed, {audit['steps']} steps audited)"
        C.print_table(caption, ["asked for by", "per step"], rows)


if __name__ == "__main__":
    main()
