"""The ImageFolder layout of classification datasets: ``<split>/<class name>/<image>``, one class per image.

The reference's classification layout: a root folder with ``train/``, ``val/`` (or ``validation/``, ``valid/``)
and optionally ``test/``, each holding one folder per class. ``folder_config`` reads such a root as a dataset
config (what ``--data.dataset <root>`` and the reference's ``data=<root>`` take): the class names are the sorted
folder names of ``train/``, as the reference's. ``open_entry`` claims a split folder of class folders.

Each image becomes one ``ImageRecord`` with one label, its class, whose box is the whole image
(``[0.5, 0.5, 1, 1]``): the records, label cache, sampler, image cache and rank agreement are the other formats'.
Images are checked as YOLO images are (header, pixel limit, a reduced decode: ``images.io.probe_image``); an
unreadable or too-large image is skipped and named. A class folder of a split whose name is not a class of the
dataset (a class in ``val`` but not in ``train``) is an error naming the folder; an empty class folder is a warning
(its class stays, as in the reference, and has no image in that split).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from yolo11_lightning.data.images.io import ImageReadError, ImageTooLargeError, probe_image
from yolo11_lightning.data.sources.cache import hash_files
from yolo11_lightning.data.sources.checks import DataReport
from yolo11_lightning.data.sources.config import DatasetConfig, DatasetError
from yolo11_lightning.data.sources.packed_records import PackedRecords
from yolo11_lightning.data.sources.yolo import label_path_for, list_images

__all__ = ["FolderEntry", "class_folders", "folder_config", "open_entry"]

VAL_FOLDERS = ("val", "validation", "valid")  # the reference's names of the validation split, in its order
WHOLE_IMAGE = (0.5, 0.5, 1.0, 1.0)  # cx, cy, w, h of every record's one box


def _images_directly_in(folder: str) -> list[str]:
    return [p for p in list_images(folder) if os.path.dirname(p) == folder]


def class_folders(folder: str | os.PathLike) -> list[str] | None:
    """The class folder names (sorted) of a split folder, or None when it is not one: a folder without images
    directly inside whose subfolders (some possibly empty) hold images, none of them with a YOLO label file."""
    folder = os.fspath(folder)
    try:
        names = sorted(e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith("."))
    except OSError:
        return None
    if not names or _images_directly_in(folder):
        return None
    firsts = [next(iter(list_images(os.path.join(folder, n))), None) for n in names]
    found = [f for f in firsts if f is not None]
    if not found or any(os.path.isfile(label_path_for(f)) for f in found):
        return None
    return names


def folder_config(root: str | os.PathLike) -> DatasetConfig:
    """An ImageFolder root as a dataset config: splits ``train``, ``val`` (``val``, ``validation`` or ``valid``)
    and ``test`` where present; names: the class folders of ``train``. DatasetError naming the root otherwise."""
    path = Path(os.path.expanduser(os.fspath(root))).resolve()
    train = path / "train"
    names = class_folders(train) if train.is_dir() else None
    if not names:
        raise DatasetError(
            f"{path}: not a classification dataset folder: expected {path}/train/<class name>/<images> "
            "(and val/, optionally test/), or give a dataset yaml"
        )
    splits = {"train": [str(train)]}
    val = next((path / v for v in VAL_FOLDERS if (path / v).is_dir()), None)
    if val is not None:
        splits["val"] = [str(val)]
    if (path / "test").is_dir():
        splits["test"] = [str(path / "test")]
    return DatasetConfig(root=path, splits=splits, names=names)


@dataclass
class FolderEntry:
    """A split folder of class folders (``SplitEntry``): its images by class folder."""

    path: str
    classes: list[str]
    images: dict[str, list[str]] = field(default_factory=dict)  # class folder -> images (first listing only)

    def has_images(self) -> bool:
        return any(self.images.values())

    def fingerprint(self, h, image_dir: str) -> None:
        h.update(f"{self.path}\0folders\0{image_dir}\n".encode())
        for name in self.classes:
            h.update(f"{name}\0".encode())
            hash_files(self.images[name], h)

    def cache_path(self, split: str) -> Path:
        folder = Path(self.path)
        return folder.with_name(f"{folder.name}.{split}.cache.npz")

    def parse(
        self, config: DatasetConfig, split: str, report: DataReport, workers: int, max_pixels: int | None
    ) -> tuple[PackedRecords, list[str]]:
        index = {name: i for i, name in enumerate(config.names)}
        for name in self.classes:
            if name not in index:
                raise DatasetError(
                    f"{os.path.join(self.path, name)}: class folder `{name}` of split `{split}` is not a class of "
                    f"the dataset ({len(config.names)} classes from its train split: "
                    f"{', '.join(config.names[:5])}{', ...' if len(config.names) > 5 else ''})"
                )
            if not self.images[name]:
                report.note(
                    f"{os.path.join(self.path, name)}: class folder `{name}` has no images in `{split}`"
                )
        labelled = [(p, index[name]) for name in self.classes for p in self.images[name]]

        def probe(path: str) -> tuple[int, int] | ImageReadError:
            try:
                return probe_image(path, max_pixels)
            except ImageReadError as e:
                return e

        with ThreadPoolExecutor(max(1, workers)) as pool:  # decoding releases the GIL
            sizes = list(pool.map(probe, [p for p, _ in labelled]))
        kept, kept_sizes, classes = [], [], []
        for (path, cls), size in zip(labelled, sizes):
            if isinstance(size, ImageReadError):
                report.skip_image(path, size.reason, too_large=isinstance(size, ImageTooLargeError))
                continue
            kept.append(path)
            kept_sizes.append(size)
            classes.append(cls)
            report.add_image(1)
        encoded = [p.encode("utf-8") for p in kept]
        n = len(kept)
        packed = PackedRecords.from_arrays(
            {
                "paths": np.frombuffer(b"".join(encoded), np.uint8).copy(),
                "path_ends": np.cumsum([len(e) for e in encoded], dtype=np.int64),
                "sizes": np.array(kept_sizes, np.int64).reshape(-1, 2),
                "label_ends": np.arange(1, n + 1, dtype=np.int64),
                "classes": np.array(classes, np.int64),
                "boxes": np.tile(np.array(WHOLE_IMAGE, np.float32), (n, 1)),
                "segment_sizes": np.zeros(n, np.int64),
                "segments": np.zeros((0, 2), np.float32),
                "keypoints": np.zeros((n, 0, 3), np.float32),
            }
        )
        return packed, []


def open_entry(path: str, seen: set[str]) -> FolderEntry | None:
    """Claim a split folder of class folders (``class_folders``); an image already in ``seen`` is used once."""
    if not os.path.isdir(path):
        return None
    classes = class_folders(path)
    if classes is None:
        return None
    entry = FolderEntry(path, classes)
    for name in classes:
        images = [p for p in list_images(os.path.join(path, name)) if p not in seen]
        seen.update(images)
        entry.images[name] = images
    return entry
