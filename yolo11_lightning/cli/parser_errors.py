"""Report LightningCLI's refusals (an unknown option, a wrong type, a missing config file) in one line."""

from __future__ import annotations

import difflib
import re
from typing import Any, NoReturn

from lightning.pytorch.cli import LightningArgumentParser

from yolo11_lightning.errors import UserInputError, one_line, wants_traceback


class OneLineErrorParser(LightningArgumentParser):
    """LightningCLI's parser, whose refusals (an unknown option, a value of the wrong type, a missing config
    file) are a ``UserInputError``: ``yolo11-lightning`` prints ``error: <message>; closest options: ...`` (an
    unknown option) or ``error: <message> (<command> --help lists the options)`` on one line and exits 2,
    instead of a screen of usage before the message. ``--traceback`` (``errors.wants_traceback``) restores
    jsonargparse's own report."""

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error or wants_traceback():  # inner parses raise; the outermost one reports
            super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self
        command = parser.prog.replace(" [options]", "")
        closest = _closest_options(message, parser)
        hint = (
            f"; closest options: {', '.join(closest)}"
            if closest
            else f" ({command} --help lists the options)"
        )
        raise UserInputError(f"{one_line(message)}{hint}") from ex


def _closest_options(message: str, parser: Any) -> list[str]:
    """The parser's options nearest to each unknown one in ``message`` (``unrecognized arguments: --x`` on the
    command line, ``does not accept option 'x'`` from a config file), by ``difflib``; [] when none is close."""
    unknown = re.findall(r"(?<!\w)--[\w.+-]+", message) if "unrecognized arguments" in message else []
    unknown += [f"--{key}" for key in re.findall(r"does not accept option '([^']+)'", message)]
    name = {  # every spelling of an option -> its first long one (aliases are suggested once)
        o: next((s for s in action.option_strings if s.startswith("--")), o)
        for action in getattr(parser, "_actions", [])
        for o in action.option_strings
    }
    found: list[str] = []
    for option in unknown:
        for close in difflib.get_close_matches(option, sorted(name), n=3, cutoff=0.75):
            found += [name[close]] if name[close] not in found else []
    return found
