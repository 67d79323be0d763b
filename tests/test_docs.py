"""The documentation site builds with ``mkdocs build --strict``: a link to a missing page or anchor, an absolute
link, or a page left out of the nav fails it (mkdocs.yml, ``validation``). And the README's own links (the README
is not a page of the site) point at files that exist."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from doc_pages import REPO


def _site_sources(dst: Path) -> Path:
    """What the build reads: mkdocs.yml, docs/, ARCHITECTURE.md (included), the package (API pages)."""
    shutil.copy2(REPO / "mkdocs.yml", dst / "mkdocs.yml")
    shutil.copy2(REPO / "ARCHITECTURE.md", dst / "ARCHITECTURE.md")
    shutil.copytree(REPO / "docs", dst / "docs")
    (dst / "yolo11_lightning").symlink_to(REPO / "yolo11_lightning")
    return dst


def _build(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(root / "site")],
        cwd=root, capture_output=True, text=True, timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip


def test_site_builds_strict_and_a_broken_link_fails_it(tmp_path: Path) -> None:
    root = _site_sources(tmp_path)
    built = _build(root)
    assert built.returncode == 0, built.stderr[-5000:]
    assert (root / "site" / "api" / "module" / "index.html").is_file()
    api = (root / "site" / "api" / "module" / "index.html").read_text()
    assert "weights_strict" in api, "the API page holds no docstring"
    architecture = (root / "site" / "architecture" / "index.html").read_text()
    assert 'href="../reference/"' in architecture, "ARCHITECTURE.md's links were not rewritten for the site"

    page = root / "docs" / "predict.md"
    page.write_text(page.read_text() + "\nSee [the options](export.md#no-such-section).\n")
    broken = _build(root)
    assert broken.returncode != 0
    assert "export.md#no-such-section" in broken.stderr, broken.stderr[-3000:]


def test_readme_links_point_at_files_that_exist() -> None:
    text = (REPO / "README.md").read_text()
    targets = [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in t]
    assert "docs/getting-started.md" in targets and "docs/assets/results.png" in targets
    missing = [t for t in targets if not (REPO / t.split("#")[0]).exists()]
    assert not missing, f"README.md links to missing files: {missing}"
