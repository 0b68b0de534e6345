"""Errors that llmperf reports to users as one line (the CLI prints them and exits with code 2)."""

from __future__ import annotations


class SpecError(ValueError):
    """Bad user input: a spec field, a name, a file or an option. The message names field and value."""
