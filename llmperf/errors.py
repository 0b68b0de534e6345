"""Errors that llmperf reports to users as one line (the CLI prints them and exits with code 2)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class SpecError(ValueError):
    """Bad user input: a spec field, a name, a file or an option. The message names field and value."""


def unknown_name(kind: str, name: str, known: Iterable[str]) -> SpecError:
    """An exact-lookup miss: list the close names (or all of them when none is close)."""
    known = sorted(known)
    close = difflib.get_close_matches(name.lower(), known, n=5, cutoff=0.5)
    hint = f"did you mean: {', '.join(close)}" if close else f"known: {', '.join(known)}"
    return SpecError(f"unknown {kind} {name!r} ({hint})")
