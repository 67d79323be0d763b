"""Fine-tuning start: weights from another class count load everything but the class head."""

from __future__ import annotations

from pathlib import Path

import torch

from yolo11_lightning import YOLO11, YOLO11Module


def test_weights_from_80_classes_into_3(tmp_path: Path) -> None:
    torch.manual_seed(0)
    source = YOLO11("n", 80)
    with torch.no_grad():
        for p in source.parameters():
            p.add_(torch.randn_like(p) * 0.01)  # distinguishable from a fresh initialisation
    path = tmp_path / "coco80.pth"
    source.save_weights(path)

    module = YOLO11Module(scale="n", num_classes=3, class_names=["a", "b", "c"], weights=str(path))
    ours, theirs = module.model.state_dict(), source.state_dict()
    assert module.model.num_classes == 3
    for key, value in ours.items():
        if key.startswith("head.cv3"):  # class branch: its width follows the class count
            continue
        torch.testing.assert_close(value, theirs[key], msg=key)
    # The last class conv cannot be copied (80 -> 3 outputs): it keeps the reference bias init.
    final_bias = ours["head.cv3.0.2.bias"]
    assert final_bias.shape == (3,) and torch.allclose(final_bias, final_bias[0].expand(3))
