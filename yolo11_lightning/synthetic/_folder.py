"""What the synthetic sets' folders share: their splits and the check that a folder is already written."""

from __future__ import annotations

import json
from pathlib import Path

SPLITS = ("train", "val")


def already_written(
    out: Path, marker: Path, yaml_path: Path, expected: dict, counts: tuple[int, int]
) -> bool:
    """Tells whether ``out`` holds a finished set of these parameters.

    It does when the marker, written last, equals ``expected``, the yaml exists and images/{train,val} hold
    ``counts`` PNGs.
    """
    try:
        same = json.loads(marker.read_text()) == expected and yaml_path.is_file()
    except (OSError, ValueError):
        return False
    found = tuple(len(list((out / "images" / s).glob(f"{s}_*.png"))) for s in SPLITS)
    return same and found == tuple(counts)
