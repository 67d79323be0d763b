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
(its class stays, as in the reference, and has no image in that split). A split folder is walked once
(``listing.ImageListing``): a link that loops back is named and not followed, each image is listed once, and files
that are not images (a caption ``circle00.txt`` beside ``circle00.jpg``) are ignored, their count in one warning.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from yolo11_lightning.data.images.io import probe_image
from yolo11_lightning.data.images.limits import ImageReadError, ImageTooLargeError
from yolo11_lightning.data.sources.cache import hash_files
from yolo11_lightning.data.sources.checks import DataReport
from yolo11_lightning.data.sources.config import DatasetConfig, DatasetError
from yolo11_lightning.data.sources.listing import ImageListing, is_image_name, loops_back
from yolo11_lightning.data.sources.packed_records import PackedRecords
from yolo11_lightning.data.sources.yolo import has_label_rows

__all__ = ["FolderEntry", "class_folders", "folder_config", "open_entry"]

VAL_FOLDERS = ("val", "validation", "valid")  # the reference's names of the validation split, in its order
WHOLE_IMAGE = (0.5, 0.5, 1.0, 1.0)  # cx, cy, w, h of every record's one box


def _class_names(folder: str) -> list[str]:
    """The subfolders of a split folder (sorted, not hidden), without links that loop back to it."""
    names = []
    with os.scandir(folder) as it:
        for e in it:
            if not e.name.startswith(".") and e.is_dir() and not (e.is_symlink() and loops_back(e.path)):
                names.append(e.name)
    return sorted(names)


def _by_class(folder: str, names: list[str], images: list[str]) -> dict[str, list[str]]:
    """``images`` (from a walk of ``folder``) grouped by the class folder they lie under, in order."""
    groups: dict[str, list[str]] = {name: [] for name in names}
    for path in images:
        name = os.path.relpath(path, folder).split(os.sep)[0]
        if name in groups:
            groups[name].append(path)
    return groups


def _first_image(folder: str) -> str | None:
    """The first image a walk of ``folder`` lists (``listing.ImageListing``: sorted, files before subfolders,
    depth first), found without walking the rest; None when there is none before a folder link (a link is walked
    after the whole tree, so the walk decides) or a folder cannot be read."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
        subfolders = []
        for entry in entries:
            if entry.name.startswith("."):
                continue
            if entry.is_dir():
                if entry.is_symlink():
                    return None
                subfolders.append(entry.path)
            elif is_image_name(entry.name):
                return entry.path
    except OSError:
        return None
    for sub in subfolders:
        if (first := _first_image(sub)) is not None:
            return first
    return None


def _labelled_yolo_split(folder: str, names: list[str]) -> bool:
    """Whether ``folder`` is no ImageFolder split by ``_read_split``'s rule, known from its first image with
    files: one directly in it, or the first image of the first class folder holding one beside a YOLO label file
    of rows. A YOLO split of subfolders (``images/train/000/...``) is told apart without walking all its images."""
    with os.scandir(folder) as it:
        if any(not e.is_dir() and is_image_name(e.name) for e in it):
            return True
    for name in names:
        path = os.path.join(folder, name)
        if os.path.islink(path):
            return False  # a class folder that is a link is walked after the tree: the walk decides
        first = _first_image(path)
        if first is not None:
            return has_label_rows(first)
    return False


def _read_split(folder: str) -> tuple[list[str], dict[str, list[str]], ImageListing] | None:
    """(class names, their images, the walk) of a split folder of class folders, or None (``class_folders``)."""
    try:
        names = _class_names(folder)
        if not names or _labelled_yolo_split(folder, names):
            return None
    except OSError:
        return None
    listing = ImageListing()
    images = listing.walk(folder)
    if any(os.path.dirname(p) == folder for p in images):
        return None
    groups = _by_class(folder, names, images)
    firsts = [group[0] for group in groups.values() if group]
    if not firsts or any(has_label_rows(f) for f in firsts):
        return None
    return names, groups, listing


def class_folders(folder: str | os.PathLike) -> list[str] | None:
    """The class folder names (sorted) of a split folder, or None when it is not one: a folder without images
    directly inside whose subfolders (some possibly empty) hold images, none of them beside a YOLO label file of
    rows (a caption or other text file beside an image is not one; ``yolo.has_label_rows``). A link that loops
    back to the split folder is no class folder."""
    found = _read_split(os.fspath(folder))
    return None if found is None else found[0]


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
    problems: list[str] = field(default_factory=list)  # links not followed, files reached twice, other files

    def has_images(self) -> bool:
        return any(self.images.values())

    def fingerprint(self, h, image_dir: str) -> None:
        h.update(f"{self.path}\0folders\0{image_dir}\n".encode())
        for name in self.classes:
            h.update(f"{name}\0".encode())
            hash_files(self.images[name], h)
        h.update("\0".join(self.problems).encode())

    def cache_path(self, split: str) -> Path:
        folder = Path(self.path)
        return folder.with_name(f"{folder.name}.{split}.cache.npz")

    def parse(
        self, config: DatasetConfig, split: str, report: DataReport, workers: int, max_pixels: int | None
    ) -> tuple[PackedRecords, list[str]]:
        index = {name: i for i, name in enumerate(config.names)}
        for line in self.problems:
            report.note(line)
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
    found = _read_split(path)
    if found is None:
        return None
    classes, groups, listing = found
    entry = FolderEntry(path, classes, problems=listing.problems)
    for name in classes:
        images = [p for p in groups[name] if p not in seen]
        seen.update(images)
        entry.images[name] = images
    if listing.other_files:
        n = listing.other_files
        what = "1 file that is not an image" if n == 1 else f"{n} files that are not images"
        entry.problems.append(
            f"{path}: ignored {what} in its class folders (e.g. {listing.first_other_file})"
        )
    return entry
