"""Position-sensitive attention of YOLO11: Attention, PSABlock, C2PSA. Tensors are (B, C, H, W)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from yolo11_lightning.nn.blocks import Conv


class Attention(nn.Module):
    """Multi-head self-attention over the H·W positions of a map, plus a depth-wise positional term.

    heads = num_heads, head_dim = dim // heads, key_dim = head_dim · attn_ratio. One 1×1 conv makes
    q|k|v per head (key_dim | key_dim | head_dim channels); out = proj(attn(v) + pe(v)).
    """

    def __init__(self, dim: int, num_heads: int = 8, attn_ratio: float = 0.5) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.key_dim = int(self.head_dim * attn_ratio)
        self.scale = self.key_dim**-0.5
        self.qkv = Conv(dim, dim + 2 * self.key_dim * num_heads, 1, act=False)
        self.proj = Conv(dim, dim, 1, act=False)
        self.pe = Conv(dim, dim, 3, g=dim, act=False)

    def forward(self, x: Tensor) -> Tensor:
        b, c, h, w = x.shape
        qkv = self.qkv(x).view(b, self.num_heads, 2 * self.key_dim + self.head_dim, h * w)
        q, k, v = qkv.split((self.key_dim, self.key_dim, self.head_dim), dim=2)  # (B, heads, d, N)
        # softmax(qᵀk·scale) over keys, weighted sum of v: SDPA picks a fused kernel for it.
        out = F.scaled_dot_product_attention(
            q.transpose(-2, -1), k.transpose(-2, -1), v.transpose(-2, -1), scale=self.scale
        )  # (B, heads, N, head_dim)
        out = out.transpose(-2, -1).reshape(b, c, h, w)
        return self.proj(out + self.pe(v.reshape(b, c, h, w)))


class PSABlock(nn.Module):
    """x + Attention(x), then + FFN (1×1 conv c→2c with SiLU, 1×1 conv 2c→c without)."""

    def __init__(self, c: int, attn_ratio: float = 0.5, num_heads: int = 4, shortcut: bool = True) -> None:
        super().__init__()
        self.attn = Attention(c, num_heads=num_heads, attn_ratio=attn_ratio)
        self.ffn = nn.Sequential(Conv(c, 2 * c), Conv(2 * c, c, act=False))
        self.add = shortcut

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(x) if self.add else self.attn(x)
        return x + self.ffn(x) if self.add else self.ffn(x)


class C2PSA(nn.Module):
    """CSP wrapper around ``n`` PSABlocks: cv1 to 2·(c1·e), split a|b, b through the blocks, cv2(a‖b)."""

    def __init__(self, c1: int, c2: int, n: int = 1, e: float = 0.5) -> None:
        super().__init__()
        if c1 != c2:
            raise ValueError(f"C2PSA keeps its width: got c1={c1}, c2={c2}")
        self.c = int(c1 * e)
        self.cv1 = Conv(c1, 2 * self.c)
        self.cv2 = Conv(2 * self.c, c1)
        self.m = nn.Sequential(*(PSABlock(self.c, attn_ratio=0.5, num_heads=self.c // 64) for _ in range(n)))

    def forward(self, x: Tensor) -> Tensor:
        a, b = self.cv1(x).split((self.c, self.c), dim=1)
        return self.cv2(torch.cat((a, self.m(b)), 1))
