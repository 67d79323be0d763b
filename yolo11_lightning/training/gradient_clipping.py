"""Clip the gradients of a fused optimiser under Lightning's mixed precision, which refuses to.

Lightning's mixed-precision plugin refuses to clip a fused optimiser (it would unscale inside its step), even under
bf16 where nothing is scaled. Under 16-mixed the gradients are unscaled here first (what Lightning does for the
other optimisers), so the clip is right and the scaler's step hands the fused kernel its found-inf flag: no host
read.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.plugins.precision import MixedPrecision, Precision


def clip_fused_under_mixed_precision(plugin: Precision, optimizer: Any, clip: float) -> bool:
    """Clips the gradients' norm to ``clip`` when the optimiser is fused and the plugin mixed precision.

    Otherwise returns False and does nothing: Lightning's own clipping applies.
    """
    torch_optimizer = getattr(optimizer, "optimizer", optimizer)
    if not isinstance(plugin, MixedPrecision) or not getattr(
        torch_optimizer, "_step_supports_amp_scaling", False
    ):
        return False
    if plugin.scaler is not None:
        plugin.scaler.unscale_(torch_optimizer)
    params = [p for group in torch_optimizer.param_groups for p in group["params"]]
    torch.nn.utils.clip_grad_norm_(params, clip)
    return True
