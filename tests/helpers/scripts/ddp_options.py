"""DDP's options in 2-rank CLI runs on gloo: what ``broadcast_buffers`` does to BatchNorm statistics, the EMA and
validation, and a gradient-compression hook that really runs on CPU.

Named by class path in ``tests/e2e/test_ddp_buffers.py`` and ``tests/e2e/test_comm_hook.py`` (``--trainer.callbacks+=
ddp_options.RecordBuffers``, ``--trainer.callbacks+=ddp_options.CommHookOnCpu``), so the runs go through the
real ``fit`` of the CLI.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn


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
