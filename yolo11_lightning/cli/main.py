"""Command-line front door: ``yolo11-lightning <command> ...``.

``fit``, ``validate``, ``test`` and ``predict`` go to LightningCLI. The small utility commands
(``info``, ``synthetic``, ``check-data``, ``shard``, ``export``, ``benchmark``) are plain argparse programs
living next to the code they drive; they are imported only when asked for, so ``info`` starts without Lightning. ``configs`` lists
the configs shipped in the package (``--config NAME``); ``--version`` prints the version and git revision.

``predict`` has two forms: with ``--source`` (files, folders, videos) it is the utility in
``yolo11_lightning.predict.command``; without it, LightningCLI's predict over the dataset's test/val split.
``predict --help`` alone shows the utility's help, which names the other form.

An error in what the user asked for (``errors.UserInputError``: a task the model and the data disagree on, a
split the dataset lacks, ...; or an option LightningCLI's parser refuses: unknown, or a value of the wrong
type) is printed as one line, ``error: <message>``, with exit code 2 and no traceback or usage screen; under
DDP every rank raises it alike, before any collective.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence

from yolo11_lightning.errors import TRACEBACK_ENV, UserInputError, one_line, wants_traceback
from yolo11_lightning.training.cpu_threads import spin_briefly

# command -> "module:function"; each function takes argv (without the command) and returns an exit code.
UTILITY_COMMANDS = {
    "info": "yolo11_lightning.cli.info:main",
    "synthetic": "yolo11_lightning.synthetic.command:main",
    "check-data": "yolo11_lightning.cli.check_data:main",
    "shard": "yolo11_lightning.cli.shard:main",
    "export": "yolo11_lightning.export.command:main",
    "benchmark": "yolo11_lightning.cli.benchmark:main",
    "configs": "yolo11_lightning.cli.packaged_configs:main",
}
# `predict --source ...` (or `predict --help` alone) runs this instead of LightningCLI's predict.
PREDICT_SOURCE_COMMAND = "yolo11_lightning.predict.command:main"
LIGHTNING_COMMANDS = ("fit", "validate", "test", "predict")


def _usage() -> str:
    names = ", ".join([*LIGHTNING_COMMANDS, *UTILITY_COMMANDS])
    return (
        f"usage: yolo11-lightning <command> [options]\ncommands: {names}\n"
        "  predict --source PATH --ckpt_path CKPT: images, folders or videos -> annotated copies + COCO json\n"
        "  predict --config ... (no --source): LightningCLI predict over the dataset's test/val split\n"
        "  configs: the packaged configs, usable by name: fit --config quickstart\n"
        "  <command> --help: the options of one command; --version: package version and git revision\n"
    )


def _wants_predict_utility(rest: Sequence[str]) -> bool:
    """``predict`` with ``--source`` (any spelling), or only asking for help."""
    if any(a == "--source" or a.startswith("--source=") for a in rest):
        return True
    return bool(rest) and all(a in ("-h", "--help") for a in rest)


def _run_utility(target: str, rest: Sequence[str]) -> int:
    module_name, func_name = target.split(":")
    return int(getattr(importlib.import_module(module_name), func_name)(list(rest)) or 0)


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch to a utility command or to LightningCLI; returns the process exit code.

    An error in what the user asked for (``errors.UserInputError``: a bad option value, dataset or model file,
    a missing file) is printed as ``error: <message>`` with exit code 2; ``--traceback`` anywhere on the command
    line (or ``YOLO11_TRACEBACK=1``) shows its traceback instead. Other errors keep their traceback.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if "--traceback" not in args:
        return _dispatch(args, from_shell=argv is None)
    args.remove("--traceback")
    if argv is None:  # LightningCLI reads sys.argv itself
        sys.argv = [sys.argv[0], *args]
    before = os.environ.get(TRACEBACK_ENV)
    os.environ[TRACEBACK_ENV] = "1"  # DDP ranks started from this process inherit it
    try:
        return _dispatch(args, from_shell=argv is None)
    finally:  # a call from Python leaves its caller's environment as it found it
        if before is None:
            os.environ.pop(TRACEBACK_ENV, None)
        else:
            os.environ[TRACEBACK_ENV] = before


def _dispatch(args: list[str], from_shell: bool) -> int:
    """Runs the command ``args`` names; a user error becomes one ``error:`` line and exit code 2."""
    if not args or args[0] in ("-h", "--help"):
        sys.stdout.write(_usage())
        return 0 if args else 2
    if args[0] == "--version":
        from yolo11_lightning.version import version_line

        print(version_line())
        return 0
    command, rest = args[0], args[1:]
    spin_briefly()  # before torch is imported: OpenMP reads its wait policy once (training.cpu_threads)
    try:
        return _run_command(command, rest, from_shell=from_shell)
    except (UserInputError, FileNotFoundError) as e:
        if wants_traceback():
            raise
        sys.stderr.write(f"error: {one_line(str(e))}\n")
        return 2


def _run_command(command: str, rest: list[str], from_shell: bool) -> int:
    if command in UTILITY_COMMANDS:
        return _run_utility(UTILITY_COMMANDS[command], rest)
    if command == "predict" and _wants_predict_utility(rest):
        return _run_utility(PREDICT_SOURCE_COMMAND, rest)
    if command in LIGHTNING_COMMANDS:
        from yolo11_lightning.cli.lightning_cli import run_lightning_cli

        # From the shell, LightningCLI reads sys.argv itself (passing it again makes it warn); from Python,
        # the given argv is the command line.
        run_lightning_cli(None if from_shell else [command, *rest])
        return 0
    sys.stderr.write(f"unknown command {command!r}\n" + _usage())
    return 2
