"""Looking names up: exact (case-insensitive) or not at all, and a miss suggests the close names.

Suggestions come in three tiers, so that the name a user half-remembers is listed first:
1. names that start with what was typed (`a100` -> every A100),
2. names that contain every token typed, tokens split on `-`, `_` and spaces
   (`h100 sxm` -> h100-sxm, `llama 8b` -> llama-3.1-8b, `80gb` -> both 80 GB A100s),
3. only when neither finds anything: names within a small edit distance (`lama-2-7b` -> llama-2-7b),
   by `difflib`'s ratio.
A lookup never picks a suggestion by itself: two devices one prefix apart (A100 40 GB / 80 GB) differ
by 30% in bandwidth, so guessing would give a confident wrong answer.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

from llmperf.errors import SpecError

_SEPARATORS = re.compile(r"[-_\s]+")
_MAX_EDIT_MATCHES = 5


def check_spec_name(name: object, kind: str = "name") -> str:
    """A spec's `name`: a non-empty string without control characters (an escape sequence in a name
    would drive the terminal that shows it); refused naming the field and the value."""
    if not isinstance(name, str):
        raise SpecError(f"{kind}: must be a string, got {name!r}")
    if not name.strip():
        raise SpecError(f"{kind}: must not be empty, got {name!r}")
    if any(ord(c) < 32 or 127 <= ord(c) < 160 for c in name):
        raise SpecError(f"{kind}: must not hold control characters, got {name!r}")
    return name


def tokens(name: str) -> list[str]:
    """`'A100-80GB sxm'` -> `['a100', '80gb', 'sxm']`."""
    return [t for t in _SEPARATORS.split(name.strip().lower()) if t]


def close_names(name: str, known: Iterable[str]) -> list[str]:
    """The known names close to `name`: prefix matches, then token matches, then near spellings."""
    known = sorted(set(known))
    query = name.strip().lower()
    if not query:
        return []
    prefix = [k for k in known if k.lower().startswith(query)]
    wanted = tokens(query)
    by_token = [k for k in known if k not in prefix and wanted
                and all(any(t == w or t.startswith(w) for t in tokens(k)) for w in wanted)]
    if prefix or by_token:
        return prefix + by_token  # `a100` lists the A100s, not also the A10 one letter away
    return difflib.get_close_matches(query, known, n=_MAX_EDIT_MATCHES, cutoff=0.6)


def unknown_name(kind: str, name: str, known: Iterable[str]) -> SpecError:
    """The error for a lookup miss: the close names, or every known name when none is close."""
    known = sorted(set(known))
    close = close_names(name, known)
    hint = f"did you mean: {', '.join(close)}" if close else f"known: {', '.join(known)}"
    return SpecError(f"unknown {kind} {name!r} ({hint})")
