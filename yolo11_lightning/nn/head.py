"""The YOLO11 detection head (DFL, Detect), which every task's head builds on (``tasks/<task>/head.py``).

Per level the detection head predicts 4·reg_max box-distribution logits (the distance from the anchor centre
to each box side, as a distribution over reg_max bins in stride units) followed by ``nc`` class logits. The
segmentation head adds ``nm`` mask coefficients per anchor and ``nm`` prototype masks per image.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from yolo11_lightning.nn.blocks import Conv, DWConv
from yolo11_lightning.ops.anchors import dist_to_box, make_anchors


def output_branch(branch: nn.Sequential, x: Tensor) -> Tensor:
    """Runs a head branch, its last layer outside autocast in the weights' own precision.

    The last layer is the 1×1 convolution that makes the outputs.

    Under bf16 autocast the outputs would otherwise be rounded to 8 significant bits: scores quantised into
    ties and box logits off by ~0.03, a quarter pixel at stride 8, which costs mAP50-95 at its high IoU
    thresholds. The layer is a few thousandths of the network's work. In float32 nothing changes.
    """
    *hidden, out = branch
    for layer in hidden:
        x = layer(x)
    with autocast_off(x.device.type):
        return out(x.to(out.weight.dtype))


def autocast_off(device_type: str) -> contextlib.AbstractContextManager:
    """Disables autocast on a device type; one without autocast, such as meta, has nothing to disable."""
    available = getattr(torch.amp, "is_autocast_available", lambda device: device in ("cpu", "cuda"))
    return torch.autocast(device_type, enabled=False) if available(device_type) else contextlib.nullcontext()


class DFL(nn.Module):
    """Distribution focal loss integral: softmax over ``c1`` bins, then the expected bin index.

    The expectation weights 0..c1-1 sit in a frozen 1×1 conv (``conv.weight``), as in the reference,
    so checkpoints carry them and parameter counts match. (B, 4·c1, A) -> (B, 4, A).
    """

    def __init__(self, c1: int = 16) -> None:
        super().__init__()
        self.c1 = c1
        self.conv = nn.Conv2d(c1, 1, 1, bias=False).requires_grad_(False)
        with torch.no_grad():
            self.conv.weight.copy_(torch.arange(c1, dtype=torch.float32).view(1, c1, 1, 1))

    def forward(self, x: Tensor) -> Tensor:
        b, _, a = x.shape
        prob = x.view(b, 4, self.c1, a).softmax(2)
        return torch.einsum("bsna,n->bsa", prob, self.conv.weight.view(self.c1).to(prob.dtype))


class Detect(nn.Module):
    """Decoupled anchor-free head over the P3/P4/P5 maps.

    Box branch ``cv2[i]``: Conv3×3→c2, Conv3×3→c2, Conv2d 1×1→4·reg_max (bias).
    Class branch ``cv3[i]``: [DWConv3×3, Conv1×1→c3], [DWConv3×3, Conv1×1], Conv2d 1×1→nc (bias).
    c2 = max(16, ch[0]//4, 4·reg_max), c3 = max(ch[0], min(nc, 100)).

    Train mode returns the level maps (B, 4·reg_max + nc, H_i, W_i); eval mode returns ``decode`` of them.
    """

    def __init__(self, nc: int, ch: Sequence[int], strides: Sequence[int] = (8, 16, 32), reg_max: int = 16):
        super().__init__()
        if len(ch) != len(strides):
            raise ValueError(f"Detect needs one stride per input level, got ch={ch}, strides={strides}")
        self.nc = nc
        self.nl = len(ch)
        self.reg_max = reg_max
        self.no = nc + 4 * reg_max
        self.ch = tuple(ch)
        self.strides = tuple(int(s) for s in strides)
        c2 = max(16, ch[0] // 4, 4 * reg_max)
        self.cv2 = nn.ModuleList(
            nn.Sequential(Conv(c, c2, 3), Conv(c2, c2, 3), nn.Conv2d(c2, 4 * reg_max, 1)) for c in ch
        )
        self.cv3 = self.class_branch(nc)
        self.dfl = DFL(reg_max)
        self._anchor_cache: tuple[tuple, Tensor, Tensor] | None = None
        self.bias_init()

    def class_branch(self, nc: int) -> nn.ModuleList:
        """Builds a fresh class branch for ``nc`` classes; its hidden width c3 depends on nc."""
        c3 = max(self.ch[0], min(nc, 100))
        return nn.ModuleList(
            nn.Sequential(
                nn.Sequential(DWConv(c, c, 3), Conv(c, c3, 1)),
                nn.Sequential(DWConv(c3, c3, 3), Conv(c3, c3, 1)),
                nn.Conv2d(c3, nc, 1),
            )
            for c in self.ch
        )

    @torch.no_grad()
    def bias_init(self) -> None:
        """Sets the reference prior: box logit bias 1.0, class bias log(5 / nc / (640 / s)²).

        That is about 5 objects per 640² image spread over the classes, so early training is not swamped by
        negatives.
        """
        for box, cls, s in zip(self.cv2, self.cv3, self.strides):
            box[-1].bias.fill_(1.0)
            cls[-1].bias.fill_(math.log(5 / self.nc / (640 / s) ** 2))

    def reset_classes(self, nc: int) -> None:
        """Re-creates the class branch for ``nc`` classes.

        Hidden layers whose shape is unchanged keep their weights (what loading a pretrained model
        into a new class count does); the final 1×1 convs are new, with the reference bias init.
        """
        old = self.cv3
        new = self.class_branch(nc)
        ref = next(old.parameters())
        new.to(device=ref.device, dtype=ref.dtype)
        old_state = old.state_dict()
        keep = {
            k: v
            for k, v in old_state.items()
            if k.split(".")[1] != "2" and k in new.state_dict() and new.state_dict()[k].shape == v.shape
        }
        new.load_state_dict(keep, strict=False)
        self.cv3 = new
        self.nc = nc
        self.no = nc + 4 * self.reg_max
        self.bias_init()

    def level_maps(self, xs: Sequence[Tensor]) -> list[Tensor]:
        """Returns the raw per-level maps (B, 4·reg_max + nc, H_i, W_i): box logits, then class logits."""
        return [
            torch.cat((output_branch(self.cv2[i], x), output_branch(self.cv3[i], x)), 1)
            for i, x in enumerate(xs)
        ]

    def forward(self, xs: list[Tensor]) -> list[Tensor] | Tensor:
        maps = self.outputs(xs)
        return maps if self.training else self.decode_outputs(maps)

    def outputs(self, xs: Sequence[Tensor]) -> list[Tensor]:
        """Returns the train-mode outputs, the level maps the loss takes, whatever the mode."""
        return self.level_maps(xs)

    def decode_outputs(self, maps: Sequence[Tensor]) -> Tensor:
        """Returns the eval-mode output from the train-mode outputs, by decode."""
        return self.decode(maps)

    def anchors(self, maps: Sequence[Tensor], dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
        """Returns anchor centres (2, A) in grid units and strides (1, A), cached by shapes, device and dtype.

        ``dtype`` defaults to the maps'.

        Not cached while tracing (ONNX export) or compiling (``torch.compile``): the grid is built in the
        graph from the input's shapes, so that an export with free height and width computes it for each
        input size, and a compiled model's guards do not hold the cache key (each rect validation shape would
        recompile until dynamo's ``recompile_limit``, then run eagerly; in the graph, shapes go dynamic).
        Anchors made under ``torch.inference_mode`` (validation, prediction) are inference tensors, which
        autograd refuses: outside inference mode they are remade.
        """
        ref = maps[0]
        dtype = dtype or ref.dtype
        key = (tuple(tuple(m.shape[-2:]) for m in maps), ref.device, dtype)
        if torch.jit.is_tracing() or torch.compiler.is_compiling():
            points, strides = make_anchors(key[0], self.strides, 0.5, dtype=dtype, device=ref.device)
            return points.T.contiguous(), strides.T.contiguous()
        cache = self._anchor_cache
        stale = cache is None or cache[0] != key
        if not stale and cache[1].is_inference() and not torch.is_inference_mode_enabled():
            stale = True
        if stale:
            points, strides = make_anchors(key[0], self.strides, 0.5, dtype=dtype, device=ref.device)
            self._anchor_cache = (key, points.T.contiguous(), strides.T.contiguous())
        return self._anchor_cache[1], self._anchor_cache[2]

    def decode(self, maps: Sequence[Tensor]) -> Tensor:
        """Decodes level maps into (B, 4 + nc, A) float32: xywh boxes in input pixels, then class sigmoids.

        Anchors run level by level (P3, P4, P5), row-major within a level. Always computed in float32, also
        under autocast or for a half-precision model: in bfloat16 (8 significant bits) a box corner at 640 px
        is off by 0.7 px on average and up to 6 px, which fails the 0.9-0.95 IoU thresholds of mAP50-95.
        """
        with autocast_off(maps[0].device.type):
            flat = torch.cat([m.flatten(2) for m in maps], 2).float()  # (B, no, A); also for B = 0
            box, cls = flat.split((4 * self.reg_max, self.nc), 1)
            points, strides = self.anchors(maps, torch.float32)
            boxes = dist_to_box(self.dfl(box), points.unsqueeze(0), xywh=True, dim=1) * strides
            return torch.cat((boxes, cls.sigmoid()), 1)
