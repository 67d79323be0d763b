"""On paper: yolo11n/s/m training at 640 px on 8 and 64 H100-class GPUs (DDP, NCCL).

Every number of ``benchmarks/scale/scaling_model.md`` ("On paper: 8 and 64 GPUs") comes from this script and
the constants below (each with where it comes from). Nothing is timed: the models are built on the meta
device to count parameters, BatchNorm buffers, FLOPs and activation bytes, plus one CPU step of yolo11n/s/m
at 64 px to count the aten ops a training step dispatches (the host's share of a step on a GPU).

    python benchmarks/scale/scaling_model.py          # a few seconds on a CPU

Model of one step (per-GPU batch B, weak scaling: the same B on every GPU):
  * GPU time: a roofline per layer call of the training-mode forward (convolution FLOPs at MATH_EFFICIENCY
    of the bf16 peak, or activation bytes at MEMORY_EFFICIENCY of the HBM bandwidth, whichever is slower),
    times TRAIN_TO_FORWARD for forward + backward, plus the optimiser, EMA and clipping traffic;
  * host time: aten ops per step x HOST_US_PER_OP + HOST_LOOP_MS (eager PyTorch launches every kernel);
  * compute step = max(GPU, host) (the host runs ahead of the GPU until a sync);
  * gradient all-reduce: DDP's buckets (1 MiB first, then 25 MiB, in backward order), each a hierarchical
    ring all-reduce (NVLink reduce-scatter, ring over the nodes' NICs, NVLink all-gather), launched when its
    last gradient is ready during the backward (the last BACKWARD_SHARE of the step) and run one after the
    other; exposed = what ends after the backward, plus the small per-step collectives;
  * efficiency = compute step / (compute step + exposed communication).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers (_common, ...)

import _common  # noqa: F401  (the repository on sys.path)
import torch
import torch.distributed as dist
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from yolo11_lightning.cli.info import summarize
from yolo11_lightning.loss.detection import DetectionLoss
from yolo11_lightning.nn.yolo11 import YOLO11

# ----------------------------------------------------------------------------------------------- workload
IMAGE = 640  # training image size (COCO recipe)
SCALES = ("n", "s", "m")
NUM_CLASSES = 80  # COCO
BATCH = 16  # per-GPU batch of the main table (configs/trainer/ddp_8gpu.yaml ships 64 global = 8 per GPU)
BATCHES = (8, 16, 32)  # per-GPU batches of the step-time table

# ------------------------------------------------------------------------------------------------ the GPU
PEAK_FLOPS = 989e12  # H100 SXM, dense bf16 Tensor Core peak (NVIDIA datasheet; 1979 is with 2:4 sparsity)
HBM_BYTES_S = 3.35e12  # H100 SXM HBM3 bandwidth (NVIDIA datasheet)
MATH_EFFICIENCY = 0.6  # assumption: share of the peak a cuDNN bf16 convolution gets when compute-bound
MEMORY_EFFICIENCY = 0.7  # assumption: share of HBM bandwidth reached by BN, SiLU, concat and thin convs
ACT_BYTES = 2  # bf16-mixed: activations in bf16 (configs/trainer/*.yaml: precision bf16-mixed)
TRAIN_TO_FORWARD = 3.0  # forward + backward = 3 x forward: the backward computes grad-input and grad-weight
# (2x the FLOPs) and reads the output gradient and the saved input, writes the input gradient (~2x the bytes)
OPTIM_BYTES_PER_PARAM = 40  # fp32 traffic per parameter and step: SGD-Nesterov foreach (read p, g, buffer;
# write p, buffer: 20 B), EMA (read ema, p; write ema: 12 B), norm clipping (read g, scale g in place: 8 B)

# --------------------------------------------------------------------------------------------- the host
HOST_US_PER_OP = 5.0  # assumption: eager PyTorch dispatch + CUDA launch per aten op on a ~3 GHz server core
HOST_LOOP_MS = 3.0  # assumption: Lightning's loop, self.log, optimiser/EMA/clip foreach launches, per step

# ------------------------------------------------------------------------------------------ communication
GPUS_PER_NODE = 8  # HGX/DGX H100 node
NVLINK_BUS_BYTES_S = 370e9  # assumption: nccl-tests all_reduce bus bandwidth on 8 H100 SXM (NVLink 4,
# 450 GB/s per direction per GPU) for large messages without NVLink SHARP; ~360-400 GB/s is the usual figure
NVLINK_ALPHA_S = 1e-6  # assumption: latency per ring step inside a node (small all-reduce on 8 GPUs ~14 us)
NET_EFFICIENCY = 0.9  # assumption: NCCL over InfiniBand / RoCE reaches ~90% of the line rate (TCP: less)
FIRST_BUCKET_BYTES = dist._DEFAULT_FIRST_BUCKET_BYTES  # 1 MiB: DDP's first bucket (torch default)
BUCKET_BYTES = 25 * 1024 * 1024  # DDP bucket_cap_mb=25 (torch default; Lightning's DDPStrategy keeps it)
GRAD_BYTES = 4  # DDP all-reduces the fp32 .grad of fp32 parameters, autocast or not
BACKWARD_SHARE = 2 / 3  # the backward's share of a step: the window the bucket all-reduces can hide in
SMALL_COLLECTIVES = 1  # per step, exposed: the step exchange (training/step_exchange.py), one all-reduce
# of the loss normalisers and term sums with the ranks' flags (counted on the emu device, tests/e2e/test_gpu_path.py;
# before it: 4, two all-reduces behind barriers, Lightning's SIGTERM broadcast and the stop agreement)
SMALL_BYTES = 32  # 4 loss values + 4 flags, float32


@dataclass(frozen=True)
class Network:
    """Where the 8 GPUs of each node meet the other nodes."""

    name: str
    nodes: int  # 1: one node, NVLink only
    nic_bits_s: float = 0.0  # line rate of one NIC
    nics_per_node: int = 1
    alpha_s: float = 0.0  # latency per inter-node ring step (assumption, see the constants)

    @property
    def gpus(self) -> int:
        return self.nodes * GPUS_PER_NODE

    @property
    def node_bytes_s(self) -> float:
        """What one node can send to the next while all its NICs are busy."""
        return self.nic_bits_s / 8 * NET_EFFICIENCY * self.nics_per_node


SETUPS = (
    Network("8 GPUs, 1 node, NVLink", nodes=1),
    # 100 Gb/s Ethernet (RoCE), one NIC per node: 12.5 GB/s line rate; ~10 us per step is an assumption
    Network("64 GPUs, 8 nodes, 100 Gb/s, 1 NIC/node", nodes=8, nic_bits_s=100e9, alpha_s=10e-6),
    # 400 Gb/s InfiniBand NDR: 50 GB/s line rate; ~5 us per step (switch + NCCL proxy) is an assumption
    Network("64 GPUs, 8 nodes, 400 Gb/s, 1 NIC/node", nodes=8, nic_bits_s=400e9, alpha_s=5e-6),
    # the usual H100 node: one 400 Gb/s NIC per GPU (8 rails), NCCL runs one ring per rail
    Network(
        "64 GPUs, 8 nodes, 400 Gb/s, 1 NIC/GPU", nodes=8, nic_bits_s=400e9, nics_per_node=8, alpha_s=5e-6
    ),
)

# ---------------------------------------------------------------------------------------------- the data
WORKER_IMAGES_S = 294.0  # speed/data_speed.md, "Mosaic partner pools": one DataLoader worker, 640 px,
# COCO-like JPEGs, default `recent` mosaic partners, on this project's shared virtualised 2-core machine
SERVER_CORE_SPEEDUP = 1.0  # assumption: a server core counted as fast as that shared vCPU (likely 1-1.5x)
LOADER_HEADROOM = 1.3  # workers for 1.3x the GPU's image rate: batches vary in cost (mosaic, decode sizes)
NODE_CORES = (64, 192)  # physical cores of an 8-GPU node, low and high end (2 x 32 to 2 x 96)

# --------------------------------------------------------------------------------------- cross-checks
V100_PEAK_FLOPS = 125e12  # V100 SXM2 fp16 Tensor Core peak (NVIDIA datasheet)
V100_HBM_BYTES_S = 0.9e12  # V100 HBM2 (datasheet)
YOLOV5_V100_DAYS = {"n": 1, "s": 2, "m": 4}  # YOLOv5 README: "Training times for YOLOv5n/s/m/l/x are
# 1/2/4/6/8 days on a V100 GPU" (300 epochs of COCO, per-epoch validation and data loading included)
COCO_TRAIN_IMAGES = 118_287
YOLOV5_EPOCHS = 300
YOLOV5L_A100_EPOCH_S = {1: 20 * 60 + 39, 8: 3 * 60 + 9}  # Ultralytics' YOLOv5 multi-GPU tutorial: one COCO
# epoch of YOLOv5l, 16 images per GPU, 1 and 8 A100 SXM4-40GB (AWS p4d), torch 1.9: 20:39 and 3:09
YOLOV5L_GFLOPS = 109.1  # YOLOv5 README (640 px)
A100_PEAK_FLOPS = 312e12  # A100 dense fp16/bf16 Tensor Core peak (datasheet)


# ============================================================================================== the model
@dataclass
class Call:
    """One leaf-module call of the training forward, per image: FLOPs, HBM bytes, parameters it owns."""

    flops: float
    hbm_bytes: float
    params: list[nn.Parameter]


@dataclass
class Anatomy:
    """What the scaling model needs to know about one scale."""

    scale: str
    params: int  # trainable
    gflops: float  # forward, per 640 image, convolutions + attention matmuls (yolo11-lightning info)
    bn_buffer_bytes: int  # running_mean + running_var of every BatchNorm (fp32)
    buffer_bytes: int  # every buffer DDP broadcasts (the BN statistics and their int64 counters)
    calls: list[Call]
    host_ops: int  # aten ops of forward + loss + backward


def _tensors(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _tensors(v)]
    return []


def forward_calls(model: nn.Module) -> list[Call]:
    """Leaf-module calls of one training forward at IMAGE px (meta device), in execution order."""
    calls: list[Call] = []
    owned: set[int] = set()

    def hook(module: nn.Module, inputs: tuple, output: object) -> None:
        if isinstance(module, nn.Identity):
            return  # no kernel
        n_in = sum(t.numel() for t in _tensors(inputs))
        n_out = sum(t.numel() for t in _tensors(output))
        flops, moved = 0.0, n_in + n_out
        if isinstance(module, nn.Conv2d):
            kh, kw = module.kernel_size
            flops = 2.0 * n_out * (module.in_channels // module.groups) * kh * kw
            moved += module.weight.numel()  # its bf16 copy
        elif isinstance(module, nn.BatchNorm2d):
            moved += n_in  # training BN reads its input twice: statistics, then normalisation
        params = (
            [] if id(module) in owned else [p for p in module.parameters(recurse=False) if p.requires_grad]
        )
        owned.add(id(module))
        calls.append(Call(flops, moved * ACT_BYTES, params))

    leaves = {m for m in model.modules() if not m._modules}  # the shared SiLU once: hooks fire per call
    handles = [m.register_forward_hook(hook) for m in leaves]
    try:
        model(torch.zeros(1, 3, IMAGE, IMAGE, device="meta"))
    finally:
        for h in handles:
            h.remove()
    return calls


class _CountOps(TorchDispatchMode):
    """Counts the aten ops dispatched under it (what eager PyTorch launches one by one on a GPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        self.ops += 1
        return func(*args, **(kwargs or {}))


def host_ops(scale: str) -> int:
    """Aten ops of one training forward + loss + backward (yolo11 at 64 px on CPU, 2 images, 2 boxes)."""
    torch.manual_seed(0)
    model = YOLO11(scale, NUM_CLASSES).train()
    criterion = DetectionLoss(NUM_CLASSES)
    images = torch.rand(2, 3, 64, 64)
    targets = torch.tensor([[0, 1, 0.5, 0.5, 0.3, 0.3], [1, 2, 0.4, 0.4, 0.2, 0.5]])
    count = _CountOps()
    for step in range(2):  # the second step: the loss caches its anchor grid on the first
        if step:
            count = _CountOps()
        with count:
            loss, _ = criterion(model(images), targets)
            loss.backward()
        model.zero_grad(set_to_none=True)
    return count.ops


def anatomy(scale: str) -> Anatomy:
    """Parameters, buffers, FLOPs, per-layer bytes and host ops of one scale."""
    with torch.device("meta"):
        model = YOLO11(scale, NUM_CLASSES).train()
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    bn_bytes = sum(b.numel() * b.element_size() for m in bns for b in (m.running_mean, m.running_var))
    calls = forward_calls(model)
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert params == sum(p.numel() for c in calls for p in c.params), "a parameter not seen in the forward"
    return Anatomy(
        scale=scale,
        params=params,
        gflops=summarize(scale, NUM_CLASSES, (IMAGE, IMAGE))["gflops_total"],
        bn_buffer_bytes=bn_bytes,
        buffer_bytes=sum(b.numel() * b.element_size() for b in model.buffers()),
        calls=calls,
        host_ops=host_ops(scale),
    )


# --------------------------------------------------------------------------------------------- timings
def call_seconds(call: Call, peak: float = PEAK_FLOPS, hbm: float = HBM_BYTES_S) -> float:
    """Roofline time of one forward layer call for one image."""
    return max(call.flops / (peak * MATH_EFFICIENCY), call.hbm_bytes / (hbm * MEMORY_EFFICIENCY))


def gpu_seconds(a: Anatomy, batch: int, peak: float = PEAK_FLOPS, hbm: float = HBM_BYTES_S) -> float:
    """GPU time of one training step: forward + backward of `batch` images, then optimiser + EMA."""
    layers = sum(call_seconds(c, peak, hbm) for c in a.calls)
    return batch * TRAIN_TO_FORWARD * layers + a.params * OPTIM_BYTES_PER_PARAM / (hbm * MEMORY_EFFICIENCY)


def host_seconds(a: Anatomy) -> float:
    """What the host needs to launch one step (independent of the batch)."""
    return a.host_ops * HOST_US_PER_OP * 1e-6 + HOST_LOOP_MS * 1e-3


def allreduce_seconds(nbytes: float, net: Network) -> float:
    """Hierarchical ring all-reduce: NVLink reduce-scatter, ring over the nodes, NVLink all-gather."""
    g = GPUS_PER_NODE
    t = 2 * (g - 1) / g * nbytes / NVLINK_BUS_BYTES_S + 2 * (g - 1) * NVLINK_ALPHA_S
    if net.nodes > 1:  # each GPU's 1/g shard crosses the network; the node's NICs carry all g shards
        m = net.nodes
        t += 2 * (m - 1) / m * nbytes / net.node_bytes_s + 2 * (m - 1) * net.alpha_s
    return t


def broadcast_seconds(nbytes: float, net: Network) -> float:
    """Pipelined broadcast from rank 0: the bytes once over the slowest link, one latency per hop."""
    slowest = NVLINK_BUS_BYTES_S if net.nodes == 1 else min(NVLINK_BUS_BYTES_S, net.node_bytes_s)
    return nbytes / slowest + (GPUS_PER_NODE - 1) * NVLINK_ALPHA_S + (net.nodes - 1) * net.alpha_s


def buckets(a: Anatomy, bucket_bytes: int = BUCKET_BYTES) -> list[tuple[int, float]]:
    """DDP's buckets after its first-step rebuild, in launch order: (bytes, ready as a share of the backward).

    The backward runs the forward's layer calls in reverse; a parameter's gradient is ready when its layer's
    backward is done, at the share of the backward time (per-layer roofline) spent by then.
    """
    weights = [call_seconds(c) for c in a.calls]
    total, done = sum(weights), 0.0
    params, ready = [], []
    for call, w in zip(reversed(a.calls), reversed(weights)):
        done += w
        params += call.params
        ready += [done / total] * len(call.params)
    limits = [FIRST_BUCKET_BYTES, bucket_bytes]
    grads = [torch.empty(p.shape, device="meta") for p in params]  # fp32, as DDP's gradients
    indices, _ = dist._compute_bucket_assignment_by_size(
        grads, limits, [False] * len(grads), list(range(len(grads)))
    )
    return [(sum(grads[i].numel() for i in b) * GRAD_BYTES, max(ready[i] for i in b)) for b in indices]


@dataclass(frozen=True)
class Options:
    """The DDP settings (and, in the sensitivity rows, the step-time assumptions) of a table row."""

    batch: int = BATCH
    grad_bytes_factor: float = 1.0  # 0.5: bf16_compress_hook
    bucket_bytes: int = BUCKET_BYTES
    broadcast_buffers: bool = False  # the DDP presets' setting (DDP's own default is True)
    gpu_scale: float = 1.0  # GPU time x this (2: the roofline twice too optimistic)
    host_scale: float = 1.0  # host time x this
    mfu: float | None = None  # GPU time from the FLOPs at this MFU instead of the roofline


def step_seconds(a: Anatomy, opt: Options = Options()) -> float:
    """One step on one GPU: the GPU and the host overlap, the slower one sets the pace."""
    if opt.mfu is None:
        gpu = gpu_seconds(a, opt.batch)
    else:
        gpu = opt.batch * a.gflops * 1e9 * TRAIN_TO_FORWARD / (PEAK_FLOPS * opt.mfu)
    return max(gpu * opt.gpu_scale, host_seconds(a) * opt.host_scale)


@dataclass
class Scaled:
    """One model on one setup."""

    step_1: float  # compute step, one GPU, no collective
    allreduce: float  # every bucket's all-reduce, back to back
    exposed: float  # communication the step waits for
    last_bucket: float  # the last bucket's all-reduce alone

    @property
    def efficiency(self) -> float:
        return self.step_1 / (self.step_1 + self.exposed)


def scaled(a: Anatomy, net: Network, opt: Options = Options()) -> Scaled:
    """Step, all-reduce and exposed communication of `a` on `net` with `opt`."""
    step = step_seconds(a, opt)
    backward = BACKWARD_SHARE * step
    end, total, last = 0.0, 0.0, 0.0
    for nbytes, ready in buckets(a, opt.bucket_bytes):
        last = allreduce_seconds(nbytes * opt.grad_bytes_factor, net)
        start = max(step - backward + ready * backward, end)  # the NCCL stream runs buckets in order
        end, total = start + last, total + last
    exposed = max(0.0, end - step) + SMALL_COLLECTIVES * allreduce_seconds(SMALL_BYTES, net)
    if opt.broadcast_buffers:
        exposed += broadcast_seconds(a.buffer_bytes, net)
    return Scaled(step, total, exposed, last)


# ============================================================================================== reporting
def table(headers: list[str], rows: list[list[object]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---:" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def ms(seconds: float) -> str:
    """Milliseconds with 3 significant digits (2 decimals under 1 ms)."""
    v = seconds * 1e3
    return f"{v:.2f}" if v < 1 else f"{v:.3g}" if v < 100 else f"{v:.0f}"


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.2f}"


def report_inputs(models: list[Anatomy]) -> None:
    """Parameters, FLOPs, bytes, host ops and buffers of each scale."""
    print("#### Inputs per model (640 px, 80 classes)\n")
    rows = []
    for a in models:
        act = sum(c.hbm_bytes for c in a.calls) * TRAIN_TO_FORWARD
        flops = a.gflops * 1e9 * TRAIN_TO_FORWARD
        rows.append([
            f"yolo11{a.scale}", f"{a.params:,}", f"{a.gflops:.2f}", f"{flops / 1e9:.1f}", f"{act / 1e9:.2f}",
            f"{flops / act:.0f}", a.host_ops, f"{a.bn_buffer_bytes:,}", f"{a.buffer_bytes:,}",
        ])  # fmt: skip
    print(table([
        "model", "trainable params", "fwd GFLOPs/img", "train GFLOP/img", "train HBM GB/img", "FLOP/byte",
        "aten ops/step", "BN running stats bytes", "all buffers bytes",
    ], rows))  # fmt: skip
    print(f"\nH100 SXM ridge point: {PEAK_FLOPS * MATH_EFFICIENCY / (HBM_BYTES_S * MEMORY_EFFICIENCY):.0f} "
          "FLOP/byte at the assumed efficiencies (a layer below it is bound by memory).")  # fmt: skip


def report_steps(models: list[Anatomy]) -> None:
    """Step time on one H100 for each per-GPU batch: GPU roofline, host floor, the slower one."""
    print("#### Step time on one H100 (per-GPU batch, 640 px)\n")
    rows = []
    for a in models:
        for b in BATCHES:
            gpu, host = gpu_seconds(a, b), host_seconds(a)
            step = max(gpu, host)
            mfu = b * a.gflops * 1e9 * TRAIN_TO_FORWARD / step / PEAK_FLOPS
            at30 = b * a.gflops * 1e9 * TRAIN_TO_FORWARD / (0.30 * PEAK_FLOPS)
            rows.append([
                f"yolo11{a.scale}", b, ms(gpu), ms(host), ms(step), "GPU" if gpu >= host else "host",
                f"{b / step:.0f}", pct(mfu), ms(at30),
            ])  # fmt: skip
    print(table([
        "model", "batch", "GPU ms (roofline)", "host ms (launch)", "step ms", "bound by", "img/s", "MFU",
        "ms at 30% MFU",
    ], rows))  # fmt: skip


def report_crosschecks(models: list[Anatomy]) -> None:
    """This model against published YOLOv5 training speeds."""
    print("#### Cross-checks against published training speeds\n")
    rows = []
    for a in models:
        days = YOLOV5_V100_DAYS[a.scale]
        published = COCO_TRAIN_IMAGES * YOLOV5_EPOCHS / (days * 86400)
        v100 = max(gpu_seconds(a, 64, V100_PEAK_FLOPS, V100_HBM_BYTES_S), host_seconds(a))
        rows.append([
            f"yolo11{a.scale} / YOLOv5{a.scale}", f"{64 / v100:.0f}", days, f"{published:.0f}",
            f"{64 / v100 / published:.2f}",
        ])  # fmt: skip
    print(table(["model (this model / published)", "this model on a V100, batch 64, img/s",
                 "YOLOv5 README: days for 300 epochs", "= img/s", "ratio"], rows))  # fmt: skip
    one, eight = (COCO_TRAIN_IMAGES / YOLOV5L_A100_EPOCH_S[n] for n in (1, 8))
    mfu = one * YOLOV5L_GFLOPS * 1e9 * TRAIN_TO_FORWARD / A100_PEAK_FLOPS
    efficiency = pct(eight / one / 8)
    print(f"\nYOLOv5l on A100s (multi-GPU tutorial, 16 per GPU): {one:.1f} img/s on 1 GPU ({pct(mfu)} of the "
          f"A100's dense fp16 peak), {eight:.0f} on 8 = {efficiency} scaling efficiency.")  # fmt: skip


def report_allreduce(models: list[Anatomy]) -> None:
    """Gradient bytes, DDP buckets and the all-reduce time on each setup."""
    print("#### Gradient all-reduce per step (fp32 gradients; bf16 hook: half the bytes)\n")
    rows = []
    for net in SETUPS:
        network = (
            [f"{net.node_bytes_s / 1e9:.2f}", f"{net.alpha_s * 1e6:.0f}"] if net.nodes > 1 else ["-", "-"]
        )
        rows.append(
            [net.name, net.gpus, f"{NVLINK_BUS_BYTES_S / 1e9:.0f}", f"{NVLINK_ALPHA_S * 1e6:.0f}", *network]
        )
    print(table([
        "setup", "GPUs", "NVLink bus GB/s", "NVLink us/step", "network GB/s per node", "network us/step",
    ], rows))  # fmt: skip
    print()
    rows = []
    for a in models:
        bk = buckets(a)
        for net in SETUPS:
            rows.append([
                f"yolo11{a.scale}", net.name, mb(a.params * GRAD_BYTES), len(bk), mb(bk[-1][0]),
                ms(sum(allreduce_seconds(n, net) for n, _ in bk)),
                ms(sum(allreduce_seconds(n / 2, net) for n, _ in bk)),
            ])  # fmt: skip
    print(table([
        "model", "setup", "gradient MB", "buckets", "last bucket MB", "all-reduce ms fp32",
        "all-reduce ms bf16",
    ], rows))  # fmt: skip


def report_efficiency(models: list[Anatomy]) -> None:
    """Step, all-reduce, exposed communication and scaling efficiency at the main batch."""
    print(f"#### Scaling efficiency (per-GPU batch {BATCH}, the DDP presets, step_1GPU / step_N)\n")
    rows = []
    for a in models:
        for net in SETUPS:
            s = scaled(a, net)
            rate = net.gpus * BATCH / (s.step_1 + s.exposed)
            rows.append([
                f"yolo11{a.scale}", net.name, ms(s.step_1), ms(s.allreduce), ms(s.last_bucket), ms(s.exposed),
                pct(s.efficiency), f"{rate:,.0f}", f"{COCO_TRAIN_IMAGES / rate:.1f}",
            ])  # fmt: skip
    print(table([
        "model", "setup", "step ms (1 GPU)", "all-reduce ms", "last bucket ms", "exposed comm ms",
        "efficiency", "img/s (all GPUs)", "COCO epoch s",
    ], rows))  # fmt: skip


def report_loader(models: list[Anatomy]) -> None:
    """DataLoader workers a GPU needs at the measured per-worker rate."""
    print("#### Loader workers per GPU (one step's images, 1.3x headroom)\n")
    rate = WORKER_IMAGES_S * SERVER_CORE_SPEEDUP
    rows = []
    for a in models:
        for b in BATCHES:
            need = b / step_seconds(a, Options(batch=b)) * LOADER_HEADROOM
            workers = math.ceil(need / rate)
            node = GPUS_PER_NODE * (workers + 1)  # + the rank's own main process
            rows.append([
                f"yolo11{a.scale}", b, f"{need / LOADER_HEADROOM:.0f}", workers, node,
                " / ".join(f"{node / c:.0%}" for c in NODE_CORES),
            ])  # fmt: skip
    print(table([
        "model", "batch", "img/s per GPU", "workers per GPU", "cores per 8-GPU node (workers + main)",
        f"share of {' / '.join(str(c) for c in NODE_CORES)} cores",
    ], rows))  # fmt: skip


def report_changes(models: list[Anatomy]) -> None:
    """Efficiency under other DDP settings, batches and step-time assumptions."""
    print("#### What would change the picture (efficiency; the first row is the table above)\n")
    variants = [
        (f"DDP presets, batch {BATCH}", Options()),
        ("bf16_compress_hook (half the bytes)", Options(grad_bytes_factor=0.5)),
        ("bucket_cap_mb 5", Options(bucket_bytes=5 * 1024 * 1024)),
        ("broadcast_buffers=True (DDP's default)", Options(broadcast_buffers=True)),
        ("per-GPU batch 8 (ddp_8gpu.yaml's 64 global)", Options(batch=8)),
        ("per-GPU batch 32", Options(batch=32)),
        ("batch 32 + bf16 hook + bucket 5 MB + no buffer broadcast",
         Options(batch=32, grad_bytes_factor=0.5, bucket_bytes=5 * 1024 * 1024, broadcast_buffers=False)),
        ("sensitivity: GPU time 2x the roofline", Options(gpu_scale=2.0)),
        ("sensitivity: host 2x slower (10 us per op)", Options(host_scale=2.0)),
        ("sensitivity: GPU at 30% MFU (no roofline)", Options(mfu=0.30)),
        ("sensitivity: 30% MFU and no host floor", Options(mfu=0.30, host_scale=0.0)),
    ]  # fmt: skip
    rows = []
    for name, opt in variants:
        for net in SETUPS[1:] if name != variants[0][0] else SETUPS:
            rows.append([name, net.name, *(pct(scaled(a, net, opt).efficiency) for a in models)])
    print(table(["variant", "setup", *(f"yolo11{a.scale}" for a in models)], rows))
    print()
    for a in models:
        saved = [ms(broadcast_seconds(a.buffer_bytes, net)) for net in SETUPS]
        copy = 4 * a.params * GRAD_BYTES / (HBM_BYTES_S * MEMORY_EFFICIENCY)  # in and out: read + write each
        print(f"- yolo11{a.scale}: broadcast_buffers=False saves one broadcast of {a.buffer_bytes:,} bytes "
              f"per forward ({' / '.join(saved)} ms on the four setups); gradient_as_bucket_view (on in the "
              f"DDP presets) saves copying {mb(a.params * GRAD_BYTES)} MB of gradients into and out of the "
              f"buckets, {ms(copy)} ms of HBM traffic per step.")  # fmt: skip


def report(models: list[Anatomy]) -> None:
    """Print every table of the README section, in its order, a blank line between them."""
    blocks = [
        report_inputs,
        report_steps,
        report_crosschecks,
        report_allreduce,
        report_efficiency,
        report_loader,
    ]
    for i, block in enumerate([*blocks, report_changes]):
        if i:
            print()
        block(models)


def main() -> None:
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    torch.set_num_threads(1)
    report([anatomy(s) for s in SCALES])


if __name__ == "__main__":
    main()
