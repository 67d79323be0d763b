"""Give every rank rank 0's buffers before validation, so that each shard is scored by the one saved model.

Ranks update their BatchNorm statistics from their own batches. DDP's ``broadcast_buffers`` copies rank 0's
before a forward that follows a gradient all-reduce only, so not after an epoch that ends inside an accumulation
window, and never when it is off (``tests/e2e/test_ddp_buffers.py``).
"""

from __future__ import annotations

import torch
from lightning.pytorch.strategies import Strategy


def use_rank_zero_buffers(model: torch.nn.Module, strategy: Strategy) -> None:
    """Copies rank 0's buffers into ``model``: BatchNorm statistics, or the EMA's if swapped in."""
    buffers = dict(model.named_buffers())
    rank_zero = strategy.broadcast({k: v.detach().cpu() for k, v in buffers.items()}, src=0)
    with torch.no_grad():
        for name, buffer in buffers.items():
            buffer.copy_(rank_zero[name])
