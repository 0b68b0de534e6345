"""Shared pieces of the command line: consoles, output formats, list parsing, error exit, atomic output.

Every command module (`llmperf/cli/__init__.py`, `llmperf/cli/commands/*.py`) uses these, so bad input looks the same
everywhere: one line on stderr naming the option and the value, exit code 2.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from llmperf.errors import SpecError


def _columns_ok() -> bool:
    """COLUMNS names a usable width (a positive number); 0 or junk is ignored, as a terminal would."""
    text = os.environ.get("COLUMNS", "")
    if text.isdigit() and int(text) < 1:
        os.environ.pop("COLUMNS")  # rich would draw everything 0 columns wide: nothing at all
        return False
    return text.isdigit()


# A terminal (or COLUMNS) sets the width; piped without COLUMNS, wide tables keep 150 columns.
_COLUMNS = _columns_ok()
# markup=False everywhere: names, paths and values from the user are shown as text, never as rich
# markup (`foo[/]` is a valid model name); styles are given with `Text` / `style=`.
out_console = Console(width=None if sys.stdout.isatty() or _COLUMNS else 150, markup=False)
err_console = Console(stderr=True, highlight=False, soft_wrap=True, markup=False)


class OutputFormat(str, Enum):
    table = "table"
    json = "json"
    csv = "csv"


class AttentionImpl(str, Enum):
    fused = "fused"
    naive = "naive"


def fail(message: str) -> typer.Exit:
    """Print `error: message` (one line; the message is text, never rich markup) and return the exit."""
    _say("error:", "bold red", message)
    return typer.Exit(2)


@contextmanager
def refused_cleanly() -> Iterator[list[Any]]:
    """A command's body: the output folders it appends to the yielded list are discarded if it fails
    (a command that fails leaves no output behind), and a `SpecError` becomes `fail`'s one line."""
    made: list[Any] = []
    try:
        yield made
    except BaseException as exc:
        for out in made:
            out.discard()
        if isinstance(exc, SpecError):
            raise fail(str(exc)) from None
        raise


def warn(message: str, label: str = "warning:") -> None:
    """`warning: message` on stderr; the message is shown as text (user names may hold `[...]`)."""
    _say(label, "yellow", message)


def _say(label: str, style: str, message: str) -> None:
    from rich.text import Text
    line = Text(label, style=style)
    line.append(" " + plain(message))
    err_console.print(line, highlight=False)


def plain(text: object) -> str:
    """`text` safe for a terminal: control characters (escape sequences that could set a window title or
    colours) shown as Python escapes, so a spec's name can never drive the terminal."""
    s = str(text)
    if any((ord(c) < 32 and c not in "\n\t") or 127 <= ord(c) < 160 for c in s):
        s = "".join(c if (ord(c) >= 32 and not 127 <= ord(c) < 160) or c in "\n\t"
                    else repr(c)[1:-1] for c in s)
    return s


def parse_int_list(option: str, text: str) -> list[int]:
    """'1,8,64' -> [1, 8, 64]; anything else is an error naming the option and the value."""
    parts = [p.strip() for p in str(text).split(",")]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise SpecError(f"{option}: {text!r} is not a comma-separated list of positive integers") from None
    bad = [v for v in values if v < 1]
    if bad:
        raise SpecError(f"{option}: {bad[0]} in {text!r} is not a positive integer")
    return values


def parse_name_list(option: str, text: str) -> list[str]:
    names = [p.strip() for p in str(text).split(",")]
    if not all(names):
        raise SpecError(f"{option}: {text!r} has an empty name")
    return names


def write_output(text: str, output: Path | str | None, option: str = "--output") -> None:
    """Print `text` (`output` None or "-"), or write it to the file `output` atomically, as `> FILE`
    would (`llmperf.outputs`: the usual modes, through symlinks, refusing FIFOs / devices /
    directories, errors naming `output`, never a temporary file). Errors are `SpecError`s naming
    `option`."""
    from llmperf.outputs import write_text
    write_text(output, text, option)


def check_output(output: Path | str | None, option: str = "--output"):  # noqa: ANN201
    """Check `-o` before any work starts (None for stdout); pass the result to `write_output`."""
    from llmperf.outputs import check_file
    return check_file(output, option)
