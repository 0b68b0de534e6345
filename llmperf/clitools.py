"""Shared pieces of the command line: consoles, output formats, list parsing, error exit, atomic output.

Every command module (`llmperf/cli.py`, `llmperf/commands/*.py`) uses these, so bad input looks the same
everywhere: one line on stderr naming the option and the value, exit code 2.
"""

from __future__ import annotations

import os
import sys
import tempfile
from enum import Enum
from pathlib import Path

import typer
from rich.console import Console

from llmperf.errors import SpecError

out_console = Console(width=None if sys.stdout.isatty() else 150)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


class OutputFormat(str, Enum):
    table = "table"
    json = "json"
    csv = "csv"


class AttentionImpl(str, Enum):
    fused = "fused"
    naive = "naive"


def fail(message: str) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {message}", markup=True, highlight=False)
    return typer.Exit(2)


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


def write_output(text: str, output: Path | None) -> None:
    """Print, or write atomically: a temporary file in the same folder, then a rename."""
    if output is None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return
    folder = output.parent if str(output.parent) else Path(".")
    if not folder.is_dir():
        raise SpecError(f"--output: folder {str(folder)!r} does not exist")
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{output.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, output)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


