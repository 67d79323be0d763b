"""The YOLO11-seg head: ``Segment``, the detection head plus mask coefficients per anchor and ``Proto``'s
prototype masks per image."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from yolo11_lightning.nn.blocks import Conv
from yolo11_lightning.nn.head import Detect, output_branch


class Proto(nn.Module):
    """Mask prototypes of the segmentation head: (B, c1, H, W) -> (B, c2, 2H, 2W).

    cv1 Conv3×3 c1→c_, ``upsample`` ConvTranspose2d(c_, c_, 2, stride 2, with bias), cv2 Conv3×3 c_→c_,
    cv3 Conv1×1 c_→c2. On the P3/8 map this gives c2 prototypes at 1/4 of the input size.
    """

    def __init__(self, c1: int, c_: int = 256, c2: int = 32) -> None:
        super().__init__()
        self.cv1 = Conv(c1, c_, 3)
        self.upsample = nn.ConvTranspose2d(c_, c_, 2, 2, 0, bias=True)
        self.cv2 = Conv(c_, c_, 3)
        self.cv3 = Conv(c_, c2)

    def forward(self, x: Tensor) -> Tensor:
        return self.cv3(self.cv2(self.upsample(self.cv1(x))))


class SegmentOutput(NamedTuple):
    """Train-mode output of ``Segment`` (what ``SegmentationLoss`` takes).

    maps: the detection level maps (B, 4·reg_max + nc, H_i, W_i); coefficients: (B, nm, A) mask coefficients,
    anchors in the maps' order; protos: (B, nm, H/4, W/4) prototype masks (for a P3/8 input map).
    """

    maps: list[Tensor]
    coefficients: Tensor
    protos: Tensor


class Segment(Detect):
    """Detect plus instance masks: ``nm`` coefficients per anchor and ``nm`` prototypes from P3.

    Coefficient branch ``cv4[i]``: Conv3×3→c4, Conv3×3→c4, Conv2d 1×1→nm (bias), c4 = max(ch[0]//4, nm).
    ``proto``: ``Proto(ch[0], npr, nm)`` on the P3 map, so prototypes are at twice P3's resolution (1/4 input).
    An instance mask is sigmoid(coefficients · protos), cropped to its box.

    Train mode returns a ``SegmentOutput``; eval mode ``(predictions (B, 4 + nc + nm, A), protos (B, nm, H/4,
    W/4))``, predictions being ``Detect.decode`` then the raw coefficients.
    """

    def __init__(
        self,
        nc: int,
        ch: Sequence[int],
        strides: Sequence[int] = (8, 16, 32),
        reg_max: int = 16,
        nm: int = 32,
        npr: int = 256,
    ) -> None:
        super().__init__(nc, ch, strides, reg_max)
        self.nm, self.npr = nm, npr
        self.proto = Proto(self.ch[0], npr, nm)  # registered before cv4: the reference's state-dict order
        c4 = max(self.ch[0] // 4, nm)
        self.cv4 = nn.ModuleList(
            nn.Sequential(Conv(c, c4, 3), Conv(c4, c4, 3), nn.Conv2d(c4, nm, 1)) for c in ch
        )

    def outputs(self, xs: Sequence[Tensor]) -> SegmentOutput:
        """Returns the raw train-mode outputs, whatever the mode."""
        bs = xs[0].shape[0]
        coefficients = torch.cat(
            [output_branch(self.cv4[i], x).view(bs, self.nm, -1) for i, x in enumerate(xs)], 2
        )
        return SegmentOutput(self.level_maps(xs), coefficients, self.proto(xs[0]))

    def forward(self, xs: list[Tensor]) -> SegmentOutput | tuple[Tensor, Tensor]:  # type: ignore[override]
        out = self.outputs(xs)
        return out if self.training else self.decode_outputs(out)

    def decode_outputs(self, out: SegmentOutput) -> tuple[Tensor, Tensor]:
        """Decodes a SegmentOutput to float32 predictions (B, 4 + nc + nm, A) and protos (B, nm, H/4, W/4).

        Float32 as ``decode``: the masks assembled from them (coefficients · protos) keep their precision too.
        """
        return torch.cat((self.decode(out.maps), out.coefficients.float()), 1), out.protos.float()
