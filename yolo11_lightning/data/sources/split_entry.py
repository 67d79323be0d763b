"""The interface every dataset format implements for one entry of a split.

An ``open_entry(path, seen)`` function of the format claims a split entry of the dataset yaml (or returns None) and
lists its files; the ``SplitEntry`` it returns fingerprints those files for the label cache, says where its cache
goes and parses them into records.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from yolo11_lightning.structures.records import ImageRecord

if TYPE_CHECKING:
    from yolo11_lightning.data.sources.checks import DataReport
    from yolo11_lightning.data.sources.config import DatasetConfig

__all__ = ["SplitEntry"]


class SplitEntry(Protocol):
    """One entry of a split (a folder, an image list, a json file) as its format reads it."""

    path: str

    def has_images(self) -> bool:
        """Whether the entry may yield images (False: an empty folder or list)."""
        ...

    def fingerprint(self, h: Any, image_dir: str) -> None:
        """Feed what the entry's records depend on (file names, sizes, times) to the hash ``h``."""
        ...

    def cache_path(self, split: str) -> Path:
        """Where the label cache of a split starting with this entry goes (beside its labels)."""
        ...

    def parse(
        self, config: DatasetConfig, split: str, report: DataReport, workers: int, max_pixels: int | None
    ) -> tuple[Sequence[ImageRecord], list[str]]:
        """Checked records (a ``PackedRecords``; problems go to ``report``) and extra files whose changes
        invalidate the cache, using up to ``workers`` threads or processes.

        An image above ``max_pixels`` (None or 0: no limit) is skipped, read no further than its header.
        """
        ...
