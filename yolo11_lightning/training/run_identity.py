"""What makes a checkpoint part of "this run", read before any process starts.

``--ckpt_path last`` must continue the same experiment, never another one that happened to write into the
same root, and a run that already finished must say so instead of silently training nothing. A
checkpoint's identity is its model and data hyper-parameters (every ``--model.*`` / ``--data.*`` init
argument, the global batch among them) and the global seed; keys that describe the machine rather than the
experiment may change (``RESUMABLE_KEYS``), and so may everything outside the model and data (devices,
nodes, ``max_epochs``, the logger, the checkpoint interval).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from yolo11_lightning.model_files import torch_file

# Model/data keys that may differ between a checkpoint and the run resuming it: loader settings, what to draw,
# where pretrained weights came from (a resume reads its weights from the checkpoint), and how validation
# batches and scores (training is the same either way).
RESUMABLE_KEYS = frozenset(
    {
        "data.num_workers", "data.pin_memory", "data.persistent_workers", "data.cache_images",
        "data.label_cache_dir", "data.prepare_data_per_node", "model.log_images", "model.weights", "model.weights_strict", "model.max_skipped_steps",
        "data.rect_val", "data.eval_box_gain", "model.reference_style_map",
    }
)  # fmt: skip


def identity(model_hparams: Mapping[str, Any], data_hparams: Mapping[str, Any], seed: Any) -> dict[str, Any]:
    """Flattens the run identity to {"model.x": v, "data.x": v, "seed_everything": s}, less resumable keys."""
    flat = {f"model.{k}": v for k, v in model_hparams.items()}
    flat.update({f"data.{k}": v for k, v in data_hparams.items()})
    flat["seed_everything"] = None if seed is None else int(seed)
    return {k: v for k, v in flat.items() if k not in RESUMABLE_KEYS}


def differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Lists "key: checkpoint value -> current value" for every key that differs; missing counts as None."""
    rows = []
    for key in sorted(set(saved) | set(current)):
        before, now = saved.get(key), current.get(key)
        if before != now:
            rows.append(f"{key}: {before!r} in the checkpoint, {now!r} now")
    return rows


@dataclass(frozen=True)
class CheckpointSummary:
    """What a resume decision needs from a checkpoint, read without loading its tensors."""

    path: str
    identity: dict[str, Any]
    epochs_completed: int
    global_step: int
    global_batch: int | None

    @classmethod
    def read(cls, path: str) -> CheckpointSummary:
        # A checkpoint is data, never code: the guarded reader's checks first, then mapped (tensors stay on disk).
        torch_file.check(path)
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        data = dict(checkpoint.get("datamodule_hyper_parameters") or {})
        fit_loop = checkpoint.get("loops", {}).get("fit_loop", {})
        # "processed": epochs whose training finished ("completed" lags by one at the epoch-end save).
        progress = fit_loop.get("epoch_progress", {}).get("current", {})
        completed = progress.get("processed", checkpoint.get("epoch", 0))
        return cls(
            path=str(path),
            identity=identity(
                checkpoint.get("hyper_parameters") or {}, data, checkpoint.get("seed_everything")
            ),
            epochs_completed=int(completed),
            global_step=int(checkpoint.get("global_step", 0)),
            global_batch=data.get("batch_size"),
        )

    def finished(self, max_epochs: int | None, max_steps: int) -> bool:
        """Tells whether a run with these limits would have nothing left to train from this checkpoint."""
        if max_steps is not None and max_steps > 0 and self.global_step >= max_steps:
            return True
        return max_epochs is not None and max_epochs >= 0 and self.epochs_completed >= max_epochs
