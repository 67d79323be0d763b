"""Mistakes a user makes on the first day end in one line naming the culprit (``error: ...``, exit 2), not a
traceback; ``--traceback`` shows it. A fresh CPU start prints no warning the user cannot act on."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from cli_runs import SCRIPTS, run_cli, shell_here

from yolo11_lightning.cli.main import main
from yolo11_lightning.errors import TRACEBACK_ENV, UserInputError

TINY = ["--config", str(SCRIPTS / "tiny_fit.yaml"), "--trainer.max_steps", "1"]


@pytest.fixture(autouse=True)
def _test_callbacks_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(SCRIPTS))  # tiny_fit.yaml names fault_callbacks.FreezeBatchNorm


def no_names_dataset(tiny_dataset: Path, tmp_path: Path) -> str:
    config = yaml.safe_load(tiny_dataset.read_text())
    config.pop("names", None)
    config.pop("nc", None)
    config["path"] = str(tiny_dataset.parent)
    path = tmp_path / "no_names.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


# mistake -> (options after `fit`, words the one line must hold)
MISTAKES = {
    "missing dataset yaml": (["--data.dataset", "DIR/nonexist.yaml"], ["nonexist.yaml", "cannot read"]),
    "dataset without names": (["--data.dataset", "NO_NAMES"], ["no_names.yaml", "names"]),
    "unknown scale": (["--model.scale", "q"], ["model.scale='q'", "n, s, m, l, x"]),
    "image size not a multiple of 32": (["--data.image_size", "100"], ["data.image_size", "100"]),
    "batch that does not divide": (
        ["--trainer.devices", "3", "--data.batch_size", "4"],
        ["data.batch_size=4", "world size 3", "3 or 6"],
    ),
    "missing weights file": (["--model.weights", "DIR/nope.pt"], ["nope.pt", "not found"]),
    "negative pixel limit": (["--data.max_image_pixels", "-1"], ["max_image_pixels", "-1"]),
    "unknown option": (["--data.batchsize", "4"], ["--data.batchsize", "closest options: --data.batch_size"]),
    "unknown option, nothing close": (["--zzz", "4"], ["--zzz", "fit --help"]),
    "value of the wrong type": (["--data.batch_size", "four"], ["data.batch_size", "four"]),
    "config file not found": (["--config", "DIR/nope.yaml"], ["nope.yaml", "no such file"]),
    "a Trainer option Lightning refuses": (["--trainer.strategy", "dpp"], ["--trainer", "dpp"]),
    "bf16 weights": (
        ["--trainer.precision", "bf16-true"],
        ["trainer.precision=bf16-true", "EMA", "bf16-mixed"],
    ),
    "fp16 weights": (["--trainer.precision", "16-true"], ["trainer.precision=16-true", "EMA", "bf16-mixed"]),
}


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_a_mistake_is_one_line(
    mistake: str, tiny_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    options, words = MISTAKES[mistake]
    options = [
        no_names_dataset(tiny_dataset, tmp_path) if o == "NO_NAMES" else o.replace("DIR", str(tmp_path))
        for o in options
    ]
    dataset = [] if "--data.dataset" in options else ["--data.dataset", str(tiny_dataset)]
    code = main(["fit", *TINY, *dataset, "--trainer.default_root_dir", str(tmp_path), *options])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err, err
    assert err[-1].startswith("error: ") and all(word in err[-1] for word in words), err[-1]
    assert not any(line.startswith("usage:") for line in err), err  # no usage screen before it


def test_traceback_on_request_and_a_quiet_start(
    tiny_dataset: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """From the shell (``main`` reading ``sys.argv``, in this process): one line and exit 2, no traceback;
    ``--traceback`` lets the error out (the interpreter prints its traceback); a run that starts (a fresh process)
    prints no deprecation warning and no pin_memory warning on a CPU."""
    bad = ["fit", *TINY, "--data.dataset", str(tiny_dataset), "--model.scale", "q"]
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    assert shell_here(bad) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("error: model.scale='q'")
    with pytest.raises(UserInputError, match=r"model\.scale='q'"):
        shell_here([*bad, "--traceback"])
    assert TRACEBACK_ENV not in os.environ  # set for the ranks of that run only: later calls print one line
    assert shell_here(bad) == 2
    proc = run_cli(["fit", *TINY, "--data.dataset", str(tiny_dataset), "--trainer.default_root_dir", str(tmp_path),
                    "--data.pin_memory", "true"], cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    noise = [line for line in (proc.stdout + proc.stderr).splitlines()
             if "Deprecat" in line or "pin_memory" in line or "litlogger" in line]  # fmt: skip
    assert not noise, noise
