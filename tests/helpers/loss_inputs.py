"""Random loss inputs shared by the loss parity tests: head maps and normalised box rows."""

from __future__ import annotations

import torch

STRIDES = (8, 16, 32)


def random_head_maps(
    g: torch.Generator, bs: int, height: int, width: int, nc: int, dtype=torch.float64
) -> list[torch.Tensor]:
    """Train-mode head output: (B, 64 + nc, H/s, W/s) per stride; class logits near the detector's prior."""
    feats = []
    for s in STRIDES:
        f = torch.randn(bs, 64 + nc, height // s, width // s, generator=g, dtype=torch.float64) * 2
        f[:, 64:] -= 4
        feats.append(f.to(dtype))
    return feats


def random_box_targets(
    g: torch.Generator, counts: list[int], height: int, width: int, nc: int
) -> torch.Tensor:
    """(N, 6) rows [image, class, cx, cy, w, h] normalised; images with 4+ boxes get a 2 px one and border-touching ones."""
    rows = []
    for image, n in enumerate(counts):
        wh = torch.rand(n, 2, generator=g, dtype=torch.float64) * 0.6 + 0.01
        cxcy = wh / 2 + torch.rand(n, 2, generator=g, dtype=torch.float64) * (1 - wh)
        specials = [
            [0.3, 0.4, 2 / width, 2 / height],  # 2 px
            [0.1, 0.5, 0.2, 0.3],  # touches the left border
            [0.8, 0.9, 0.4, 0.2],  # touches the right and bottom borders
        ]
        for i, box in enumerate(specials if n >= 4 else []):
            cxcy[i], wh[i] = torch.tensor(box[:2]), torch.tensor(box[2:])
        cls = torch.randint(0, nc, (n, 1), generator=g).double()
        rows.append(torch.cat((torch.full((n, 1), float(image), dtype=torch.float64), cls, cxcy, wh), 1))
    return torch.cat(rows) if rows else torch.zeros(0, 6, dtype=torch.float64)
