"""Errors in what the user asked for, which the command line reports as one line.

``UserInputError`` is the base of every error whose message alone tells the user what to change (an option,
a config key, a dataset file): ``yolo11-lightning`` prints it as ``error: <message>`` on stderr and exits
with 2, without a traceback (``cli.main``). Python callers get the exception as usual. An error of a bug or
of the machine (a crash, a hung rank) stays a traceback.

An error class joins by inheriting ``UserInputError`` (beside its own base, e.g. ``ValueError``); its
message must be one line and name the option or file to change. Raise it where every rank decides alike
(from the config or the files, before any collective), so under DDP each process prints the same line.

``--traceback`` on the command line (or ``YOLO11_TRACEBACK=1`` in the environment, which DDP ranks inherit)
shows the traceback instead.

Imports nothing: every layer may raise one.
"""

from __future__ import annotations

import os

__all__ = ["TRACEBACK_ENV", "UserInputError", "one_line", "wants_traceback"]

TRACEBACK_ENV = "YOLO11_TRACEBACK"  # set (to anything but "" or "0"): user errors keep their traceback


class UserInputError(ValueError):
    """An option, config or input file that cannot work as given; the message says what to change."""


def wants_traceback() -> bool:
    """Whether user errors should show their traceback (``--traceback`` / ``YOLO11_TRACEBACK``)."""
    return os.environ.get(TRACEBACK_ENV, "") not in ("", "0")


def one_line(message: str) -> str:
    """``message`` on one line: its lines joined, runs of spaces as one (a path or value that held a line
    break, or a parser's indented detail lines, cannot split it)."""
    return " ".join(message.split())
