"""GPU figures in one prepared run: TF32 probe, sync audit, DDP fits (2 ranks, resume), images/s, data, memory.

    python benchmarks/device/gpu.py --out DIR   # needs CUDA; the sections that fit in --budget (240 s)
    python benchmarks/device/gpu.py --cpu-smoke   # every section's code path on CPU at toy sizes (6-8 min)
    python benchmarks/device/gpu.py --sections throughput,data --budget 200    # a subset (names: --help)

On a lent H200 (no network): ``bash benchmarks/device/gpu_wheels.sh`` here first (the wheels the machine
lacks, into ``.whl/``), then one device call runs ``bash benchmarks/device/gpu_run.sh`` with ``.whl`` carried:
it installs the wheels to /tmp/site (scratch on the lent machine) and runs this script with ``--out $OUT``
(benchmarks/device/gpu.md, "Running it", has the exact call).

One parent process runs each section as its own subprocess (its own process group) with its own timeout, in
order of value, so that a budget cut loses the least valuable ones; a section that fails or times out records
its status and output tail and the run goes on; one that would not fit in what is left of ``--budget`` is
recorded as "skipped: budget". After every section ``gpu.json`` (every figure, versions, GPU, driver,
commit, each section's status) and ``gpu.md`` (the tables, also printed at the end) are rewritten in
``--out``, with ``sections.log`` (each section's output): a run killed from outside keeps what it measured.

The budget (240 s of sections) leaves a rerun inside 15 device-minutes; the first five sections (about 190 s
at most) are the checks no CPU can make, the rest are figures a budget cut may drop. Sections, in this order:
  tf32-probe      each fp32 mode the throughput rows use, set as they set it, then Lightning's own read of
                  it (``CUDAAccelerator.setup_device``) and the matmul / convolution error against float64;
  sync-audit      ``pytest tests/e2e/test_gpu_syncs.py`` (CUDA-only tests: no host sync in a single-GPU
                  training step nor in a 1-rank NCCL DDP step): passed / failed and the output tail;
  ddp 2-rank      ``yolo11-lightning fit --config configs/quickstart.yaml`` with 2 processes on the one GPU
                  over gloo (``SharedDeviceDDP``: NCCL refuses two ranks on one GPU), 2 epochs: the step
                  exchange, the rank-0 buffer broadcast, ``agree()`` and the metric gather, which every
                  world-size-1 section skips;
  ddp-*           the same fit on one GPU through NCCL DDP (``--trainer.strategy ddp --trainer.devices 1``),
                  3 epochs with validation, synthetic data (256 train / 64 val at 320, batch 32), under
                  16-mixed, then bf16-mixed after the resume: every logged loss and val/mAP50-95 in
                  metrics.csv finite, the backend and the number of ranks as asked;
  resume          the 16-mixed fit stopped after epoch 1 and resumed (``--ckpt_path last``) under bf16-mixed
                  to epoch 3, beside the uninterrupted 16-mixed fit;
  tensorrt        the ``ddp 16-mixed`` checkpoint exported to ONNX (fp32, fp16), each built into a TensorRT
                  engine, scored by the checkpoint's validator on the fit's val split and timed at batch 1
                  (``tensorrt_engine.py``); a row naming why when tensorrt is not installed (the lent
                  machine's case: its libraries are not wheels on PyPI) or there is no GPU;
  prepare         512 COCO-like JPEGs (``data_speed.make_dataset``, 80 classes) and real training batches
                  from them (mosaic on), saved once for the throughput sections;
  yolo11{n,s} *   training images/s through ``fit`` (the CLI's default callbacks: EMA, checkpoints,
                  throughput meter, progress bar) at 640, batch 64 (n) / 32 (s), batches served from
                  memory so the data pipeline does not set the pace, one optimiser step per batch: fp32
                  with TF32 off and on, bf16-mixed, bf16-mixed + channels_last (each one change from the
                  row before; the layout of the fp32 rows is NCHW); peak memory of the measured window;
  data            the DataModule's train loader (mosaic, recent partners, 640, batch 16, pinned) with 1 and
                  8 workers: images/s and images/s per worker;
  * compile       bf16-mixed + channels_last + ``compile`` (its own timeout: "skipped" when compiling does
                  not finish);
  memory          peak memory of a bare bf16 training step per scale and batch;
  sync-sites      host syncs per step of a 1-rank DDP ``fit`` counted by the source line that asked
                  (``torch.cuda.set_sync_debug_mode("warn")``): what to fix when sync-audit fails;
  yolo11n tf32-cl fp32 with TF32 + channels_last (is NHWC also right for fp32?).

Timing: the host stamps the ends of the measured window only; the device is synchronised once when the
warm-up ends (cuDNN autotuning and compiling happen there) and once after the last measured step, never per
step. A window lasts ``--window`` seconds (at least 10 steps). The oracle is not needed (a lent machine lacks
it); ``throughput.py`` compares with it where it is installed.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata, util
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers (_common, ...)

import _common as C
import torch
from lightning.pytorch.strategies import DDPStrategy

REPO = C.REPO
# All sections' seconds: with the install and the machine's start, one run and a rerun fit in 15 device-minutes.
BUDGET_S = 240.0
MARGIN_S = 5.0  # kept back from a section's timeout at the deadline, for writing the results
TAIL_CHARS = 3000  # output kept in gpu.json per section that did not end well
LOG_CHARS = 200_000  # output kept in sections.log per section

# key -> (label, Lightning precision, channels_last, compile, fp32 precision of matmuls and convolutions:
# "ieee" TF32 off, "tf32" on, None torch's defaults)
VARIANTS: dict[str, tuple[str, str, bool, bool, str | None]] = {
    "fp32": ("fp32 (TF32 off)", "32-true", False, False, "ieee"),
    "tf32": ("fp32, TF32 on", "32-true", False, False, "tf32"),
    "bf16": ("bf16-mixed", "bf16-mixed", False, False, None),
    "bf16-cl": ("bf16-mixed + channels_last", "bf16-mixed", True, False, None),
    "compile": ("bf16-mixed + channels_last + compile", "bf16-mixed", True, True, None),
    "tf32-cl": ("fp32, TF32 on + channels_last", "32-true", True, False, "tf32"),
}
MAIN_VARIANTS = ("fp32", "tf32", "bf16", "bf16-cl")
LOSS_COLUMNS = ("train/box_loss", "train/cls_loss", "train/dfl_loss")
MAP_COLUMN = "val/mAP50-95"


# ------------------------------------------------------------------------------------ settings
@dataclass
class Settings:
    """Sizes of one run: the GPU run's, or toy ones for ``--cpu-smoke``."""

    size: int = 640
    batches: dict[str, int] = field(default_factory=lambda: {"n": 64, "s": 32})
    held: int = 4  # distinct batches held in memory
    warmup: int = 8  # steps before the window (cuDNN autotuning, compiling)
    window_s: float = 4.0
    min_steps: int = 10
    max_steps: int = 500
    jpegs: int = 512
    prepare_workers: int = 8
    data_workers: tuple[int, ...] = (1, 8)
    data_batch: int = 16
    data_epochs: int = 3  # timed epochs, after one that starts the workers
    ddp: dict[str, Any] = field(
        default_factory=lambda: {"train": 256, "val": 64, "size": 320, "batch": 32, "workers": 4}
    )
    memory_scales: tuple[str, ...] = ("n", "s", "m")
    memory_batches: tuple[int, ...] = (16, 32, 64)
    audit_warmup: int = 3
    audit_steps: int = 5
    compile_timeout: float = 240.0

    @classmethod
    def smoke(cls) -> Settings:
        return cls(
            size=64, batches={"n": 4}, held=2, warmup=1, window_s=0.2, min_steps=2, max_steps=4, jpegs=16,
            prepare_workers=0, data_workers=(1, 2), data_batch=4, data_epochs=1,
            ddp={"train": 16, "val": 8, "size": 64, "batch": 8, "workers": 1}, memory_scales=("n",),
            memory_batches=(2,), audit_warmup=1, audit_steps=2, compile_timeout=8.0,
        )  # fmt: skip


# ------------------------------------------------------------------------------------ helpers (workers)
class SharedDeviceDDP(DDPStrategy):
    """DDP with ``processes`` ranks on one device over gloo (NCCL refuses two ranks on one GPU): the multi-rank
    path (step exchange, rank-0 buffer broadcast, ``agree()``, the metric gather) on a machine with one GPU.

    ``--trainer.strategy gpu.SharedDeviceDDP --trainer.strategy.device cuda`` (``benchmarks/device/`` on
    PYTHONPATH).
    """

    def __init__(self, processes: int = 2, device: str = "cuda", **kwargs: Any) -> None:
        one = torch.device(device, 0) if device == "cuda" else torch.device(device)
        super().__init__(parallel_devices=[one] * processes, process_group_backend="gloo", **kwargs)


def set_fp32_precision(mode: str | None) -> None:
    """TF32 for fp32 matmuls and cuDNN convolutions: "ieee" off, "tf32" on, None leaves torch's defaults.

    Through ``torch.set_float32_matmul_precision`` and ``cudnn.allow_tf32``, the API Lightning reads: its
    ``CUDAAccelerator.setup_device`` calls ``torch.get_float32_matmul_precision()``, which raises once the newer
    ``fp32_precision`` flags were set (torch refuses a mix of the two APIs, reading included).
    """
    if mode is None:
        return
    torch.set_float32_matmul_precision("high" if mode == "tf32" else "highest")
    torch.backends.cudnn.allow_tf32 = mode == "tf32"


def tf32_state() -> dict[str, str]:
    """The fp32 precision of matmuls and cuDNN convolutions now: "tf32" or "ieee" (read as Lightning reads it)."""
    tf32 = {True: "tf32", False: "ieee"}
    return {
        "matmul": tf32[torch.get_float32_matmul_precision() != "highest"],
        "cudnn_conv": tf32[bool(torch.backends.cudnn.allow_tf32)],
    }


def held_datamodule(batches: list[dict[str, Any]], source: Any, length: int) -> Any:
    """A DataModule whose train loader serves ``batches`` (already collated) ``length`` times in turn."""
    import lightning as L
    from torch.utils.data import DataLoader, Dataset

    class Repeat(Dataset):
        def __len__(self) -> int:
            return length

        def __getitem__(self, i: int) -> dict[str, Any]:
            return batches[i % len(batches)]

    class Held(L.LightningDataModule):
        batch_size = int(batches[0]["images"].shape[0])
        num_classes = source.num_classes
        class_names = source.class_names
        num_train_samples = length * batch_size

        def train_dataloader(self) -> DataLoader:
            return DataLoader(Repeat(), batch_size=None, shuffle=False, pin_memory=False)

    return Held()


def load_held(path: str) -> list[dict[str, Any]]:
    """The batches ``prepare`` saved; pinned on a CUDA machine (copied to the device without blocking)."""
    batches = torch.load(path, weights_only=True)
    if torch.cuda.is_available():
        batches = [{k: v.pin_memory() if torch.is_tensor(v) else v for k, v in b.items()} for b in batches]
    return batches


def steady_window(warmup: int, seconds: float, min_steps: int, max_steps: int) -> Any:
    """A callback timing the steady state of training without a sync per step.

    After ``warmup`` batches it synchronises the device, stamps the start and resets the peak-memory
    counter; then it reads only the host clock, and once ``seconds`` have passed (and at least ``min_steps``,
    at most ``max_steps``) it synchronises, stamps the end and stops the run.
    """
    import lightning as L

    class Window(L.Callback):
        def __init__(self) -> None:
            self.done, self.fit_start, self.start, self.end, self.steps = 0, 0.0, 0.0, 0.0, 0
            self.peak_gib = float("nan")

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            self.fit_start = time.perf_counter()

        def on_train_batch_end(
            self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            if self.end:
                return
            self.done += 1
            cuda = pl_module.device.type == "cuda"
            if self.done == warmup:
                C.sync(pl_module.device)
                self.start = time.perf_counter()
                if cuda:
                    torch.cuda.reset_peak_memory_stats(pl_module.device)
                return
            steps = self.done - warmup
            if steps <= 0:
                return
            if (time.perf_counter() - self.start >= seconds and steps >= min_steps) or steps >= max_steps:
                C.sync(pl_module.device)
                self.end, self.steps = time.perf_counter(), steps
                if cuda:
                    self.peak_gib = torch.cuda.max_memory_allocated(pl_module.device) / 2**30
                trainer.should_stop = True

    return Window()


# ------------------------------------------------------------------------------------ workers
def work_tf32_probe(spec: dict[str, Any]) -> dict[str, Any]:
    """Each fp32 mode as the throughput sections set it, then Lightning's own check of it and a 1-step fit:
    the mode read back, and the error of a 1024-wide fp32 matmul and convolution against float64 (TF32 keeps 10
    mantissa bits: ~1e-3 relative, IEEE fp32 ~1e-6; on a CPU both are fp32)."""
    import lightning as L
    from lightning.fabric.accelerators.cuda import _check_cuda_matmul_precision

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(1024, 1024, generator=g), torch.randn(1024, 1024, generator=g)
    x, w = torch.randn(4, 64, 32, 32, generator=g), torch.randn(64, 64, 3, 3, generator=g)
    out: dict[str, Any] = {}
    for mode in spec["modes"]:
        set_fp32_precision(mode)
        _check_cuda_matmul_precision(device)  # what CUDAAccelerator.setup_device calls (on a GPU)
        precision = torch.get_float32_matmul_precision()  # the call it makes: raises on mixed TF32 APIs
        trainer = L.Trainer(accelerator=device.type, devices=1, max_steps=1, logger=False, enable_progress_bar=False,
                            enable_checkpointing=False, enable_model_summary=False, limit_val_batches=0)  # fmt: skip
        trainer.strategy.accelerator.setup_device(trainer.strategy.root_device)
        mm = (a.to(device) @ b.to(device)).double().cpu()
        conv = torch.nn.functional.conv2d(x.to(device), w.to(device), padding=1).double().cpu()
        mm_ref = a.double() @ b.double()
        conv_ref = torch.nn.functional.conv2d(x.double(), w.double(), padding=1)
        out[mode] = {
            "state": tf32_state(), "matmul_precision": precision,
            "matmul_rel_err": float((mm - mm_ref).abs().max() / mm_ref.abs().max()),
            "conv_rel_err": float((conv - conv_ref).abs().max() / conv_ref.abs().max()),
        }  # fmt: skip
    return {"modes": out, "device": device.type}


def work_prepare(spec: dict[str, Any]) -> dict[str, Any]:
    """COCO-like JPEGs with a dataset yaml, and real training batches from them saved for the throughput
    sections (each file written once, reused by later runs)."""
    import yaml
    from _coco_like import make_dataset

    from yolo11_lightning import YOLODataModule

    root = Path(spec["root"])
    start = time.perf_counter()
    make_dataset(root, spec["jpegs"])  # skips the images already written
    generated = time.perf_counter() - start
    data_yaml = root / "data.yaml"
    names = [f"class{i}" for i in range(80)]
    data_yaml.write_text(yaml.safe_dump({"path": str(root), "train": "images/train", "val": "images/train",
                                         "names": names}))  # fmt: skip
    for batch, path in spec["held"].items():
        if Path(path).exists():
            continue
        data = YOLODataModule(
            dataset=str(data_yaml), batch_size=int(batch), image_size=spec["size"],
            num_workers=spec["workers"], seed=0, close_mosaic=0, pin_memory=False, persistent_workers=False,
        )  # fmt: skip
        data.setup("fit")
        loader = iter(data.train_dataloader())
        held = [next(loader) for _ in range(spec["count"])]
        del loader
        torch.save(held, f"{path}.tmp")
        os.replace(f"{path}.tmp", path)
    return {"jpegs": spec["jpegs"], "generate_s": generated, "seconds": time.perf_counter() - start}


def work_throughput(spec: dict[str, Any]) -> dict[str, Any]:
    """Images/s of one variant through ``fit`` on held batches, and the window's peak memory."""
    import _fit as F

    _, precision, channels_last, compile_, fp32 = VARIANTS[spec["variant"]]
    set_fp32_precision(fp32)
    batches = load_held(spec["held"])
    batch = int(batches[0]["images"].shape[0])
    window = steady_window(spec["warmup"], spec["window_s"], spec["min_steps"], spec["max_steps"])
    length = spec["warmup"] + spec["max_steps"] + 1
    options = {
        "channels_last": channels_last,
        "compile": compile_,
        "nominal_batch": batch,
        "optimizer": "SGD",
    }
    trainer, module, source = F.our_fit_parts(
        spec["yaml"], spec["scale"], spec["size"], batch, 0, length, spec["workdir"], callbacks=[window],
        module_options=options, trainer_options={"precision": precision, "benchmark": True},
    )  # fmt: skip
    trainer.fit(module, held_datamodule(batches, source, length))
    if not window.steps:
        raise RuntimeError(f"the run ended after {window.done} batches, before the window closed")
    return {
        "rate": batch * window.steps / (window.end - window.start), "steps": window.steps,
        "window_s": window.end - window.start, "warmup_s": window.start - window.fit_start,
        "peak_gib": window.peak_gib, "batch": batch, "tf32": tf32_state(), "precision": precision,
        "channels_last": channels_last, "compile": compile_, "cudnn_benchmark": torch.backends.cudnn.benchmark,
    }  # fmt: skip


def work_data(spec: dict[str, Any]) -> dict[str, Any]:
    """Images/s of the DataModule's train loader (mosaic, default partners) per worker count.

    One epoch starts the workers (persistent), then ``epochs`` epochs are timed from ``iter`` to the last
    batch; the epoch has a multiple of 8 batches, so every worker count here gets whole rounds of them.
    """
    from yolo11_lightning import YOLODataModule

    out: dict[str, Any] = {}
    for workers in spec["workers"]:
        data = YOLODataModule(
            dataset=spec["yaml"], batch_size=spec["batch"], image_size=spec["size"], num_workers=workers,
            seed=0, close_mosaic=0, pin_memory=torch.cuda.is_available(),
        )  # fmt: skip
        data.setup("fit")
        loader = data.train_dataloader()
        sampler = data._train_sampler
        images, seconds = 0, 0.0
        for epoch in range(spec["epochs"] + 1):
            sampler.set_epoch(epoch)
            start, count = time.perf_counter(), 0
            for batch in loader:
                count += int(batch["images"].shape[0])
            if epoch:
                images, seconds = images + count, seconds + time.perf_counter() - start
        rate = images / seconds
        out[str(workers)] = {"rate": rate, "per_worker": rate / workers, "images": images}
        del loader, data
    return {"workers": out, "cpus": os.cpu_count()}


def work_memory(spec: dict[str, Any]) -> dict[str, Any]:
    """Peak memory of a bare bf16-mixed training step (forward, loss, backward, SGD) per scale and batch."""
    from yolo11_lightning import YOLO11Module

    device = "cuda" if torch.cuda.is_available() else "cpu"
    size = spec["size"]
    out: dict[str, float] = {}
    for scale in spec["scales"]:
        for batch in spec["batches"]:
            torch.manual_seed(0)
            module = YOLO11Module(scale=scale, num_classes=80, log_images=0).to(device).train()
            optimizer = torch.optim.SGD(module.parameters(), lr=1e-3, momentum=0.9, nesterov=True)
            images = torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8)
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
                        loss, _ = module.criterion(module.model(module.model_input(images)), targets)
                    loss.backward()
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                C.sync(device)
                peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
            except torch.OutOfMemoryError:
                peak = float("inf")
            out[f"{scale},{batch}"] = peak
            del module, optimizer, images, targets
    return {"peak_gib": out}


def work_sync_sites(spec: dict[str, Any]) -> dict[str, Any]:
    """Host syncs per training step of a 1-rank DDP ``fit``, counted by the source line that asked."""
    import _fit as F
    import lightning as L

    batches = load_held(spec["held"])
    batch = int(batches[0]["images"].shape[0])
    length = spec["warmup"] + spec["steps"]
    sites: Counter[str] = Counter()
    audited: dict[str, Any] = {"steps": 0, "backend": "-"}
    cuda = torch.cuda.is_available()

    def where() -> str:
        frames = [f for f in traceback.extract_stack()[:-3] if "warnings" not in f.filename]
        ours = [f for f in frames if "lightning" in f.filename]  # yolo11_lightning's or Lightning's
        frame = (ours or frames)[-1]
        name = frame.filename.split("site-packages/")[-1].replace(f"{REPO}/", "")
        return f"{name}:{frame.lineno} {frame.name}"

    class Audit(L.Callback):
        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            if torch.distributed.is_initialized():  # the process group the DDP strategy built
                audited["backend"] = torch.distributed.get_backend()

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            if batch_idx == spec["warmup"] and cuda:
                torch.cuda.set_sync_debug_mode("warn")

        def on_train_batch_end(
            self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            if batch_idx >= spec["warmup"]:
                audited["steps"] += 1

    def record(
        message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None
    ) -> None:
        if "synchroniz" in str(message):
            sites[where()] += 1

    trainer, module, source = F.our_fit_parts(
        spec["yaml"], "n", spec["size"], batch, 0, length, spec["workdir"], callbacks=[Audit()],
        module_options={"nominal_batch": batch, "optimizer": "SGD"},
        trainer_options={"precision": "bf16-mixed", "strategy": "ddp", "use_distributed_sampler": False},
    )  # fmt: skip
    previous = warnings.showwarning
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = record
            trainer.fit(module, held_datamodule(batches, source, length))
    finally:
        if cuda:
            torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning = previous
    steps = max(audited["steps"], 1)
    return {
        "sites": {k: v / steps for k, v in sites.most_common()},
        "steps": steps,
        "backend": audited["backend"],
    }


def epoch_metrics(root: str) -> dict[int, dict[str, float]]:
    """Per epoch, the last logged value of each loss and of val/mAP50-95 over every metrics.csv under ``root``."""
    epochs: dict[int, dict[str, float]] = {}
    for path in sorted(Path(root).glob("lightning_logs/version_*/metrics.csv"), key=os.path.getmtime):
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if not row.get("epoch"):
                    continue
                values = {c: float(row[c]) for c in (*LOSS_COLUMNS, MAP_COLUMN) if row.get(c)}
                epochs.setdefault(int(float(row["epoch"])), {}).update(values)
    return epochs


def work_resume(spec: dict[str, Any]) -> dict[str, Any]:
    """A 16-mixed fit stopped after its first epoch, resumed under bf16-mixed; compared with the uninterrupted
    16-mixed fit of the same config (every epoch's losses and mAP finite, the resumed run at the same epochs)."""
    shutil.rmtree(spec["root"], ignore_errors=True)  # an earlier run's logs would fill epochs this one lost
    for key in ("first", "second"):
        proc = subprocess.run(spec[key], cwd=REPO, capture_output=True, text=True)
        print(proc.stdout[-2000:], proc.stderr[-4000:], flush=True)
        if proc.returncode:
            raise RuntimeError(f"the {key} fit ended with exit {proc.returncode}")
    resumed, reference = epoch_metrics(spec["root"]), epoch_metrics(spec["reference_root"])
    last = spec["epochs"] - 1
    values = [v for e in resumed.values() for v in e.values()]
    problems = []
    if sorted(e for e, v in resumed.items() if MAP_COLUMN in v) != list(range(spec["epochs"])):
        problems.append(f"mAP logged for epochs {sorted(resumed)}, not 0..{last}")
    if not values or not all(math.isfinite(v) for v in values):
        problems.append("a loss or mAP is not finite")
    if problems:
        raise RuntimeError("; ".join(problems))
    diff = {c: resumed[last].get(c, math.nan) - reference.get(last, {}).get(c, math.nan)
            for c in (*LOSS_COLUMNS, MAP_COLUMN)}  # fmt: skip
    return {"resumed": resumed[last], "uninterrupted": reference.get(last, {}), "difference": diff}


def work_tensorrt(spec: dict[str, Any]) -> dict[str, Any]:
    """TensorRT engines (fp32, fp16) of the ``ddp 16-mixed`` checkpoint: scored and timed (tensorrt_engine.py)."""
    import tensorrt_engine  # benchmarks/device/, this script's folder

    return tensorrt_engine.work_tensorrt(spec)


WORKERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "tf32-probe": work_tf32_probe, "prepare": work_prepare, "throughput": work_throughput, "data": work_data,
    "memory": work_memory, "sync-sites": work_sync_sites, "resume": work_resume, "tensorrt": work_tensorrt,
}  # fmt: skip


# ------------------------------------------------------------------------------------ sections (parent)
@dataclass
class Section:
    """One subprocess of the run: its command, time limits and how its output is read."""

    name: str
    group: str  # which table: audit, ddp, prepare, throughput, data, memory, sync-sites
    argv: list[str]
    timeout: float
    need: float  # not started with less than this left of the budget
    spec: dict[str, Any] = field(default_factory=dict)
    skip: str = ""  # a reason not to run it at all
    timeout_status: str = "timeout after {:.0f} s"
    one_timeout: bool = False  # after a timeout of this group's, its later sections are skipped (a hang)
    needs: str = ""  # the section whose files it reads: skipped when that one did not end "ok"


def worker_section(name: str, group: str, kind: str, spec: dict[str, Any], timeout: float, need: float,
                   **kwargs: Any) -> Section:  # fmt: skip
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", kind, "--spec", json.dumps(spec)]
    return Section(name, group, argv, timeout, need, spec, **kwargs)


def fit_argv(
    precision: str, root: Path, epochs: int, s: Settings, work: Path, cuda: bool, *extra: str
) -> list[str]:
    """The CLI fit of the quickstart config on one device, ``epochs`` epochs with validation, under ``root``."""
    d = s.ddp
    return [
        sys.executable, "-m", "yolo11_lightning", "fit", "--config", "configs/quickstart.yaml",
        "--trainer.accelerator", "gpu" if cuda else "cpu", "--trainer.devices", "1",
        "--trainer.strategy", "ddp", "--trainer.precision", precision, "--trainer.max_epochs", str(epochs),
        "--trainer.log_every_n_steps", "1", "--trainer.enable_progress_bar", "false",
        "--trainer.default_root_dir", str(root), "--data.synthetic_dir", str(work / f"synthetic_{d['size']}"),
        "--data.synthetic_train", str(d["train"]), "--data.synthetic_val", str(d["val"]),
        "--data.synthetic_image_size", str(d["size"]), "--data.image_size", str(d["size"]),
        "--data.batch_size", str(d["batch"]), "--data.num_workers", str(d["workers"]), *extra,
    ]  # fmt: skip


def ddp_section(precision: str, s: Settings, work: Path, cuda: bool) -> Section:
    """The CLI fit of the quickstart config on one device through NCCL DDP (1 rank), 3 epochs."""
    root = work / f"ddp_{precision}"
    spec = {"precision": precision, "root": str(root), "epochs": 3, "ranks": 1,
            "backend": "nccl" if cuda else "gloo", **s.ddp}  # fmt: skip
    argv = fit_argv(precision, root, 3, s, work, cuda)
    return Section(f"ddp {precision}", "ddp", argv, timeout=120, need=45, spec=spec, one_timeout=True)


def two_rank_section(s: Settings, work: Path, cuda: bool) -> Section:
    """The same fit on 2 ranks sharing the one device over gloo (``SharedDeviceDDP``), 2 epochs: the step
    exchange, the rank-0 buffer broadcast, ``agree()`` and the metric gather, skipped at world size 1."""
    root = work / "ddp_2rank"
    spec = {"precision": "bf16-mixed", "root": str(root), "epochs": 2, "ranks": 2, "backend": "gloo", **s.ddp}
    argv = fit_argv("bf16-mixed", root, 2, s, work, cuda, "--trainer.strategy", "gpu.SharedDeviceDDP",
                    "--trainer.strategy.device", "cuda" if cuda else "cpu")  # fmt: skip
    # A hang here (gloo on a GPU) says nothing about the 1-rank NCCL fits after it: they still run.
    return Section("ddp 2-rank", "ddp", argv, timeout=150, need=50, spec=spec)


def resume_section(s: Settings, work: Path, cuda: bool) -> Section:
    """1 epoch under 16-mixed, then ``--ckpt_path last`` under bf16-mixed to epoch 3, against ``ddp 16-mixed``
    (the same 3 epochs uninterrupted)."""
    root = work / "resume"
    spec = {
        "root": str(root), "reference_root": str(work / "ddp_16-mixed"), "epochs": 3,
        "first": fit_argv("16-mixed", root, 1, s, work, cuda),
        "second": fit_argv("bf16-mixed", root, 3, s, work, cuda, "--ckpt_path", "last"),
    }  # fmt: skip
    timeout = 150 if cuda else 300  # two fits; a CPU smoke on shared cores takes longer
    return worker_section(
        "resume 16>bf16", "resume", "resume", spec, timeout=timeout, need=60, needs="ddp 16-mixed"
    )


def tensorrt_section(s: Settings, work: Path, cuda: bool) -> Section:
    """Engines of the ``ddp 16-mixed`` checkpoint on its synthetic set; a row naming why when it cannot run."""
    d = s.ddp
    spec = {"root": str(work / "ddp_16-mixed"), "synthetic_dir": str(work / f"synthetic_{d['size']}"),
            "train": d["train"], "val": d["val"], "size": d["size"], "batch": d["batch"], "workers": d["workers"],
            "runs": 50, "workdir": str(work / "tensorrt")}  # fmt: skip
    skip = ""
    if not cuda:
        skip = "skipped: a TensorRT engine needs a CUDA GPU"
    elif util.find_spec("tensorrt") is None:
        skip = ("skipped: tensorrt not installed (its libraries are not wheels on PyPI, so gpu_wheels.sh cannot "
                "bring them)")  # fmt: skip
    return worker_section("tensorrt", "tensorrt", "tensorrt", spec, timeout=150, need=60, needs="ddp 16-mixed",
                          skip=skip)  # fmt: skip


def build_sections(args: argparse.Namespace, s: Settings, work: Path, cuda: bool) -> list[Section]:
    """Every section in order of value: a budget cut drops the last ones."""
    smoke = "skipped: CPU smoke (same code path as {})"
    jpeg_root = work / f"coco_like_{s.jpegs}"
    data_yaml = str(jpeg_root / "data.yaml")
    held = {str(b): str(work / f"held_{s.size}_{b}_{s.held}.pt") for b in sorted(set(s.batches.values()))}
    first_scale = next(iter(s.batches))
    sections = [
        worker_section("tf32-probe", "tf32-probe", "tf32-probe", {"modes": ["ieee", "tf32"]}, timeout=60, need=15),
        Section("sync-audit", "audit",
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/e2e/test_gpu_syncs.py"],
                timeout=90, need=30,
                skip="" if (REPO / "tests/e2e/test_gpu_syncs.py").exists() else "missing (tests/e2e/test_gpu_syncs.py)"),
        two_rank_section(s, work, cuda),
        ddp_section("16-mixed", s, work, cuda),
        resume_section(s, work, cuda),
        tensorrt_section(s, work, cuda),
        ddp_section("bf16-mixed", s, work, cuda),
        worker_section("prepare", "prepare", "prepare", {
            "root": str(jpeg_root), "jpegs": s.jpegs, "size": s.size, "held": held, "count": s.held,
            "workers": min(s.prepare_workers, os.cpu_count() or 1),
        }, timeout=120, need=20),
    ]  # fmt: skip
    if args.cpu_smoke:
        sections[6].skip = smoke.format("bf16-mixed: 16-mixed is bf16 on a CPU")

    def throughput(scale: str, variant: str, timeout: float, need: float, **kwargs: Any) -> Section:
        batch = s.batches[scale]
        spec = {
            "variant": variant, "scale": scale, "size": s.size, "held": held[str(batch)], "yaml": data_yaml,
            "warmup": s.warmup, "window_s": s.window_s, "min_steps": s.min_steps, "max_steps": s.max_steps,
            "workdir": str(work / f"fit_{scale}_{variant}"),
        }  # fmt: skip
        return worker_section(
            f"yolo11{scale} {variant}",
            "throughput",
            "throughput",
            spec,
            timeout,
            need,
            needs="prepare",
            **kwargs,
        )

    for scale in s.batches:
        for variant in MAIN_VARIANTS:
            section = throughput(scale, variant, timeout=90, need=25)
            if args.cpu_smoke and variant in ("tf32", "bf16"):
                section.skip = smoke.format("fp32 / bf16-cl")
            sections.append(section)
    sections.append(worker_section("data", "data", "data", {
        "yaml": data_yaml, "workers": list(s.data_workers), "batch": s.data_batch, "size": s.size,
        "epochs": s.data_epochs,
    }, timeout=90, need=25, needs="prepare"))  # fmt: skip
    for scale in s.batches:
        sections.append(throughput(scale, "compile", timeout=s.compile_timeout, need=min(90.0, s.compile_timeout),
                                   timeout_status="skipped: compiling not done in {:.0f} s"))  # fmt: skip
    sections.append(worker_section("memory", "memory", "memory", {
        "size": s.size, "scales": list(s.memory_scales), "batches": list(s.memory_batches),
    }, timeout=90, need=25))  # fmt: skip
    sections.append(worker_section("sync-sites", "sync-sites", "sync-sites", {
        "held": held[str(s.batches[first_scale])], "yaml": data_yaml, "size": s.size,
        "warmup": s.audit_warmup, "steps": s.audit_steps, "workdir": str(work / "sync_sites"),
    }, timeout=90, need=30, needs="prepare"))  # fmt: skip
    sections.append(throughput(first_scale, "tf32-cl", timeout=90, need=25))
    if args.cpu_smoke:
        sections[-1].skip = smoke.format("fp32 / bf16-cl")
    if args.sections:
        wanted = set(args.sections.split(","))
        chosen = [
            x for x in sections if x.name in wanted or x.group in wanted or x.name.split()[-1] in wanted
        ]
        if any(x.group in ("throughput", "data", "sync-sites") for x in chosen):
            wanted.add("prepare")  # they read its files
        sections = [x for x in sections if x in chosen or x.name in wanted]
    return sections


def section_env() -> dict[str, str]:
    """The parent's environment with the repository first on PYTHONPATH (the package is used uninstalled)."""
    env = dict(os.environ)
    paths = [
        str(REPO),
        str(Path(__file__).resolve().parent),
        *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []),
    ]
    env["PYTHONPATH"] = os.pathsep.join(paths)  # benchmarks/device/: gpu.SharedDeviceDDP, 2-rank fit
    env.update(PYTHONUNBUFFERED="1", YOLO_OFFLINE="1", WANDB_MODE="offline")
    return env


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a section's process, its process group and any descendant that left the group."""
    try:
        import psutil

        children = psutil.Process(proc.pid).children(recursive=True)
    except Exception:  # psutil missing, or the process is gone
        children = []
    for child in children:
        with contextlib.suppress(Exception):  # already exited
            child.kill()
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone already
        os.killpg(proc.pid, signal.SIGKILL)
    proc.kill()


def run_section(section: Section, deadline: float, logs: Path) -> dict[str, Any]:
    """Run one section within its timeout and the budget left; its record for gpu.json (never raises)."""
    record: dict[str, Any] = {"name": section.name, "group": section.group, "status": "", "seconds": 0.0,
                              "spec": section.spec}  # fmt: skip
    if section.skip:
        record["status"] = section.skip
        return record
    left = deadline - time.monotonic() - MARGIN_S
    if left < section.need:
        record["status"] = "skipped: budget"
        record["note"] = f"{max(left, 0):.0f} s left, needs {section.need:.0f}"
        return record
    timeout = min(section.timeout, left)
    record["timeout_s"] = round(timeout, 1)
    log_path = logs / f"{len(list(logs.iterdir())):02d}.log"
    record["log"] = str(log_path)
    start = time.monotonic()
    timed_out = False
    with open(log_path, "w") as log:
        proc = subprocess.Popen(section.argv, cwd=REPO, env=section_env(), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_tree(proc)
            proc.wait()
    record["seconds"] = round(time.monotonic() - start, 1)
    record["returncode"] = proc.returncode
    output = log_path.read_text(errors="replace")
    if timed_out:
        record["status"] = section.timeout_status.format(timeout)
        record["tail"] = output[-TAIL_CHARS:]
        return record
    try:
        status, figures = READERS[section.group](section, output, proc.returncode)
    except Exception as e:  # a reader's own failure is the section's, not the run's
        status, figures = f"failed: reading its output ({type(e).__name__}: {e})", {}
    record["status"], record["figures"] = status, figures
    if status not in ("ok", "passed"):
        record["tail"] = output[-TAIL_CHARS:]
    return record


def worker_result(output: str) -> dict[str, Any] | None:
    """The dict a worker emitted (its last tagged line), or None."""
    for line in reversed(output.splitlines()):
        if line.startswith(C.RESULT_TAG):
            return json.loads(line[len(C.RESULT_TAG) :])
    return None


def read_worker(section: Section, output: str, returncode: int) -> tuple[str, dict[str, Any]]:
    result = worker_result(output)
    if returncode != 0 or result is None:
        oom = "OutOfMemoryError" in output or "CUDA out of memory" in output
        return f"failed (exit {returncode}{', out of memory' if oom else ''})", result or {}
    return "ok", result


def read_pytest(section: Section, output: str, returncode: int) -> tuple[str, dict[str, Any]]:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    summary = lines[-1].strip("= ") if lines else ""
    if returncode == 0 and "passed" in summary:
        status = "passed"
    elif returncode == 0 and "skipped" in summary:
        status = "skipped: no CUDA" if not torch.cuda.is_available() else "skipped (see tail)"
    elif returncode == 5:
        status = "no tests collected"
    else:
        status = f"failed (exit {returncode})"
    return status, {"summary": summary, "tail": "\n".join(lines[-15:])}


def read_ddp(section: Section, output: str, returncode: int) -> tuple[str, dict[str, Any]]:
    """metrics.csv of the fit: every loss and mAP row finite, one mAP per epoch."""
    spec = section.spec
    backend = next((line.split("=", 1)[1].strip() for line in output.splitlines()
                    if line.startswith("distributed_backend=")), "-")  # fmt: skip
    files = sorted(Path(spec["root"]).glob("lightning_logs/version_*/metrics.csv"), key=os.path.getmtime)
    figures: dict[str, Any] = {"backend": backend}
    if returncode != 0 or not files:
        return f"failed (exit {returncode}{'' if files else ', no metrics.csv'})", figures
    with open(files[-1], newline="") as f:
        rows = list(csv.DictReader(f))
    losses = {c: [float(r[c]) for r in rows if r.get(c)] for c in LOSS_COLUMNS}
    maps = [float(r[MAP_COLUMN]) for r in rows if r.get(MAP_COLUMN)]
    values = [v for column in losses.values() for v in column] + maps
    finite = bool(values) and all(math.isfinite(v) for v in values)
    skipped = [float(r["train/skipped_steps"]) for r in rows if r.get("train/skipped_steps")]
    figures.update({
        "loss_rows": len(losses[LOSS_COLUMNS[0]]), "last_losses": {c: v[-1] for c, v in losses.items() if v},
        "map50_95": maps, "finite": finite, "skipped_steps": max(skipped, default=0.0),
    })  # fmt: skip
    problems = []
    if not finite:
        problems.append("a loss or mAP is not finite (or none was logged)")
    if len(maps) != spec["epochs"]:
        problems.append(f"{len(maps)} mAP rows for {spec['epochs']} epochs")
    if backend != spec["backend"]:
        problems.append(f"backend {backend}, not {spec['backend']}")
    rates = [(float(r["perf/images_per_second"]), float(r["perf/images_per_second_per_device"])) for r in rows
             if r.get("perf/images_per_second") and r.get("perf/images_per_second_per_device")]  # fmt: skip
    ranks = round(rates[-1][0] / rates[-1][1]) if rates and rates[-1][1] else 0
    figures["ranks"] = ranks
    if ranks != spec["ranks"]:
        problems.append(f"{ranks} rank(s) logged, not {spec['ranks']}")
    return ("failed: " + "; ".join(problems)) if problems else "ok", figures


READERS: dict[str, Callable[[Section, str, int], tuple[str, dict[str, Any]]]] = {
    "tf32-probe": read_worker, "resume": read_worker, "audit": read_pytest, "ddp": read_ddp,
    "prepare": read_worker, "throughput": read_worker,
    "data": read_worker, "memory": read_worker, "sync-sites": read_worker, "tensorrt": read_worker,
}  # fmt: skip


# ------------------------------------------------------------------------------------ machine, report
def _dist_version(*names: str) -> str:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "-"


def machine() -> dict[str, Any]:
    """GPU (from nvidia-smi: no CUDA context in the parent), driver, CPU and the versions that matter."""
    info: dict[str, Any] = {"cpu": C.cpu_name(), "cores": os.cpu_count(), "load": C.load_average(),
                            "python": sys.version.split()[0], "torch": torch.__version__,
                            "cuda": torch.version.cuda or "-"}  # fmt: skip
    try:
        info["cudnn"] = torch.backends.cudnn.version() if torch.cuda.is_available() else "-"
    except Exception:  # cuDNN missing from the build
        info["cudnn"] = "-"
    for key, names in {"lightning": ("lightning", "pytorch-lightning"), "torchmetrics": ("torchmetrics",),
                       "torchvision": ("torchvision",), "jsonargparse": ("jsonargparse",),
                       "faster_coco_eval": ("faster-coco-eval",),
                       "opencv": ("opencv-python-headless", "opencv-python"), "numpy": ("numpy",)}.items():  # fmt: skip
        info[key] = _dist_version(*names)
    try:
        query = "--query-gpu=name,driver_version,memory.total"
        smi = subprocess.run(["nvidia-smi", query, "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=30).stdout.strip().splitlines()  # fmt: skip
        name, driver, memory = (x.strip() for x in smi[0].split(","))
        info.update(gpu=name, driver=driver, gpu_memory=memory)
    except Exception:  # no nvidia-smi (CPU machine)
        info.update(gpu="-", driver="-", gpu_memory="-")
    return info


def commit() -> str:
    """``git describe --always --dirty`` here, else what gpu_wheels.sh wrote into .whl/COMMIT (the device's
    copy of the tree has no .git)."""
    try:
        proc = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True,
                              text=True, timeout=10)  # fmt: skip
        if proc.returncode == 0 and proc.stdout.strip():
            return proc.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    marker = REPO / ".whl" / "COMMIT"
    return f"{marker.read_text().strip()} (from .whl/COMMIT)" if marker.is_file() else "unknown"


def fmt(value: Any, digits: str = ".1f") -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, digits)


def render(report: dict[str, Any]) -> str:
    """gpu.md: the header, the section statuses, then one table per group that ran."""
    m, records = report["machine"], report["sections"]
    by_group: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_group.setdefault(r["group"], []).append(r)
    figures = lambda r: r.get("figures") or {}  # noqa: E731
    out = [
        f"# benchmarks/device/gpu.py{' --cpu-smoke (the figures mean nothing)' if report['cpu_smoke'] else ''}",
        "",
        f"GPU {m['gpu']} ({m['gpu_memory']}, driver {m['driver']}); CPU {m['cpu']}, {m['cores']} cores, "
        f"load {m['load']}; python {m['python']}, torch {m['torch']} (CUDA {m['cuda']}, cuDNN {m['cudnn']}), "
        f"lightning {m['lightning']}, torchmetrics {m['torchmetrics']}, jsonargparse {m['jsonargparse']}, "
        f"faster-coco-eval {m['faster_coco_eval']}, opencv {m['opencv']}; commit {report['commit']}; "
        f"budget {report['budget_s']:.0f} s, wall {report['wall_s']:.0f} s, {report['started']}.",
        "",
        C.format_table(
            ["section", "status", "s"], [[r["name"], r["status"], fmt(r["seconds"])] for r in records]
        ),
    ]

    def table(caption: str, headers: list[str], rows: list[list[Any]]) -> None:
        if rows:
            out.extend(["", f"**{caption}**", "", C.format_table(headers, rows)])

    rows = []
    for r in by_group.get("ddp", []):
        f = figures(r)
        losses = f.get("last_losses", {})
        rows.append([r["name"], r["status"], f.get("backend", "-"), f.get("ranks", "-"), f.get("loss_rows", "-"),
                     " / ".join(fmt(losses.get(c), ".3f") for c in LOSS_COLUMNS),
                     " ".join(fmt(v, ".4f") for v in f.get("map50_95", [])) or "-", fmt(r["seconds"])])  # fmt: skip
    d = by_group.get("ddp", [{}])[0].get("spec", {})
    table(f"DDP fits on the one GPU through the CLI, quickstart config, with validation ({d.get('train')} / "
          f"{d.get('val')} synthetic images at {d.get('size')}, global batch {d.get('batch')}); 2-rank: two "
          "processes on the GPU over gloo",
          ["fit", "status", "backend", "ranks", "loss rows", "last box / cls / dfl loss", "val mAP50-95 per epoch",
           "s"], rows)  # fmt: skip

    for r in by_group.get("resume", []):
        f = figures(r)
        rows = [[c, fmt(f.get("resumed", {}).get(c), ".4f"), fmt(f.get("uninterrupted", {}).get(c), ".4f"),
                 fmt(f.get("difference", {}).get(c), "+.4f")] for c in (*LOSS_COLUMNS, MAP_COLUMN)]  # fmt: skip
        table(f"A 16-mixed fit resumed after epoch 1 under bf16-mixed, against the uninterrupted 16-mixed fit, "
              f"last epoch: {r['status']}", ["value", "resumed", "uninterrupted", "difference"], rows)  # fmt: skip

    for r in by_group.get("tensorrt", []):
        f = figures(r)
        rows = [[x["precision"], fmt(x.get("engine_mb"), ".2f"), fmt(x.get("build_s")), fmt(x.get("ms_b1"), ".2f"),
                 fmt(x.get("value"), ".4f"), fmt(x.get("difference"), "+.4f"), x.get("note", "")]
                for x in f.get("rows", [])] or [["-", "-", "-", "-", "-", "-", r["status"]]]  # fmt: skip
        table(f"TensorRT {f.get('tensorrt', '')} engines of the ddp 16-mixed checkpoint ({f.get('size', '-')} px, its "
              f"synthetic val split, the checkpoint's validator; ms: engine only at batch 1): {r['status']}",
              ["engine", "MB", "build s", "ms b1", f"{(f.get('rows') or [{}])[0].get('metric', 'metric')}",
               "difference", "note"], rows)  # fmt: skip

    for r in by_group.get("tf32-probe", []):
        f = figures(r)
        rows = [[mode, v["matmul_precision"], v["state"]["matmul"], v["state"]["cudnn_conv"],
                 fmt(v["matmul_rel_err"], ".1e"), fmt(v["conv_rel_err"], ".1e")]
                for mode, v in f.get("modes", {}).items()]  # fmt: skip
        table(f"TF32 probe ({f.get('device', '-')}): each mode as the throughput rows set it, read back the way "
              f"Lightning reads it; max error against float64: {r['status']}",
              ["mode", "get_float32_matmul_precision", "matmul", "cuDNN conv", "matmul err", "conv err"], rows)  # fmt: skip

    rows, base = [], {}
    for r in by_group.get("throughput", []):
        f, spec = figures(r), r["spec"]
        ok = r["status"] == "ok"
        if ok and spec["variant"] == "fp32":
            base[spec["scale"]] = f["rate"]
        ratio = C.ratio(f["rate"], base.get(spec["scale"], float("nan"))) if ok else "-"
        rows.append([f"yolo11{spec['scale']}", f.get("batch", "-"), VARIANTS[spec["variant"]][0],
                     fmt(f.get("rate")) if ok else "-", ratio, f.get("steps", "-"), fmt(f.get("warmup_s")),
                     fmt(f.get("peak_gib"), ".2f"), r["status"]])  # fmt: skip
    size = next((r["spec"]["size"] for r in by_group.get("throughput", [])), "-")
    table(
        f"Training images/s through fit at {size}, batches held in memory, one optimiser step per batch; "
        "steady window after the warm-up (device synced at its two ends only); peak memory of the window",
        ["model", "batch", "variant", "img/s", "vs fp32", "steps", "warm-up s", "peak GiB", "status"],
        rows,
    )

    for r in by_group.get("data", []):
        f, spec = figures(r), r["spec"]
        rows = [[w, fmt(v["rate"]), fmt(v["per_worker"])] for w, v in f.get("workers", {}).items()]
        table(f"Data pipeline: the DataModule's train loader (mosaic, {spec['size']} px, batch {spec['batch']}, "
              f"COCO-like JPEGs), {spec['epochs']} epochs after a start-up one, {f.get('cpus', '-')} CPUs: "
              f"{r['status']}", ["workers", "img/s", "img/s per worker"], rows)  # fmt: skip

    for r in by_group.get("memory", []):
        f, spec = figures(r).get("peak_gib", {}), r["spec"]
        rows = [
            [f"yolo11{s}", *(fmt(f.get(f"{s},{b}"), ".2f") for b in spec["batches"])] for s in spec["scales"]
        ]
        table(f"Peak memory (GiB) of a bare bf16-mixed training step at {spec['size']}: {r['status']}",
              ["scale", *(f"batch {b}" for b in spec["batches"])], rows)  # fmt: skip

    for r in by_group.get("sync-sites", []):
        f = figures(r)
        rows = [[site, f"{count:.2f}"] for site, count in f.get("sites", {}).items()] or [["none", "0"]]
        table(
            f"Host syncs per step of a 1-rank DDP fit (bf16-mixed, backend {f.get('backend', '-')}, "
            f"{f.get('steps', '-')} steps audited): {r['status']}",
            ["asked for by", "per step"],
            rows,
        )

    for r in by_group.get("audit", []):
        tail = figures(r).get("tail") or r.get("tail", "")
        out.extend(["", f"**Sync audit (tests/e2e/test_gpu_syncs.py): {r['status']}**"])
        if tail:
            out.extend(["", "```", tail.strip()[-TAIL_CHARS:], "```"])
    return "\n".join(out) + "\n"


def write_report(out_dir: Path, report: dict[str, Any]) -> str:
    """gpu.json and gpu.md, each replaced whole (a run killed mid-write leaves the previous ones)."""
    text = render(report)
    for name, content in (("gpu.json", json.dumps(report, indent=1, default=str)), ("gpu.md", text)):
        tmp = out_dir / f".{name}.tmp"
        tmp.write_text(content)
        os.replace(tmp, out_dir / name)
    return text


# ------------------------------------------------------------------------------------ parent
def main() -> None:
    parser = C.parser(__doc__, worker=tuple(WORKERS), hidden=("--spec",))
    parser.add_argument("--out", type=Path, default=None, help="results folder (default: a new temp dir)")
    parser.add_argument(
        "--budget", type=float, default=None, help=f"seconds for all sections ({BUDGET_S:.0f}; smoke 600)"
    )
    parser.add_argument(
        "--sections", default="", help="comma-separated section names or groups (default all)"
    )
    parser.add_argument("--window", type=float, default=None, help="seconds of each throughput window (5)")
    parser.add_argument("--cpu-smoke", action="store_true", help="every section on CPU at toy sizes")
    args = parser.parse_args()
    if C.run_as_worker(args, lambda a: WORKERS[a.worker](json.loads(a.spec))):
        return

    started = time.monotonic()
    cuda = torch.cuda.is_available()
    out_dir = args.out or Path(tempfile.mkdtemp(prefix="gpu_bench_"))
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = Settings.smoke() if args.cpu_smoke else Settings()
    if args.window is not None:
        settings.window_s = args.window
    budget = args.budget if args.budget is not None else 600.0 if args.cpu_smoke else BUDGET_S
    deadline = started + budget
    work = C.default_workdir() / ("gpu_smoke" if args.cpu_smoke else "gpu")
    logs = work / f"logs_{os.getpid()}"
    logs.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "budget_s": budget, "wall_s": 0.0,
        "cpu_smoke": args.cpu_smoke, "commit": commit(), "machine": machine(), "settings": settings.__dict__,
        "sections": [],
    }  # fmt: skip
    print(C.machine_info(), flush=True)
    if not cuda and not args.cpu_smoke:
        report["note"] = "no CUDA device: nothing measured (--cpu-smoke runs the code paths on CPU)"
        write_report(out_dir, report)
        print(report["note"])
        return
    sections = build_sections(args, settings, work, cuda)
    text = write_report(out_dir, report)
    hung: set[str] = set()  # groups whose hang should not cost the budget twice
    ended: dict[str, str] = {}  # section name -> status
    with open(out_dir / "sections.log", "w") as section_log:
        for section in sections:
            print(f"[{time.monotonic() - started:5.0f} s] {section.name} ...", flush=True)
            if section.group in hung and not section.skip:
                section.skip = f"skipped: an earlier {section.group} section timed out"
            if section.needs and ended.get(section.needs, "ok") != "ok" and not section.skip:
                section.skip = f"skipped: {section.needs} {ended[section.needs]}"
            record = run_section(section, deadline, logs)
            if section.one_timeout and record["status"].startswith("timeout"):
                hung.add(section.group)
            ended[section.name] = record["status"]
            report["sections"].append(record)
            report["wall_s"] = time.monotonic() - started
            print(
                f"[{report['wall_s']:5.0f} s] {section.name}: {record['status']} ({record['seconds']} s)",
                flush=True,
            )
            if record.get("log"):
                section_log.write(f"\n===== {section.name}: {record['status']}\n")
                section_log.write(Path(record["log"]).read_text(errors="replace")[-LOG_CHARS:])
                section_log.flush()
            text = write_report(out_dir, report)
    print("\n" + text, flush=True)
    print(f"results: {out_dir}/gpu.json, gpu.md, sections.log")


if __name__ == "__main__":
    main()
