"""Human-readable units for tables: FLOPs, decimal bytes (traffic), GiB (capacity), seconds."""

from __future__ import annotations

import math


def _scaled(value: float, units: tuple[str, ...], base: float) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    value = float(value)
    i = 0
    while abs(value) >= base and i < len(units) - 1:
        value /= base
        i += 1
    return f"{value:.3g} {units[i]}"


def flops(value: float) -> str:
    return _scaled(value, ("FLOP", "kFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP", "EFLOP"), 1000.0)


def nbytes(value: float) -> str:
    """Decimal bytes (memory traffic): 1 GB = 1e9 B."""
    return _scaled(value, ("B", "kB", "MB", "GB", "TB", "PB"), 1000.0)


def gib(value: float) -> str:
    """Capacities in GiB (2**30 B)."""
    return f"{value / 2**30:.2f} GiB"


def seconds(value: float) -> str:
    value = float(value)
    if value == 0:
        return "0 s"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value / 1e-9:.3g} ns"


def count(value: float | None) -> str:
    return "-" if value is None else f"{int(value):,}"
