"""The image files of a split entry, each listed once: symbolic links followed, their loops and repeats named.

A folder is walked in sorted order, hidden files and folders skipped, the tree of real subfolders first; a symbolic
link to a folder is followed after that tree (so a file reached both directly and through a link keeps its direct
path, which its label path follows). Every real folder is walked once (by ``(st_dev, st_ino)``): a link to the
folder it sits in or to one above it (a loop: ``cycle -> ..``) is not followed, nor is a link to a folder already
walked; each such link is one line of ``ImageListing.problems``. A file reached twice (a link to a file already
listed) is listed once, under its direct path when it has one, and named. Files that are not images are counted
(``other_files``, the first one kept for messages): an ImageFolder names them.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass, field

from yolo11_lightning.data.images.io import IMAGE_EXTENSIONS
from yolo11_lightning.data.sources.config import DatasetError

__all__ = ["ImageListing", "is_image_name", "list_images", "loops_back"]


def is_image_name(name: str) -> bool:
    """Whether a file name is an image's: not hidden, an image extension (``images.io.IMAGE_EXTENSIONS``)."""
    return not name.startswith(".") and name.rpartition(".")[2].lower() in IMAGE_EXTENSIONS


def loops_back(link: str) -> bool:
    """Whether the folder link ``link`` points at the folder holding it or at one above it (a loop)."""
    target = os.path.realpath(link)
    holder = os.path.realpath(os.path.dirname(link))
    return os.path.commonpath([target, holder]) == target


@dataclass
class ImageListing:
    """The walks of one split entry, sharing what they walked (module docstring).

    ``problems``: one line per link not followed and per file listed once though reached twice; ``other_files``:
    files that are not images, ``first_other_file`` the first of them.
    """

    problems: list[str] = field(default_factory=list)
    other_files: int = 0
    first_other_file: str | None = None
    _folders: dict[tuple[int, int], str] = field(default_factory=dict)  # real folder -> path walked under
    _linked: dict[tuple[int, int], str] = field(default_factory=dict)  # file reached through a link -> path

    def walk(self, top: str) -> list[str]:
        """The images under folder ``top``, in a stable order (module docstring)."""
        found: list[str] = []
        via_link: list[bool] = []
        links: deque[str] = deque()
        self._tree(top, False, found, via_link, links)
        while links:
            link = links.popleft()
            if loops_back(link):
                self.problems.append(
                    f"{link}: a symbolic link to {os.path.realpath(link)}, a folder that holds it (a loop): "
                    "not followed"
                )
                continue
            self._tree(link, True, found, via_link, links)
        return self._once(found, via_link) if any(via_link) else found

    def _tree(
        self, top: str, linked: bool, found: list[str], via_link: list[bool], links: deque[str]
    ) -> None:
        """Walk ``top`` and its real subfolders depth first (as ``os.walk``), queueing its folder links."""
        stack = [top]
        while stack:
            folder = stack.pop()
            try:
                st = os.stat(folder)
                entries = sorted(os.scandir(folder), key=lambda e: e.name)
            except OSError:
                continue
            key = (st.st_dev, st.st_ino)
            if key in self._folders:
                self.problems.append(
                    f"{folder}: the same folder as {self._folders[key]}, listed already: not followed again"
                )
                continue
            self._folders[key] = folder
            subfolders = []
            for entry in entries:
                if entry.name.startswith("."):
                    continue
                try:
                    is_link, is_dir = entry.is_symlink(), entry.is_dir()
                except OSError:
                    is_link, is_dir = True, False
                if is_dir:
                    (links.append if is_link else subfolders.append)(entry.path)
                elif is_image_name(entry.name):
                    found.append(entry.path)
                    via_link.append(linked or is_link)
                else:
                    self.other_files += 1
                    self.first_other_file = self.first_other_file or entry.path
            stack += reversed(subfolders)

    def _once(self, found: list[str], via_link: list[bool]) -> list[str]:
        """``found`` with each file once: a file reached through a link and also directly (or through an earlier
        link) is dropped and named."""
        direct: dict[tuple[int, int], str] = {}
        for path, linked in zip(found, via_link):
            if not linked and (key := _identity(path)) is not None:
                direct.setdefault(key, path)
        kept = []
        for path, linked in zip(found, via_link):
            key = _identity(path) if linked else None
            if key is None:
                kept.append(path)
                continue
            first = direct.get(key) or self._linked.get(key)
            if first is not None:
                self.problems.append(f"{path}: the same file as {first}: listed once")
                continue
            self._linked[key] = path
            kept.append(path)
        return kept


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:  # a broken link: listed, and refused with its reason when the image is read
        return None
    return st.st_dev, st.st_ino


def list_images(entry: str, listing: ImageListing | None = None) -> list[str]:
    """Absolute image paths of a split entry, in a stable order.

    A folder is walked (``ImageListing.walk``; ``listing`` collects what its links did, pass one to report it);
    a .txt file lists one image per line, relative lines resolved against the list's own folder (blank lines and
    ``#`` comments skipped, order kept); any other file is a single image.
    """
    if os.path.isdir(entry):
        return (listing or ImageListing()).walk(entry)
    if entry.lower().endswith(".txt"):
        base = os.path.dirname(entry)
        try:
            with open(entry, encoding="utf-8-sig") as f:
                lines = [s.strip() for s in f.read().splitlines()]
        except (OSError, UnicodeDecodeError) as e:
            raise DatasetError(f"{entry}: cannot read image list ({e})") from e
        out = []
        for line in lines:
            if line and not line.startswith("#"):
                p = os.path.expanduser(line)
                out.append(os.path.normpath(p if os.path.isabs(p) else os.path.join(base, p)))
        return out
    return [entry]
