"""Convolutional building blocks of YOLO11: Conv, DWConv, Bottleneck, C3k, C3k2, SPPF, Concat, Proto.

Attribute names (``conv``, ``bn``, ``cv1``, ``m`` ...) follow the reference layout so that a reference
state dict maps onto ours by a prefix rename. All tensors are (B, C, H, W).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

# Reference BatchNorm settings: a larger eps and a slower running-stat update than PyTorch's defaults.
BN_EPS = 1e-3
BN_MOMENTUM = 0.03
# One stateless SiLU shared by every Conv, as in the reference (so module/layer counts match it).
# Not in place: autograd needs SiLU's input for the backward, so an in-place SiLU makes it clone the
# input first - an extra copy per layer (3-5% of a CPU training step) and no memory saved.
_SILU = nn.SiLU()


class Conv(nn.Module):
    """Conv2d (no bias, 'same' padding) -> BatchNorm2d -> SiLU (or identity when ``act`` is False).

    ``fuse_bn()`` folds the BatchNorm into the convolution for inference; ``bn`` becomes an identity.
    """

    def __init__(self, c1: int, c2: int, k: int = 1, s: int = 1, g: int = 1, act: bool = True) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, k, s, padding=k // 2, groups=g, bias=False)
        self.bn: nn.Module = nn.BatchNorm2d(c2, eps=BN_EPS, momentum=BN_MOMENTUM)
        self.act: nn.Module = _SILU if act else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        return self.act(self.bn(self.conv(x)))

    @torch.no_grad()
    def fuse_bn(self) -> None:
        """Folds BN into the conv: w' = w·γ/σ, b' = β − μ·γ/σ, σ = sqrt(var + eps); idempotent."""
        bn = self.bn
        if not isinstance(bn, nn.modules.batchnorm._BatchNorm):  # BatchNorm2d or SyncBatchNorm
            return
        conv = self.conv
        scale = bn.weight / torch.sqrt(bn.running_var + bn.eps)  # (c2,)
        fused = nn.Conv2d(
            conv.in_channels,
            conv.out_channels,
            conv.kernel_size,
            conv.stride,
            conv.padding,
            groups=conv.groups,
            bias=True,
            device=conv.weight.device,
            dtype=conv.weight.dtype,
        )
        fused.weight.copy_(conv.weight * scale.view(-1, 1, 1, 1))
        fused.bias.copy_(bn.bias - bn.running_mean * scale)
        fused.requires_grad_(conv.weight.requires_grad)
        self.conv = fused
        self.bn = nn.Identity()


class DWConv(Conv):
    """Depth-wise Conv: groups = gcd(c1, c2) (so c1 == c2 gives one filter per channel)."""

    def __init__(self, c1: int, c2: int, k: int = 1, s: int = 1, act: bool = True) -> None:
        super().__init__(c1, c2, k, s, g=math.gcd(c1, c2), act=act)


class Bottleneck(nn.Module):
    """cv1 (k0×k0, c1→int(c2·e)) -> cv2 (k1×k1 → c2), plus the input when ``shortcut`` and c1 == c2."""

    def __init__(
        self, c1: int, c2: int, shortcut: bool = True, k: tuple[int, int] = (3, 3), e: float = 0.5
    ) -> None:
        super().__init__()
        hidden = int(c2 * e)
        self.cv1 = Conv(c1, hidden, k[0])
        self.cv2 = Conv(hidden, c2, k[1])
        self.add = shortcut and c1 == c2

    def forward(self, x: Tensor) -> Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C3k(nn.Module):
    """CSP block with two convs: m(cv1(x)) ‖ cv2(x) -> cv3; ``n`` 3×3/3×3 bottlenecks (e=1) in ``m``."""

    def __init__(self, c1: int, c2: int, n: int = 2, shortcut: bool = True, e: float = 0.5) -> None:
        super().__init__()
        hidden = int(c2 * e)
        self.cv1 = Conv(c1, hidden)
        self.cv2 = Conv(c1, hidden)
        self.cv3 = Conv(2 * hidden, c2)
        self.m = nn.Sequential(*(Bottleneck(hidden, hidden, shortcut, (3, 3), e=1.0) for _ in range(n)))

    def forward(self, x: Tensor) -> Tensor:
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


class C3k2(nn.Module):
    """Faster CSP block: cv1 to 2c, split in halves, ``n`` blocks chained on the last piece, cv2 on all.

    c = int(c2·e). Blocks are C3k(c, c, n=2) when ``c3k`` else Bottleneck(c, c, e=0.5).
    Output (B, c2, H, W).
    """

    def __init__(
        self, c1: int, c2: int, n: int = 1, c3k: bool = False, e: float = 0.5, shortcut: bool = True
    ) -> None:
        super().__init__()
        self.c = int(c2 * e)
        self.cv1 = Conv(c1, 2 * self.c)
        self.cv2 = Conv((2 + n) * self.c, c2)
        self.m = nn.ModuleList(
            C3k(self.c, self.c, 2, shortcut) if c3k else Bottleneck(self.c, self.c, shortcut)
            for _ in range(n)
        )

    def forward(self, x: Tensor) -> Tensor:
        y = list(self.cv1(x).chunk(2, 1))
        for block in self.m:
            y.append(block(y[-1]))
        return self.cv2(torch.cat(y, 1))


class SPPF(nn.Module):
    """Spatial pyramid pooling (fast): cv1 to c1/2, three chained k×k max-pools, concat 4 -> cv2."""

    def __init__(self, c1: int, c2: int, k: int = 5) -> None:
        super().__init__()
        hidden = c1 // 2
        self.cv1 = Conv(c1, hidden)
        self.cv2 = Conv(hidden * 4, c2)
        self.m = nn.MaxPool2d(kernel_size=k, stride=1, padding=k // 2)

    def forward(self, x: Tensor) -> Tensor:
        y = [self.cv1(x)]
        for _ in range(3):
            y.append(self.m(y[-1]))
        return self.cv2(torch.cat(y, 1))


class Concat(nn.Module):
    """Concatenate a list of maps along channels (a module so layer indices match the reference)."""

    def __init__(self, dim: int = 1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, xs: list[Tensor]) -> Tensor:
        return torch.cat(xs, self.dim)
