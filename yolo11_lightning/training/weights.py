"""Start a model from pretrained weights: a reference ``.pt`` or one of our checkpoints / weight files."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from yolo11_lightning.nn import YOLO11

log = logging.getLogger(__name__)


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Detector state dict (our key names) from a reference ``.pt``, a Lightning ``.ckpt`` or a weights file.

    Lightning checkpoints and weight files are read with ``weights_only=True``; reference files go through
    ``YOLO11.from_ultralytics``'s restricted unpickler. Nothing from the file is executed.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weights file not found: {path}")
    if path.suffix == ".pt":
        return YOLO11.from_ultralytics(str(path)).state_dict()
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    state = checkpoint.get("state_dict", checkpoint) if isinstance(checkpoint, dict) else None
    if not isinstance(state, dict):
        raise ValueError(f"{path}: not a checkpoint or weights file (no state dict inside)")
    if any(k.startswith("model.") for k in state):  # LightningModule keys: strip our attribute prefix
        state = {k[len("model.") :]: v for k, v in state.items() if k.startswith("model.")}
    return state


def load_pretrained(model: YOLO11, path: str | Path) -> tuple[int, list[str]]:
    """Copy every tensor whose name and shape match into ``model``; returns (loaded count, skipped names).

    When the class count differs, the class branch does not match and keeps its fresh (reference) init.
    """
    source = read_state_dict(path)
    target = model.state_dict()
    matched = {k: v for k, v in source.items() if k in target and v.shape == target[k].shape}
    if not matched:
        raise ValueError(
            f"{path}: no tensor matches a YOLO11-{model.scale} model; wrong scale or not YOLO11?"
        )
    skipped = sorted(set(target) - set(matched))
    model.load_state_dict({**target, **{k: v.to(target[k].dtype) for k, v in matched.items()}})
    log.info("loaded %d/%d tensors from %s; re-initialised: %s", len(matched), len(target), path, skipped[:8])
    return len(matched), skipped
