"""The image size a model was trained at, as its file records it, and the size predict and export use.

Where each file keeps it: a Lightning checkpoint in ``datamodule_hyper_parameters["image_size"]``
(``YOLODataModule`` saves its arguments), our weights file in ``image_size`` (``export --format weights``
copies it from the checkpoint), a reference ``.pt`` in ``train_args["imgsz"]``; an exported ONNX file in its
metadata (``model_files.onnx_metadata``: the size it was exported at, the only one a fixed-shape file takes). Read from
the pickle only (``torch_file.peek``): no tensor is loaded.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from yolo11_lightning.model_files import torch_file
from yolo11_lightning.model_files.torch_file import CheckpointError
from yolo11_lightning.model_files.weights import WEIGHTS_FORMAT

__all__ = ["DEFAULT_IMAGE_SIZE", "choose_image_size", "file_image_size"]

DEFAULT_IMAGE_SIZE = 640  # when neither the user nor the file says: the reference's default


def file_image_size(path: str | os.PathLike) -> int | None:
    """The image side a model file's model was trained at, or None when the file does not say.

    None too for a value that is not a positive multiple of 32 and for a file that cannot be read (the loader
    that reads it next reports why). A reference ``[h, w]`` gives the larger side (a square input covers it).
    """
    try:
        obj = torch_file.peek(path)
    except (OSError, CheckpointError):
        return None
    if not isinstance(obj, Mapping):
        return None
    if obj.get("format") == WEIGHTS_FORMAT:
        size = obj.get("image_size")
    elif "state_dict" in obj:
        size = (obj.get("datamodule_hyper_parameters") or {}).get("image_size")
    else:
        args = obj.get("train_args")
        size = args.get("imgsz") if isinstance(args, Mapping) else None
    if isinstance(size, list | tuple) and size and all(isinstance(s, int) for s in size):
        size = max(size)
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0 or size % 32:
        return None
    return size


def choose_image_size(given: int | None, recorded: int | None) -> tuple[int, str]:
    """(size, the line that says why): ``given`` (``--image-size``) wins, then the ``recorded`` trained size,
    then ``DEFAULT_IMAGE_SIZE``."""
    if given is not None:
        return given, f"image size {given} (--image-size)"
    if recorded is not None:
        return recorded, f"image size {recorded}: the size the model was trained at (--image-size to change)"
    return DEFAULT_IMAGE_SIZE, (
        f"image size {DEFAULT_IMAGE_SIZE}: the model file does not record its training size "
        "(--image-size to change)"
    )
