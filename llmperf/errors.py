"""Errors that llmperf reports to users as one line (the CLI prints them and exits with code 2)."""

from __future__ import annotations

from collections.abc import Iterable


class SpecError(ValueError):
    """Bad user input: a spec field, a name, a file or an option. The message names field and value."""


def unknown_name(kind: str, name: str, known: Iterable[str]) -> SpecError:
    """An exact-lookup miss listing the close names (prefix, token, then spelling matches); the rule
    lives in `llmperf.specs.names`."""
    from llmperf.specs.names import unknown_name as _unknown_name
    return _unknown_name(kind, name, known)
