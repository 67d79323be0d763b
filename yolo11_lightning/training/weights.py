"""Start a model from pretrained weights: a reference ``.pt``, one of our checkpoints, or a weights file."""

from __future__ import annotations

import logging
from pathlib import Path

from yolo11_lightning.export import load_model
from yolo11_lightning.nn import YOLO11

log = logging.getLogger(__name__)


def load_pretrained(model: YOLO11, path: str | Path) -> tuple[int, list[str]]:
    """Copy every tensor whose name and shape match into ``model``; returns (loaded count, skipped names).

    ``path`` is anything ``export.load_model`` reads (nothing from the file is executed). When the class
    count differs, the class branch does not match and keeps its fresh (reference) initialisation.
    """
    source = load_model(path).state_dict()
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
