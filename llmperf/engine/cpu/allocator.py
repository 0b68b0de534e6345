"""Keep freed memory in the process on a CPU (glibc): a prefill's multi-MB activations then reuse
freed blocks instead of each being a fresh `mmap` that is page-faulted in as it is written.

glibc serves an allocation above its mmap threshold with its own `mmap` and unmaps it on free; the
threshold starts at 128 KiB and rises (to at most 32 MiB) when such a block is freed, so whether an
operator pays the faults depends on what ran before it. Fixed thresholds (`mallopt`:
`M_MMAP_THRESHOLD` 1 GiB, `M_TRIM_THRESHOLD` 2 GiB) make it the same for every call, as PyTorch's CPU
tuning guide gets from jemalloc or tcmalloc; the process's resident memory then stays at its peak.
The engine asks for it when it runs on a CPU (`llmperf.engine.ops.ops_for`) and so does `calibrate`
on one, so that both measure the engine as it runs. `LLMPERF_KEEP_FREED_MEMORY=0` leaves glibc's
defaults; other C libraries are left alone. Measured: `reports/engine/README.md`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
MMAP_THRESHOLD = 1 << 30
TRIM_THRESHOLD = (1 << 31) - 1
ENV = "LLMPERF_KEEP_FREED_MEMORY"

_state: str | None = None  # None: not asked yet; else what `keep_freed_memory` did


def keep_freed_memory() -> str:
    """Set glibc's thresholds once per process; returns what was done: "kept" (set now or before),
    "off" (`LLMPERF_KEEP_FREED_MEMORY=0`) or "not glibc"."""
    global _state
    if _state is not None:
        return _state
    if os.environ.get(ENV, "1").strip() == "0":
        _state = "off"
        return _state
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        _state = "not glibc"
        return _state
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    _state = "kept" if ok else "not glibc"
    return _state


def describe() -> str:
    """One line for the machine description: what the allocator does with freed memory."""
    state = _state or "not asked yet"
    return {"kept": f"glibc keeps freed memory (mallopt: mmap threshold {MMAP_THRESHOLD >> 20} MiB)",
            "off": f"glibc defaults ({ENV}=0)"}.get(state, state)


__all__ = ["ENV", "describe", "keep_freed_memory"]
