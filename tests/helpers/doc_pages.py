"""The pages whose commands the tests run: README.md, then every page of the documentation site in its reading
order (the ``nav`` of mkdocs.yml), and the sections of them that tests/test_multinode_docs.py owns."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
MULTINODE_START, MULTINODE_END = "<!-- multinode:start -->", "<!-- multinode:end -->"


def _nav_files(entries: list) -> list[str]:
    files = []
    for entry in entries:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        files.extend(_nav_files(value) if isinstance(value, list) else [value])
    return files


def doc_pages() -> list[Path]:
    """README.md, then the site's pages in nav order (mkdocs' strict build refuses a page left out of nav)."""
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    return [REPO / "README.md", *(REPO / config["docs_dir"] / name for name in _nav_files(config["nav"]))]


def page_name(page: Path) -> str:
    return page.relative_to(REPO).as_posix()


def multinode_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) character offsets of each marked multinode section of a page; the markers must pair up."""
    starts = [m.start() for m in re.finditer(re.escape(MULTINODE_START), text)]
    ends = [m.start() for m in re.finditer(re.escape(MULTINODE_END), text)]
    assert len(starts) == len(ends) and all(
        s < e and (i + 1 == len(starts) or e < starts[i + 1]) for i, (s, e) in enumerate(zip(starts, ends))
    ), f"unpaired {MULTINODE_START} / {MULTINODE_END} markers"
    return list(zip(starts, ends))
