"""Save a checkpoint with AtomicCheckpointIO, then overwrite it with a write that stalls half-way.

    python tests/helpers/scripts/killed_write.py CKPT_PATH MARKER_PATH

``torch.save`` is replaced by one that writes the first half of the serialised bytes to whatever it was
given (a path or an open file), flushes, creates MARKER_PATH and sleeps: the test SIGKILLs the process
then, as a job killed during a checkpoint write. Whatever the checkpoint IO does with its file, the
previous checkpoint must still load afterwards.
"""

from __future__ import annotations

import io
import os
import sys
import time
from pathlib import Path

import torch

from yolo11_lightning.training.checkpointing import AtomicCheckpointIO


def stalling_save(real_save, marker: Path):
    def save(obj, f, *args, **kwargs):
        buffer = io.BytesIO()
        real_save(obj, buffer, *args, **kwargs)
        data = buffer.getvalue()
        handle = open(f, "wb") if isinstance(f, (str, os.PathLike)) else f  # noqa: SIM115
        handle.write(data[: len(data) // 2])
        handle.flush()
        marker.touch()
        time.sleep(600)
        handle.write(data[len(data) // 2 :])

    return save


def main() -> None:
    path, marker = sys.argv[1], Path(sys.argv[2])
    checkpoint_io = AtomicCheckpointIO()
    checkpoint_io.save_checkpoint({"version": 1, "weights": torch.arange(200_000.0)}, path)
    torch.save = stalling_save(torch.save, marker)
    checkpoint_io.save_checkpoint({"version": 2, "weights": -torch.arange(200_000.0)}, path)


if __name__ == "__main__":
    main()
