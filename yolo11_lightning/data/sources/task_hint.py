"""What task a dataset's files say they are labelled for, read without loading its labels.

Only what the files state for certain counts: a shard folder whose index records what its source's files said
(``data.shards``), a dataset yaml that declares keypoints
(``label_options.LabelOptions.declared_by``) is a keypoint (pose) dataset,
and an ImageFolder root (class folders of images without YOLO label files, the reference's classification
layout: the folder itself, its ``train`` folder, or a yaml whose ``train`` is such a folder) is a classification
one. Anything else says nothing: box rows, polygon rows (detection trains on them too, taking boxes from the
polygons) and COCO json fit detection and segmentation alike. The task names are plain strings here
(``tasks.resolution`` decides what they mean); this module imports no task code.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from yolo11_lightning.data.images.io import IMAGE_EXTENSIONS
from yolo11_lightning.data.shards.reader import is_shard_location, open_index
from yolo11_lightning.data.sources.config import DatasetError
from yolo11_lightning.data.sources.label_options import LabelOptions
from yolo11_lightning.data.sources.yolo import has_label_rows

__all__ = ["DatasetTask", "dataset_task"]


@dataclass(frozen=True)
class DatasetTask:
    """The task a dataset is labelled for (``pose``, ``classify``) and the evidence, for messages."""

    task: str
    evidence: str


def dataset_task(dataset: str | os.PathLike) -> DatasetTask | None:
    """The task ``dataset`` (a yaml file or a folder) says it is for, or None when its files do not say.

    An unreadable yaml says nothing here: ``config.load_dataset_config`` reports it with its own message.
    """
    if is_shard_location(os.fspath(dataset)):
        try:
            claim = open_index(os.fspath(dataset)).claim
        except DatasetError:
            return None  # the dataset's loading reports it
        return None if claim is None else DatasetTask(claim[0], f"its shard index: {claim[1]}")
    path = Path(os.path.expanduser(os.fspath(dataset)))
    if path.is_dir():
        for folder in (path / "train", path):
            classes = _class_folders(folder)
            if classes:
                return DatasetTask("classify", _folders_evidence(folder, classes))
        return None
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(raw, dict):
        return None
    keypoints = LabelOptions.declared_by(raw)
    if keypoints is not None:
        return DatasetTask("pose", keypoints)
    train = raw.get("train")
    if isinstance(train, str | os.PathLike):
        root = Path(os.path.expanduser(str(raw.get("path") or ".")))
        root = root if root.is_absolute() else path.resolve().parent / root
        folder = Path(os.path.expanduser(os.fspath(train)))
        folder = folder if folder.is_absolute() else root / folder
        classes = _class_folders(folder)
        if classes:
            return DatasetTask("classify", "its train split is " + _folders_evidence(folder, classes))
    return None


def _folders_evidence(folder: Path, classes: list[str]) -> str:
    shown = ", ".join(classes[:3]) + (", ..." if len(classes) > 3 else "")
    return f"{folder}: {len(classes)} class folders of images ({shown}) without label files"


def _is_image(entry: os.DirEntry) -> bool:
    return (
        not entry.name.startswith(".")
        and entry.name.rpartition(".")[2].lower() in IMAGE_EXTENSIONS
        and entry.is_file()
    )


def _class_folders(folder: Path) -> list[str]:
    """The class folders of an ImageFolder root, else []: no image directly inside, subfolders holding images
    directly, and none of those images with a YOLO label file of rows (detection images kept in subfolders; a
    caption beside an image is no label file: ``yolo.has_label_rows``). Stops at
    the first image directly inside (a detection split of a million images costs one entry, not a listing) and
    reads each subfolder only up to its first image."""
    subfolders = []
    try:
        with os.scandir(folder) as it:
            for entry in it:
                if _is_image(entry):
                    return []
                if not entry.name.startswith(".") and entry.is_dir():
                    subfolders.append(entry)
    except OSError:
        return []
    classes, labelled = [], False
    for entry in sorted(subfolders, key=lambda e: e.name):
        try:
            with os.scandir(entry.path) as it:
                first = next((e.path for e in it if _is_image(e)), None)
        except OSError:
            continue
        if first is not None:
            classes.append(entry.name)
            labelled = labelled or has_label_rows(first)
    return [] if labelled else classes
