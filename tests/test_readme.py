"""Every command in README.md and in the documentation pages (docs/, in the site's reading order) runs: ```bash
blocks on this CPU machine (tiny overrides appended), ```python blocks as they are, and the cluster-only
``$ yolo11-lightning ...`` lines of ```console blocks are parsed with ``--print_config``. A command written
identically on several pages runs once, where it first appears. The commands that cannot run here are listed in
SKIPPED with the reason and where they are exercised instead. The sections between the multinode markers belong
to tests/test_multinode_docs.py."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from doc_pages import REPO, doc_pages, multinode_spans, page_name

README = REPO / "README.md"
CHECKPOINTS = Path("runs/quickstart/lightning_logs/version_0/checkpoints")

# Substring of a command -> why this test does not run it (and what does).
SKIPPED = {
    "pip install": "installs packages: .ci/run installs the project into a fresh virtual environment",
    "python -m pytest": "the test suite itself: .ci/run runs it",
    "python benchmarks/": "benchmarks take minutes and import the reference package; never part of the test run",
    "jupyter lab": "interactive; tests/e2e/test_notebook.py executes notebooks/quickstart.ipynb with tiny settings",
    "--trainer.strategy ddp": "two gloo processes: tests/e2e/test_cli.py::test_fit_two_ranks_ddp_rank_zero_writes_once "
    "runs this fit",
    "--out s3://": "needs an S3 store: tests/e2e/test_object_storage.py converts to one (a local S3 server) and trains "
    "from it",
    "yolo11n.pte": "needs the executorch extra (not in dev: about 330 MB): tests/unit/export/test_executorch.py exports a "
    ".pte, scores it against the checkpoint with --check-data's comparison and predicts with it where it is installed",
}
# Appended to each runnable command: tiny images, one short epoch, CPU, no worker processes.
TINY_ARGS = {
    "fit": [
        "--data.synthetic_train", "8", "--data.synthetic_val", "4", "--data.synthetic_image_size", "64",
        "--data.image_size", "64", "--data.batch_size", "4", "--data.num_workers", "0",
        "--trainer.accelerator", "cpu", "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2",
        "--trainer.limit_val_batches", "2", "--trainer.enable_progress_bar", "false",
    ],
    "predict": ["--device", "cpu", "--image-size", "64"],
    "export": ["--image-size", "64", "--batch-size", "4", "--num-workers", "0", "--accelerator", "cpu"],
    "validate": [
        "--data.synthetic_train", "8", "--data.synthetic_val", "4", "--data.synthetic_image_size", "64",
        "--data.image_size", "64", "--data.batch_size", "4", "--data.num_workers", "0",
        "--trainer.accelerator", "cpu", "--trainer.limit_val_batches", "2", "--trainer.enable_progress_bar", "false",
    ],
    "benchmark": ["--image-size", "64", "--runs", "2", "--formats", "onnx,torchscript", "--num-workers", "0"],
    "synthetic": ["--train", "8", "--val", "4", "--size", "64"],
    "check-data": ["--imgsz", "64", "--samples", "4"],
    "shard": [],
    "info": [],
}  # fmt: skip
LIGHTNING_CLI = ("fit", "validate", "test", "predict")


@dataclass
class Command:
    text: str  # as written (one logical line)
    lang: str  # bash | console | python
    line: int  # line of the block in its page
    page: str  # README.md or docs/<page>.md

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def page_blocks(text: str) -> list[tuple[str, str, int]]:
    """(language, body, first line) of every fenced block outside the multinode markers."""
    for start, end in multinode_spans(text):  # blank the owned sections but keep line numbers and offsets
        text = text[:start] + re.sub(r"[^\n]", " ", text[start:end]) + text[end:]
    blocks = []
    for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M):
        blocks.append((m.group(1), m.group(2), text.count("\n", 0, m.start()) + 2))
    return blocks


def page_commands(text: str, page: str) -> list[Command]:
    commands = []
    for lang, body, line in page_blocks(text):
        if lang == "python":
            commands.append(Command(body, lang, line, page))
        elif lang == "bash":
            for logical in body.replace("\\\n", " ").splitlines():
                if logical.strip() and not logical.strip().startswith("#"):
                    commands.extend(Command(part.strip(), lang, line, page) for part in logical.split("&&"))
        elif lang == "console":
            for logical in body.replace("\\\n", " ").splitlines():
                if logical.startswith("$ "):
                    commands.extend(
                        Command(part.strip(), lang, line, page) for part in logical[2:].split("&&")
                    )
    return commands


def doc_commands() -> list[Command]:
    """The commands of every page in reading order; one written identically on several pages only where it is
    first (the quickstart's commands of the README are the getting-started page's too)."""
    commands, seen = [], set()
    for page in doc_pages():
        for command in page_commands(page.read_text(), page_name(page)):
            if (command.lang, command.text) not in seen:
                seen.add((command.lang, command.text))
                commands.append(command)
    return commands


def plan(command: Command) -> tuple[str, object]:
    """("skip", reason) | ("python", code) | ("run", argv) | ("parse", argv) | ("unknown", why)."""
    for needle, reason in SKIPPED.items():
        if needle in command.text:
            return "skip", reason
    if command.lang == "python":
        return "python", command.text
    tokens = shlex.split(command.text, comments=True)
    while tokens and re.fullmatch(r"[A-Z_]+=\S*", tokens[0]):  # leading VAR=value assignments
        tokens.pop(0)
    if not tokens or tokens[0] != "yolo11-lightning" or len(tokens) < 2:
        return "unknown", "not a yolo11-lightning command"
    name, args = tokens[1], tokens[1:]
    if command.lang == "console":
        if name in LIGHTNING_CLI and "--source" not in args:
            return "parse", [*args, "--print_config"]
        return "unknown", "cluster-only command that is not a LightningCLI one"
    if "--print_config" in args:
        return "run", args
    if name not in TINY_ARGS:
        return "unknown", f"no tiny overrides for `{name}`"
    return "run", [*args, *TINY_ARGS[name]]


def test_setup_commands_keep_their_markers() -> None:
    """CI reads the command after each marker: both must be there, each the first line of a bash block."""
    text = README.read_text()
    for marker, expected in (("<!-- main-command -->", "yolo11-lightning fit --config configs/quickstart.yaml"),
                             ("<!-- test-command -->", "python -m pytest")):  # fmt: skip
        after = text.split(marker, 1)[1].lstrip("\n")
        assert after.startswith("```bash\n"), f"{marker} must be followed by a ```bash block"
        assert expected in after.split("\n")[1]


def test_every_command_is_run_or_skipped_with_a_reason() -> None:
    commands = doc_commands()
    assert {c.page for c in commands} > {"README.md"}, "the docs pages' commands were not found"
    plans = [(c, plan(c)) for c in commands]
    unknown = [f"{c.where}: {c.text!r} ({why})" for c, (kind, why) in plans if kind == "unknown"]
    assert not unknown, (
        "commands this test cannot run; make them cheap or add them to SKIPPED:\n" + "\n".join(unknown)
    )
    used = {needle for needle in SKIPPED for c in commands if needle in c.text}
    assert used == set(SKIPPED), f"stale SKIPPED entries: {set(SKIPPED) - used}"
    kinds = {kind for _, (kind, _) in plans}
    assert {"run", "parse", "python"} <= kinds


_RUNNER = r"""
import contextlib, io, json, sys, time, traceback
from yolo11_lightning.cli.main import main

jobs = json.load(open(sys.argv[1]))
results = []
for job in jobs:
    out = io.StringIO()
    code, error, start = 0, "", time.perf_counter()
    try:
        with contextlib.redirect_stdout(out):
            if job["kind"] == "python":
                exec(compile(job["code"], job["where"], "exec"), {"__name__": "__readme__"})
            else:
                try:
                    code = main(job["args"])
                except SystemExit as e:
                    code = e.code if isinstance(e.code, int) else int(e.code is not None)
    except Exception:
        code, error = 1, traceback.format_exc()
    results.append({"code": code, "error": error, "stdout": out.getvalue(), "seconds": time.perf_counter() - start})
    json.dump(results, open(sys.argv[2], "w"))
    if code != 0:
        break
"""


def test_readme_commands_run(tmp_path: Path) -> None:
    """The runnable commands, in reading order (README, then the site's pages: a page may use what an earlier one
    made), in one interpreter (one start-up), in a scratch folder."""
    commands = doc_commands()
    jobs, labels = [], []
    for command in commands:
        kind, payload = plan(command)
        if kind in ("run", "parse"):
            jobs.append({"kind": kind, "args": payload})
        elif kind == "python":
            jobs.append({"kind": "python", "code": payload, "where": command.where})
        else:
            continue
        labels.append(f"{command.where}: {command.text[:200]}")
    (tmp_path / "configs").symlink_to(REPO / "configs")  # commands name configs/... relative to the repo
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", _RUNNER, "jobs.json", "results.json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    results_file = tmp_path / "results.json"
    assert results_file.is_file(), proc.stderr[-5000:]
    results = json.loads(results_file.read_text())
    for label, job, result in zip(labels, jobs, results):
        detail = (result["error"] or result["stdout"][-2000:] or proc.stderr[-4000:]).strip()
        assert result["code"] == 0, f"{label}\nexit {result['code']}\n{detail}"
        if job["kind"] == "parse":  # a resolved config came out
            assert "trainer" in yaml.safe_load(result["stdout"]), label
    assert len(results) == len(jobs), proc.stderr[-5000:]

    for produced in (
        CHECKPOINTS / "best.ckpt", CHECKPOINTS / "best.onnx", CHECKPOINTS / "best.pth",
        Path("runs/predict/predictions.json"), Path("runs/export/yolo11n.onnx"), Path("runs/export/yolo11n.pth"),
        Path("datasets/shapes/data.yaml"), Path("runs/export/yolo11n_128.onnx"), Path("runs/export/yolo11n_dynamic.onnx"),
        Path("runs/shapes/lightning_logs/version_0/checkpoints/best.ckpt"),  # docs/datasets.md: its own folder
        Path("runs/shards/lightning_logs/version_0/checkpoints/best.ckpt"),  # docs/object-storage.md: from shards
    ):  # fmt: skip
        assert (tmp_path / produced).is_file(), f"{produced} was not written"
    predictions = json.loads((tmp_path / "runs/predict/predictions.json").read_text())
    assert isinstance(predictions, list)
    seg = Path("runs/quickstart-seg/lightning_logs/version_0/checkpoints")
    for produced in (seg / "best.ckpt", seg / "best.onnx", Path("runs/predict_seg/predictions.json")):
        assert (tmp_path / produced).is_file(), f"{produced} was not written"
    seg_predictions = json.loads((tmp_path / "runs/predict_seg/predictions.json").read_text())
    assert all("counts" in row["segmentation"] for row in seg_predictions)
    assert any(p.suffix == ".png" for p in (tmp_path / "runs/check").iterdir())


@pytest.mark.parametrize(
    ("text", "lang", "expected"),
    [
        ("pip install -e . ", "bash", "skip"),
        ("yolo11-lightning fit --config c.yaml", "console", "parse"),
        ("yolo11-lightning predict --source x --ckpt_path y", "console", "unknown"),
        ("yolo11-lightning export --ckpt_path y --format onnx", "bash", "run"),
        ("srun python train.py", "bash", "unknown"),
    ],
)
def test_plan_classifies_commands(text: str, lang: str, expected: str) -> None:
    assert plan(Command(text, lang, 1, "README.md"))[0] == expected


def test_commands_of_a_marked_section_and_repeats_are_left_out() -> None:
    """The multinode sections belong to their own test, and a command repeated on a later page runs once."""
    page = (
        "```bash\nyolo11-lightning info --scales n\n```\n<!-- multinode:start -->\n```console\n"
        "$ yolo11-lightning fit --config x.yaml\n```\n<!-- multinode:end -->\n```bash\nyolo11-lightning info\n```\n"
    )
    commands = page_commands(page, "docs/x.md")
    assert [(c.text, c.line) for c in commands] == [("yolo11-lightning info --scales n", 2),
                                                    ("yolo11-lightning info", 10)]  # fmt: skip
    main = "yolo11-lightning fit --config configs/quickstart.yaml"  # the README's, and getting-started's
    on = [
        page_name(p)
        for p in doc_pages()
        if any(c.text == main for c in page_commands(p.read_text(), page_name(p)))
    ]
    assert on[:2] == ["README.md", "docs/getting-started.md"], on
    assert [c.page for c in doc_commands() if c.text == main] == ["README.md"]
