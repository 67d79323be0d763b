"""DDP's options in 2-rank CLI runs on gloo: what ``broadcast_buffers`` does to BatchNorm statistics, the EMA and
validation, and a gradient-compression hook that really runs on CPU.

Named by class path in ``tests/test_ddp_buffers.py`` and ``tests/test_comm_hook.py`` (``--trainer.callbacks+=
ddp_options.RecordBuffers``, ``--trainer.plugins ddp_options.CpuSyncBatchNorm``), so the runs go through the
real ``fit`` of the CLI.

``GlobalBatchNorm`` stands in for ``SyncBatchNorm`` on CPU: torch's SyncBatchNorm refuses CPU tensors (its
kernels, ``batch_norm_stats`` and friends, exist for CUDA only), so a gloo test cannot run it. It computes
what SyncBatchNorm computes, statistics of the global batch, from an all-reduce of per-channel sums, and
enters the run through Lightning's ``LayerSync`` plugin, as ``--trainer.sync_batchnorm true`` does on GPUs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.layer_sync import LayerSync
from torch import nn
from torch.distributed.nn.functional import all_reduce
from torch.nn.modules.batchnorm import _NormBase


def bn_statistics(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every BatchNorm running mean and variance, by name, cloned."""
    return {
        name: buf.detach().clone()
        for name, buf in model.named_buffers()
        if name.endswith(("running_mean", "running_var"))
    }


class RecordBuffers(Callback):
    """Each rank saves ``out_dir/buffers-rank<R>.pt`` at the last validation of ``fit``:

    ``raw``: the training module's BatchNorm statistics when validation starts (before the EMA swaps its
    average in); ``ema``: the EMA's averaged statistics then; ``validated``: the state dict of the model that
    scored this rank's validation shard (read after the first validation batch, so after any buffer
    broadcast DDP makes in that forward); ``output``: that model's eval output on a fixed input.
    """

    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)
        self.record: dict[str, Any] = {}

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn != "fit" or trainer.sanity_checking:
            return
        (ema,) = [c for c in trainer.callbacks if type(c).__name__ == "ModelEMA"]
        self.record = {
            "raw": bn_statistics(pl_module.model),
            "ema": bn_statistics(ema._average_model.module.model),
        }

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if not self.record or batch_idx != 0:
            return
        self.record["validated"] = {k: v.detach().clone() for k, v in pl_module.model.state_dict().items()}
        x = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            self.record["output"] = pl_module.model(x.to(pl_module.device)).cpu()

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.record:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            torch.save(self.record, self.out_dir / f"buffers-rank{trainer.global_rank}.pt")


class GlobalBatchNorm(_NormBase):
    """BatchNorm with the global batch's statistics in training, as ``SyncBatchNorm``, computed on any device.

    Not a ``SyncBatchNorm`` subclass: DDP refuses those on CPU modules. Same parameters and buffers as
    ``BatchNorm2d``, so checkpoints and the EMA see the usual names.

    Per channel, the sums of x and x² and the element count are summed over ranks (a differentiable
    all-reduce: the backward sums every rank's gradient of the shared statistics, as SyncBatchNorm's does);
    the running statistics are updated with the global mean and the unbiased global variance.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and dist.is_available() and dist.is_initialized()):
            return nn.functional.batch_norm(
                x, self.running_mean, self.running_var, self.weight, self.bias, self.training, self.momentum,
                self.eps,
            )  # fmt: skip
        channels = x.shape[1]
        local = torch.cat((x.sum((0, 2, 3)), (x * x).sum((0, 2, 3)), x.new_full((1,), x.numel() / channels)))
        total = all_reduce(local)
        count = total[-1]
        mean = total[:channels] / count
        var = (total[channels : 2 * channels] / count - mean * mean).clamp_min(0.0)
        with torch.no_grad():
            self.num_batches_tracked.add_(1)
            self.running_mean.lerp_(mean, self.momentum)
            self.running_var.lerp_(var * count / (count - 1), self.momentum)
        shape = (1, channels, 1, 1)
        scale = self.weight.view(shape) * torch.rsqrt(var.view(shape) + self.eps)
        return (x - mean.view(shape)) * scale + self.bias.view(shape)


class CpuSyncBatchNorm(LayerSync):
    """``--trainer.plugins ddp_buffers.CpuSyncBatchNorm``: every BatchNorm2d becomes a ``GlobalBatchNorm``
    (same parameters and statistics) for training, and back afterwards."""

    def apply(self, model: nn.Module) -> nn.Module:
        return self._convert(model, nn.BatchNorm2d, GlobalBatchNorm)

    def revert(self, model: nn.Module) -> nn.Module:
        return self._convert(model, GlobalBatchNorm, nn.BatchNorm2d)

    def _convert(self, module: nn.Module, old: type, new: type) -> nn.Module:
        if type(module) is old:
            converted = new(module.num_features, module.eps, module.momentum)
            converted.load_state_dict(module.state_dict())
            converted.to(module.weight.device)
            return converted
        for name, child in module.named_children():
            module.add_module(name, self._convert(child, old, new))
        return module


class CommHookOnCpu(Callback):
    """Registers the strategy's ``ddp_comm_hook`` (``--trainer.strategy.ddp_comm_hook``) on a CPU run and counts its
    calls. Lightning's ``DDPStrategy`` registers it on CUDA only (``_register_ddp_hooks``) and ignores it on CPU;
    this does there what it does on a GPU. Each rank writes ``out_dir/hook-rank<R>.json``: the hook's import path,
    how many gradient buckets went through it, and whether every averaged gradient it returned is a bf16 number
    (what a bf16 all-reduce gives; an fp32 one almost never does).
    """

    def __init__(self, out_dir: str) -> None:
        self.out_dir = Path(out_dir)
        self.calls = 0
        self.name = ""
        self.bf16_values = True

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        strategy = trainer.strategy
        hook = strategy._ddp_comm_hook
        self.name = f"{hook.__module__}.{hook.__qualname__}"

        def in_bf16(future: torch.futures.Future) -> torch.Tensor:
            mean = future.value()[0]
            self.bf16_values &= torch.equal(mean, mean.to(torch.bfloat16).to(mean.dtype))
            return mean

        # No annotations: DDP compares them with dist.GradBucket at run time, and this module's are strings.
        def counted(state, bucket):  # type: ignore[no-untyped-def]
            self.calls += 1
            return hook(state, bucket).then(in_bf16)

        strategy.model.register_comm_hook(state=strategy._ddp_comm_state, hook=counted)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        record = {"hook": self.name, "calls": self.calls, "bf16_values": self.bf16_values}
        (self.out_dir / f"hook-rank{trainer.global_rank}.json").write_text(json.dumps(record))
