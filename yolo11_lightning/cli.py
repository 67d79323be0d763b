"""Command-line front door: ``yolo11-lightning <command> ...``.

``fit``, ``validate``, ``test`` and ``predict`` go to LightningCLI. The small utility commands
(``info``, ``synthetic``, ``check-data``) are plain argparse programs living next to the code they
drive; they are imported only when asked for, so ``info`` starts without Lightning.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

# command -> "module:function"; each function takes argv (without the command) and returns an exit code.
UTILITY_COMMANDS = {
    "info": "yolo11_lightning.nn.summary:main",
    "synthetic": "yolo11_lightning.data.synthetic:main",
    "check-data": "yolo11_lightning.data.check_data:main",
}
LIGHTNING_COMMANDS = ("fit", "validate", "test", "predict")


def _usage() -> str:
    names = ", ".join([*LIGHTNING_COMMANDS, *UTILITY_COMMANDS])
    return f"usage: yolo11-lightning <command> [options]\ncommands: {names}\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch to a utility command or to LightningCLI; returns the process exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        sys.stdout.write(_usage())
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command in UTILITY_COMMANDS:
        module_name, func_name = UTILITY_COMMANDS[command].split(":")
        return int(getattr(importlib.import_module(module_name), func_name)(rest) or 0)
    if command in LIGHTNING_COMMANDS:
        from yolo11_lightning.training.cli import run_lightning_cli

        run_lightning_cli([command, *rest])
        return 0
    sys.stderr.write(f"unknown command {command!r}\n" + _usage())
    return 2
