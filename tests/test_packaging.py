"""The package outside its clone: packaged configs by name, and the built wheel alone in a fresh venv."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

from yolo11_lightning.cli.main import main

REPO = Path(__file__).resolve().parents[1]
NAMES = ("quickstart", "model/yolo11s", "trainer/ddp_8gpu", "trainer/cpu", "data/coco", "logger/wandb")


def _main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``yolo11-lightning ARGS`` in this process: (exit code, stdout, stderr)."""
    try:
        code = main(args)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def _print_config(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code, out, err = _main(["fit", *args, "--print_config"], capsys)
    assert code == 0, err[-3000:]
    return out


def test_configs_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    code, out, _ = _main(["configs"], capsys)
    assert code == 0
    listed = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert set(NAMES) <= set(listed), out
    assert "datasets/coco" not in listed  # a dataset yaml, not a --config file
    assert "YOLO11-s" in listed["model/yolo11s"]  # the file's first comment sentence
    unfinished = [line for line in listed.values() if not line.endswith(".")]
    assert not unfinished, unfinished  # a sentence that runs over comment lines is listed whole
    assert listed["quickstart-seg"].endswith("small images, a few minutes on a laptop CPU.")

    monkeypatch.chdir(REPO)
    by_path = _print_config(
        ["--config", "configs/quickstart.yaml", "--config", "configs/trainer/cpu.yaml"], capsys
    )
    monkeypatch.chdir(tmp_path)  # an empty folder: no configs/ here
    assert _print_config(["--config", "quickstart", "--config=trainer/cpu"], capsys) == by_path
    # The README's spelling works from any folder too.
    assert _print_config(["--config", "configs/quickstart.yaml", "-c", "trainer/cpu.yaml"], capsys) == by_path
    assert "accelerator: cpu" in by_path and "image_size: 128" in by_path

    # A path that exists wins over the packaged config of the same name.
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "yolo11s.yaml").write_text("model:\n  scale: m\n")
    assert "  scale: s\n" in _print_config(
        ["--config", "quickstart", "--config", "configs/model/yolo11s"], capsys
    )
    assert "  scale: m\n" in _print_config(
        ["--config", "quickstart", "--config", "model/yolo11s.yaml"], capsys
    )

    code, _, err = _main(["fit", "--config", "quickstartt"], capsys)
    assert code != 0 and "no packaged config of that name" in err and "model/yolo11s" in err


def _copy_sources(dst: Path) -> Path:
    """What the wheel is built from (a copy: the build leaves build/ and *.egg-info beside the sources)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, dst / name)
    shutil.copytree(REPO / "configs", dst / "configs", ignore=ignore)
    shutil.copytree(REPO / "yolo11_lightning", dst / "yolo11_lightning", symlinks=True, ignore=ignore)
    assert (dst / "yolo11_lightning" / "configs").is_symlink()
    return dst


def _build_wheel(src: Path, out: Path) -> Path:
    """``pip wheel --no-deps``; without build isolation when this venv's setuptools can build wheels alone."""
    try:
        import setuptools

        isolated = tuple(map(int, setuptools.__version__.split(".")[:2])) < (70, 1)
    except ImportError:
        isolated = True
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)]
    proc = subprocess.run(
        command + ([] if isolated else ["--no-build-isolation"]), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = out.glob("yolo11_lightning-*.whl")
    return wheel


def _fresh_venv(root: Path, wheel: Path) -> Path:
    """A venv holding only the wheel, that reuses this venv's installed packages (torch, Lightning, ...) through
    a plain path in a ``.pth`` file. Plain paths do not run the ``.pth`` files found there, so this venv's
    editable install of the checkout (an import hook started by a ``.pth`` file) stays out."""
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    # This interpreter's package folders (its own, and any it reaches through .pth files), not the checkout.
    outer = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    outer |= {p for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()}
    Path(purelib, "outer_site_packages.pth").write_text("".join(f"{p}\n" for p in sorted(outer)))
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return venv


def test_wheel_stands_alone(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    wheel = _build_wheel(_copy_sources(tmp_path / "src"), tmp_path)
    venv = _fresh_venv(tmp_path, wheel)
    work = tmp_path / "work"  # an empty folder, far from the checkout
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(OMP_NUM_THREADS="1", WANDB_MODE="offline", PYTHONNOUSERSITE="1")

    def run(*args: str) -> str:
        proc = subprocess.run(list(args), cwd=work, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{args}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return proc.stdout

    python, cli = str(venv / "bin" / "python"), str(venv / "bin" / "yolo11-lightning")
    imported = run(
        python, "-c", "import yolo11_lightning as y, lightning; print(y.__file__); print(y.__version__)"
    )
    package_dir = Path(imported.splitlines()[0]).parent
    assert package_dir.is_relative_to(venv) and not package_dir.is_relative_to(REPO), imported
    assert (
        not (package_dir / "configs").is_symlink() and (package_dir / "configs" / "quickstart.yaml").is_file()
    )

    version = run(cli, "--version")
    assert version.startswith(f"yolo11-lightning {imported.splitlines()[1]} (git unknown) from {package_dir}")
    assert "2,624,080" in run(cli, "info", "--scales", "n")  # yolo11n's parameter count
    assert "quickstart" in run(cli, "configs")

    run(
        cli, "fit", "--config", "quickstart", "--data.synthetic_train", "8", "--data.synthetic_val", "4",
        "--data.image_size", "64", "--data.batch_size", "4", "--data.num_workers", "0",
        "--trainer.accelerator", "cpu", "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2",
        "--trainer.enable_progress_bar", "false", "--model.log_images", "0",
    )  # fmt: skip
    run_dir = work / "runs" / "quickstart" / "lightning_logs" / "version_0"
    assert (run_dir / "metrics.csv").is_file() and (work / "datasets" / "synthetic").is_dir()
    assert (run_dir / "config.yaml").read_text().startswith("# yolo11_lightning ")
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert checkpoint["yolo11_lightning"] == {"version": imported.splitlines()[1], "git_revision": "unknown"}


def test_utility_commands_start_without_lightning(tmp_path: Path) -> None:
    code = (
        "import sys\nfrom yolo11_lightning.cli.main import main\n"
        "assert main(['configs']) == 0 and main(['--version']) == 0 and main(['info', '--scales', 'n']) == 0\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'jsonargparse'))\n"
        "assert not heavy, heavy\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "quickstart" in proc.stdout and "yolo11-lightning " in proc.stdout
