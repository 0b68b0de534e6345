"""The checks a number from a user passes before llmperf computes with it, defined once.

A bool is never a number here (`True` is an `int` to Python, and a YAML `yes` would otherwise be read
as 1), NaN and infinity are refused wherever a real number is asked for (either would poison every
result it reaches, silently), and numpy's scalars count as the numbers they hold. `check_number`
raises the one-line `SpecError` every layer uses, naming the field and the value.
A leaf module: it imports nothing of llmperf but the error type, and no numpy (numpy's scalar types
register with the standard `numbers` ABCs).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from llmperf.errors import SpecError


def is_int(x: object) -> bool:
    """An integer (Python or numpy), not a bool."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def is_count(x: object) -> bool:
    """A Python `int`, not a bool: what a spec's count fields hold (YAML and JSON write them back as
    read; a numpy integer is refused there rather than carried into the spec)."""
    return isinstance(x, int) and not isinstance(x, bool)


def is_real(x: object) -> bool:
    """A finite real number (Python or numpy), not a bool."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def check_number(where: str, value: Any, *, zero_ok: bool = False, scale: float = 1.0) -> float:
    """`value` as a float if it is a finite real number > 0 (>= 0 with `zero_ok`) that stays finite in
    base units (`value * scale`, e.g. TFLOP/s -> FLOP/s); else `SpecError("{where} must be ..., got ...")`."""
    if not is_real(value) or value < 0 or (value == 0 and not zero_ok) or not math.isfinite(value * scale):
        kind = "a finite number >= 0" if zero_ok else "a finite positive number"
        raise SpecError(f"{where} must be {kind}, got {value!r}")
    return float(value)


__all__ = ["check_number", "is_count", "is_int", "is_real"]


def layer_indices(where: str, value: Any, num_layers: int, *, distinct: bool = True,
                  hint: str = "") -> tuple[int, ...]:
    """`value` (a list or tuple) as a tuple of layer indices in 0..num_layers - 1, each once where
    `distinct`; otherwise one line naming `where` (and `hint` after the range)."""
    got = tuple(value) if isinstance(value, list) else value
    if not isinstance(got, tuple) or not all(is_count(i) for i in got):
        raise SpecError(f"{where} must be a list of layer indices, got {value!r}")
    bad = [i for i in got if not 0 <= i < num_layers]
    if bad:
        raise SpecError(f"{where} holds layer {bad[0]}, outside 0..{num_layers - 1}{hint}")
    if distinct and len(set(got)) != len(got):
        raise SpecError(f"{where} lists a layer twice: {value!r}")
    return got
