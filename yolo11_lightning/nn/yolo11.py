"""YOLO11 at scales n/s/m/l/x: backbone and neck (or the backbone alone, for classification), the head a
``HeadSpec`` builds (detection's by default; a task hands its own: ``tasks.create_model``), and BN fusion.

Model files (weights-only files, reference ``.pt``, checkpoints) are read and written by ``model_files.weights``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from yolo11_lightning.nn.attention import C2PSA
from yolo11_lightning.nn.blocks import BN_EPS, BN_MOMENTUM, SPPF, C3k2, Concat, Conv
from yolo11_lightning.nn.head import Detect
from yolo11_lightning.nn.scales import SCALES, scaled_channels

__all__ = ["YOLO11", "HeadBuilder", "HeadSpec"]

# (num_classes, in channels per level, strides, reg_max, scale) -> the head module
HeadBuilder = Callable[[int, Sequence[int], Sequence[int], int, str], nn.Module]


def detect_head(
    num_classes: int, channels: Sequence[int], strides: Sequence[int], reg_max: int, scale: str
) -> nn.Module:
    """Builds detection's head on the P3/P4/P5 maps of ``channels``."""
    return Detect(num_classes, channels, strides, reg_max)


@dataclass(frozen=True)
class HeadSpec:
    """What a task decides of the network: its name, which layers feed the head, the head, BatchNorm settings.

    ``has_neck``: backbone and neck, the head after layers 16/19/22 (P3/P4/P5); False: the backbone alone, the head
    after layer 9 (P5). ``batch_norm``: (eps, momentum) of every BatchNorm.
    """

    task: str = "detect"
    has_neck: bool = True
    build_head: HeadBuilder = detect_head
    batch_norm: tuple[float, float] = (BN_EPS, BN_MOMENTUM)


DETECTION = HeadSpec()

# Layer index -> index of the earlier layer concatenated with the previous output (layer i-1).
_CONCAT_FROM = {12: 6, 15: 4, 18: 13, 21: 10}
# Layers feeding the head: P3/8, P4/16, P5/32 with the neck; the last layer (P5/32) without it.
_HEAD_FROM = (16, 19, 22)
_STRIDES = (8, 16, 32)


def _build_layers(scale: str, neck: bool = True) -> tuple[nn.ModuleList, list[int]]:
    """Builds the layers before the head, index i == reference ``model.i``; returns them and their out channels.

    With the neck: 23 layers (backbone, SPPF, C2PSA, neck), the detection tasks'. Without: the 10 of
    classification, backbone layers 0-8 then C2PSA at 9 (no SPPF, no neck).
    """
    depth = SCALES[scale][0]

    def ch(c: int) -> int:
        return scaled_channels(scale, c)

    def rep(n: int) -> int:
        return max(round(n * depth), 1)

    c3k_all = scale in "mlx"  # m/l/x use C3k blocks in every C3k2
    layers: list[nn.Module] = []
    out: list[int] = []

    def add(module: nn.Module, c_out: int) -> None:
        layers.append(module)
        out.append(c_out)

    def conv(c: int) -> None:  # 3×3 stride-2 downsampling conv
        add(Conv(out[-1] if out else 3, ch(c), 3, 2), ch(c))

    def c3k2(c: int, c3k: bool, e: float = 0.5) -> None:
        add(C3k2(out[-1], ch(c), rep(2), c3k or c3k_all, e), ch(c))

    def up_cat(src: int) -> None:  # nearest x2 upsample, then concat with layer `src`
        add(nn.Upsample(scale_factor=2.0, mode="nearest"), out[-1])
        add(Concat(1), out[-1] + out[src])

    def down_cat(c: int, src: int) -> None:  # stride-2 conv, then concat with layer `src`
        conv(c)
        add(Concat(1), out[-1] + out[src])

    # Backbone.
    conv(64)  # 0  P1/2
    conv(128)  # 1  P2/4
    c3k2(256, False, 0.25)  # 2
    conv(256)  # 3  P3/8
    c3k2(512, False, 0.25)  # 4
    conv(512)  # 5  P4/16
    c3k2(512, True)  # 6
    conv(1024)  # 7  P5/32
    c3k2(1024, True)  # 8
    if not neck:
        add(C2PSA(out[-1], ch(1024), rep(2)), ch(1024))  # 9
        return nn.ModuleList(layers), out
    add(SPPF(out[-1], ch(1024), 5), ch(1024))  # 9
    add(C2PSA(out[-1], ch(1024), rep(2)), ch(1024))  # 10
    # Neck: top-down then bottom-up.
    up_cat(6)  # 11, 12
    c3k2(512, False)  # 13
    up_cat(4)  # 14, 15
    c3k2(256, False)  # 16  -> P3
    down_cat(256, 13)  # 17, 18
    c3k2(512, False)  # 19  -> P4
    down_cat(512, 10)  # 20, 21
    c3k2(1024, True)  # 22  -> P5
    return nn.ModuleList(layers), out


class YOLO11(nn.Module):
    """YOLO11 with the head of ``head`` (a ``HeadSpec``): detection by default; a task's model comes from
    ``tasks.create_model(scale, num_classes, task=...)`` (segment, pose with ``kpt_shape`` (K, D), obb, classify).

    Input: float (B, 3, H, W) RGB in [0, 1], H and W multiples of 32. The spec says which layers the network has
    (``has_neck``: backbone and neck, the head at layer 23 on P3/P4/P5; or the backbone alone, the head at layer 10
    on P5) and builds the head, which decides the outputs. Detection. Train mode:
    list of three maps (B, 4·reg_max + nc, H/s, W/s) for s = 8, 16, 32, box-distribution channels first, then
    class logits. Eval mode: (B, 4 + nc, A), xywh boxes in input pixels then sigmoid class scores, A = sum over
    levels of (H/s)·(W/s). The other tasks: their heads (``tasks/<task>/head.py``).
    """

    reg_max: int = 16

    def __init__(
        self,
        scale: str = "n",
        num_classes: int = 80,
        names: list[str] | None = None,
        head: HeadSpec = DETECTION,
    ) -> None:
        super().__init__()
        if scale not in SCALES:
            raise ValueError(f"unknown YOLO11 scale {scale!r}; choose one of {', '.join(SCALES)}")
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
        self.scale = scale
        self.task = head.task
        self.layers, out = _build_layers(scale, head.has_neck)
        self._head_from = _HEAD_FROM if head.has_neck else (len(self.layers) - 1,)
        self.strides: tuple[int, ...] = _STRIDES if head.has_neck else _STRIDES[-1:]
        ch = [out[i] for i in self._head_from]
        self.head: Detect = head.build_head(  # type: ignore[assignment]
            num_classes, ch, self.strides, self.reg_max, scale
        )
        # (K, D) of a keypoint head, else None
        self.kpt_shape: tuple[int, int] | None = getattr(self.head, "kpt_shape", None)
        self.names = self._check_names(names, num_classes)
        eps, momentum = head.batch_norm
        for m in self.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.eps, m.momentum = eps, momentum

    @property
    def num_classes(self) -> int:
        return self.head.nc

    @staticmethod
    def _check_names(names: list[str] | None, nc: int) -> list[str] | None:
        if names is None:
            return None
        names = [str(n) for n in names]
        if len(names) != nc:
            raise ValueError(f"got {len(names)} class names for {nc} classes")
        return names

    def check_input(self, x: Tensor) -> None:
        """Raises a ValueError naming the problem unless x is (B, 3, H, W) with H, W multiples of 32."""
        if x.ndim != 4 or x.shape[1] != 3:
            raise ValueError(f"YOLO11 expects images shaped (B, 3, H, W), got {tuple(x.shape)}")
        h, w = x.shape[-2:]
        if h % 32 or w % 32 or h == 0 or w == 0:
            raise ValueError(
                f"YOLO11 needs input height and width that are multiples of 32 (the largest stride), "
                f"got {h}x{w}; letterbox or pad to e.g. {max(32, math.ceil(h / 32) * 32)}x"
                f"{max(32, math.ceil(w / 32) * 32)}"
            )

    def features(self, x: Tensor) -> list[Tensor]:
        """Returns the maps the head reads after checking the input.

        P3/8, P4/16, P5/32, or P5/32 alone without the neck.
        """
        self.check_input(x)
        outs: list[Tensor] = []
        for i, layer in enumerate(self.layers):
            x = layer([x, outs[_CONCAT_FROM[i]]]) if i in _CONCAT_FROM else layer(x)
            outs.append(x)
        return [outs[i] for i in self._head_from]

    def level_maps(self, x: Tensor) -> list[Tensor]:
        """Returns the three raw detection maps (B, 4·reg_max + nc, H/s, W/s) whatever the mode, for val losses."""
        return self.head.level_maps(self.features(x))

    def train_outputs(self, x: Tensor) -> Any:
        """Returns what train mode returns whatever the mode: the loss input, for val losses."""
        return self.head.outputs(self.features(x))

    def forward(self, x: Tensor) -> Any:
        out = self.train_outputs(x)
        return out if self.training else self.head.decode_outputs(out)

    def reset_head(self, num_classes: int, names: list[str] | None = None) -> YOLO11:
        """Re-creates the class outputs for ``num_classes`` with the reference bias init, for fine-tuning."""
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
        self.head.reset_classes(num_classes)
        self.names = self._check_names(names, num_classes)
        return self

    @torch.no_grad()
    def fuse(self) -> YOLO11:
        """Folds every BatchNorm into its conv in place for inference; outputs are unchanged."""
        for m in [m for m in self.modules() if isinstance(m, Conv)]:  # listed first: fuse_bn swaps children
            m.fuse_bn()
        return self
