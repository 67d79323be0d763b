"""Configs shipped inside the package, found by name: ``--config quickstart``, ``--config model/yolo11s``.

The files are the repository's ``configs/`` folder (``yolo11_lightning/configs`` links to it and the wheel
build copies it in), read through ``importlib.resources``. A name is a path below that folder, with or without
``.yaml`` and with or without a leading ``configs/`` (so ``configs/quickstart.yaml`` works from any folder,
not only from a clone). A path that exists always wins over a name. Imports no Lightning.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

SUFFIXES = (".yaml", ".yml")
# Dataset yamls (``--data.dataset``), not ``--config`` files: packaged, but not listed as configs.
DATASETS = "datasets"
# What a file name or a config name looks like (as opposed to an inline YAML/JSON string).
_NAME_LIKE = re.compile(r"[\w.\-/\\]+")


def configs_root() -> Path:
    """The folder holding the packaged configs (``yolo11_lightning/configs``)."""
    return Path(str(resources.files("yolo11_lightning") / "configs"))


def config_names() -> list[str]:
    """Every packaged config name, e.g. ``["data/coco", ..., "quickstart", "trainer/cpu", ...]``."""
    root = configs_root()
    if not root.is_dir():
        return []
    files = (p for p in root.rglob("*") if p.suffix in SUFFIXES and p.is_file())
    names = (p.relative_to(root).with_suffix("").as_posix() for p in files)
    return sorted(n for n in names if not n.startswith(f"{DATASETS}/"))


def packaged_config(name: str) -> Path | None:
    """The packaged file of ``name`` (``quickstart``, ``model/yolo11s.yaml``, ``configs/trainer/cpu``), if any."""
    stem = name.replace("\\", "/").removeprefix("./").removeprefix("configs/")
    for suffix in SUFFIXES:
        stem = stem.removesuffix(suffix)
    if not stem or ".." in stem.split("/"):
        return None
    root = configs_root()
    for suffix in SUFFIXES:
        path = root / f"{stem}{suffix}"
        if path.is_file():
            return path
    return None


def first_comment(path: Path) -> str:
    """The first sentence of the comment that opens ``path``, without the ``#``s, on one line (it may run over
    several comment lines; an indented line, a command, ends it); empty when the file starts otherwise."""
    words: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.strip()
        if not text and not words:
            continue
        if not text.startswith("#") or text.startswith("#  ") or not text.strip("#").strip():
            break
        words += text.lstrip("#").split()
    sentence = " ".join(words)
    end = re.search(r"(?<!e\.g)(?<!i\.e)\.(\s|$)", sentence)
    sentence = sentence[: end.start() + 1] if end else sentence
    return sentence[:-1] + "." if sentence.endswith(":") else sentence  # the colon before a command


def resolve(value: Any, exists: Any = None) -> Any:
    """``value`` of a ``--config``: unchanged when it is a readable file (``exists(value)``, default: relative
    to the working folder) or not a string, else the packaged file of that name as a string.

    Raises ``TypeError`` naming the packaged configs when ``value`` looks like a file name but is neither a
    file nor a packaged name; an inline YAML/JSON string (``'{trainer: {...}}'``) is returned unchanged.
    """
    if not isinstance(value, str | Path):
        return value
    text = str(value)
    if (exists or _is_file)(text):
        return value
    packaged = packaged_config(text)
    if packaged is not None:
        return str(packaged)
    if _NAME_LIKE.fullmatch(text):
        names = ", ".join(config_names()) or "none (the package was installed without its configs)"
        raise TypeError(
            f"--config {text}: no such file, and no packaged config of that name. Packaged configs: {names} "
            "(`yolo11-lightning configs` lists them with their description)."
        )
    return value


def _is_file(text: str) -> bool:
    return Path(text).expanduser().is_file()


@contextlib.contextmanager
def packaged_config_names() -> Iterator[None]:
    """Within this context, every ``--config`` jsonargparse reads also takes a packaged config name.

    That covers the command line and config environment variables, which jsonargparse routes through
    ``ActionConfigFile.apply_config`` (this wraps it), and would cover ``config:`` keys inside config files
    (relative paths checked against the including file's folder), though LightningCLI 2.6 subcommands do not
    apply those at all (jsonargparse 4.53).
    """
    from jsonargparse import ActionConfigFile
    from jsonargparse import Path as ArgPath

    def readable(text: str) -> bool:
        try:  # relative to the folder jsonargparse is reading from (the including file's, when nested)
            ArgPath(text, mode="fr")
        except TypeError:
            return False
        return True

    original = ActionConfigFile.__dict__["apply_config"]

    def apply_config(parser: Any, cfg: Any, dest: str, value: Any) -> None:
        original.__func__(parser, cfg, dest, resolve(value, readable))

    ActionConfigFile.apply_config = staticmethod(apply_config)  # type: ignore[method-assign]
    try:
        yield
    finally:
        ActionConfigFile.apply_config = original  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    """``yolo11-lightning configs``: each packaged config name with its first comment line."""
    if argv and any(a in ("-h", "--help") for a in argv):
        print("usage: yolo11-lightning configs\nLists the packaged configs, usable as `--config NAME`.")
        return 0
    if argv:
        print(f"configs takes no arguments, got {' '.join(argv)}")
        return 2
    root = configs_root()
    names = config_names()
    if not names:
        print(f"no packaged configs under {root}")
        return 1
    width = max(map(len, names))
    print(f"Packaged configs ({root}); use as `--config NAME`, a path that exists wins over a name:")
    for name in names:
        path = packaged_config(name)
        assert path is not None
        print(f"  {name:<{width}}  {first_comment(path)}")
    return 0
