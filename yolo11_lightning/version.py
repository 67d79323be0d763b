"""Which code is running: the package version and, from a git clone, its revision. Imports no Lightning."""

from __future__ import annotations

import functools
import re
import subprocess
from importlib import metadata
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent
UNKNOWN = "unknown"


@functools.cache
def package_version() -> str:
    """The installed distribution's version; from an uninstalled checkout, ``pyproject.toml``'s."""
    pyproject = PACKAGE_ROOT.parent / "pyproject.toml"
    try:
        return metadata.version("yolo11_lightning")
    except metadata.PackageNotFoundError:
        if pyproject.is_file():
            found = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(encoding="utf-8"), re.M)
            if found:
                return found.group(1)
    return UNKNOWN


@functools.cache
def git_revision() -> str:
    """``git describe --always --dirty`` of the clone the package is imported from, else ``"unknown"``
    (an installed wheel, or no git)."""
    clone = PACKAGE_ROOT.parent
    if not (clone / ".git").exists():
        return UNKNOWN
    try:
        proc = subprocess.run(
            ["git", "-C", str(clone), "describe", "--always", "--dirty"],
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return UNKNOWN
    return proc.stdout.strip() if proc.returncode == 0 and proc.stdout.strip() else UNKNOWN


def code_version() -> dict[str, str]:
    """``{"version": "0.1.0", "git_revision": "eb31b73-dirty"}``: stored in checkpoints and logged hparams."""
    return {"version": package_version(), "git_revision": git_revision()}


def version_line() -> str:
    """What ``yolo11-lightning --version`` prints."""
    info = code_version()
    return f"yolo11-lightning {info['version']} (git {info['git_revision']}) from {PACKAGE_ROOT}"
