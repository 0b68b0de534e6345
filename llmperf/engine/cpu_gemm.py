"""llmperf's own weight-streaming GEMM for the few rows of a CPU decode step (`cpu_gemm.cpp`).

A decode step multiplies 1-8 rows of activations by every weight matrix: it is a stream of the
weights through the cores, and how close a step gets to the memory roofline is how fast the GEMM
library streams. `y = x W^T + b` here reads each row of `W (out, in)` once, in bands per thread,
with a software prefetch, and accumulates in fp32 (bf16 with AVX512_BF16's dot product).

Measured 2026-11-23 on the 2-core development Xeon (AVX-512, AVX512_BF16, AMX; torch 2.13 CPU, 2
threads): the four projections of 12 layers of a 1024-wide Llama plus its 32000-token head (336 MB
in bf16, 672 MB in fp32, cycled through memory), GB/s of weights read, median of 5 per run:

                 this kernel   oneDNN packed   F.linear
    bf16 1 row     23.0-26.4      20.8-21.9       17.1     (three runs)
    bf16 2 rows       24.4           21.6         17.3
    bf16 8 rows       13.0           21.5         17.0     (VDPBF16PS-bound; oneDNN runs AMX)
    fp32 1 row        29.1           25.0         29.3
    fp32 8 rows       21.9           20.1         11.3

Without the software prefetch the kernel read 24.1 (bf16, 1 row) and 19.9 (fp32, 8 rows). In the
engine, the bf16 batch-1 decode step runs 1.09x [1.08, 1.11] faster on it (`engine_bench`, the two
alternated over 7 repeats). So the engine runs it for bf16 GEMMs of one row (`ROWS`); from two rows
the packed GEMM's dispatch model in `calibrate` (measured at 1 and 2 rows) would no longer hold.
fp32 at 2-8 rows would gain too (batch 8: 0.66 -> 0.71 of the memory limit) but needs weights stored
`(out, in)`, which costs the one-row fp32 step 3-5% against the plain matrix-vector path on
`(in, out)` weights: not switched.

The kernel is compiled at first use with the host's C++ compiler (`$CXX`, default `c++`) into
`$LLMPERF_CACHE_DIR` (default `~/.cache/llmperf`), keyed by the source and flags. It is used only
where it can run: an x86-64 Linux CPU with AVX-512 F/BW and AVX512_BF16, a working compiler, and
`LLMPERF_CPU_GEMM` not set to `0`; otherwise the engine keeps the library GEMMs, and `status()` says
why. The op is `torch.ops.llmperf.small_gemm` (visible to the profiler and to `FlopCounterMode`).
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.utils import flop_counter

SOURCE = Path(__file__).with_name("cpu_gemm.cpp")
MAX_ROWS = 8  # the kernel's limit (register blocking); the engine's use is `ROWS`
ROWS = {torch.bfloat16: 1}  # dtype -> most rows the engine runs on this kernel (the measurement above)
ISA = ("avx512f", "avx512bw", "avx512_bf16")  # /proc/cpuinfo flags the kernel needs
FLAGS = ("-O3", "-mavx512f", "-mavx512bw", "-mavx512bf16", "-mfma", "-fopenmp", "-fPIC", "-shared")
SWITCH = "LLMPERF_CPU_GEMM"  # "0": never use the kernel
_SYMBOLS = {torch.bfloat16: "llmperf_gemm_bf16", torch.float32: "llmperf_gemm_f32"}


class _State:
    lib: ctypes.CDLL | None = None
    reason: str | None = None  # why the kernel is unavailable (None: not tried yet, or available)
    tried = False
    enabled = True


_state = _State()


def cache_dir() -> Path:
    """Where the compiled kernel is kept: `$LLMPERF_CACHE_DIR`, else `$XDG_CACHE_HOME/llmperf`, else
    `~/.cache/llmperf`."""
    if os.environ.get("LLMPERF_CACHE_DIR"):
        return Path(os.environ["LLMPERF_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "llmperf"


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def _compile(cxx: str) -> Path:
    """The shared library for this source and these flags, compiled now unless already cached."""
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join((cxx, *FLAGS)).encode()).hexdigest()[:16]
    out = cache_dir() / f"cpu_gemm-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".cpu_gemm-", suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        done = subprocess.run([cxx, *FLAGS, "-o", tmp, str(SOURCE)], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            first = next((ln for ln in done.stderr.splitlines() if "error" in ln), done.stderr.strip()[:200])
            raise RuntimeError(f"{cxx} failed on {SOURCE.name}: {first}")
        os.replace(tmp, out)  # atomic: a concurrent build or a reader never sees half a library
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def _load() -> ctypes.CDLL | None:
    if _state.tried:
        return _state.lib
    _state.tried = True
    missing = [f for f in ISA if f not in _cpu_flags()]
    cxx = os.environ.get("CXX", "c++")
    if missing:
        _state.reason = f"the CPU lacks {', '.join(missing)}"
    elif shutil.which(cxx) is None:
        _state.reason = f"no C++ compiler ({cxx!r} not found; set CXX)"
    else:
        try:
            lib = ctypes.CDLL(str(_compile(cxx)))
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            _state.reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        else:
            for name in _SYMBOLS.values():
                fn = getattr(lib, name)
                fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
                fn.restype = ctypes.c_int
            _state.lib = lib
    return _state.lib


def available() -> bool:
    """Whether the kernel can run here (compiles it on first call; False when switched off)."""
    return _state.enabled and (_state.lib if _state.tried else _load()) is not None and os.environ.get(SWITCH) != "0"


def status() -> str:
    """One line for benchmark headers: whether the engine's one-row bf16 GEMMs run this kernel."""
    if os.environ.get(SWITCH) == "0":
        return f"off ({SWITCH}=0)"
    if not _state.enabled:
        return "off (disabled)"
    return "on" if _load() is not None else f"off ({_state.reason})"


@contextmanager
def disabled() -> Iterator[None]:
    """Run the library GEMMs instead within the block (side-by-side measurements)."""
    before, _state.enabled = _state.enabled, False
    try:
        yield
    finally:
        _state.enabled = before


def use_for(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether the engine's GEMM of `x (..., in)` by `w (out, in)` runs here: a CPU tensor of a dtype
    in `ROWS`, with no more rows than that, and the kernel available."""
    most = ROWS.get(x.dtype)
    return (most is not None and x.numel() <= most * x.shape[-1] and x.device.type == "cpu"
            and w.dtype == x.dtype and w.dim() == 2 and available())


def _small_gemm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    N, K = w.shape
    if x.shape[-1] != K or (b is not None and b.shape != (N,)):
        raise ValueError(f"small_gemm: x {tuple(x.shape)}, w {tuple(w.shape)}, "
                         f"b {None if b is None else tuple(b.shape)} do not fit y = x w^T + b")
    if x.dtype not in _SYMBOLS or w.dtype != x.dtype or (b is not None and b.dtype != x.dtype):
        raise ValueError(f"small_gemm: dtypes must be one of fp32 / bf16 and agree, got x {x.dtype}, "
                         f"w {w.dtype}, b {None if b is None else b.dtype}")
    M = x.numel() // K
    if not 1 <= M <= MAX_ROWS:
        raise ValueError(f"small_gemm: rows must be 1-{MAX_ROWS}, got {M}")
    lib = _load()
    if lib is None:
        raise RuntimeError(f"small_gemm: the kernel is unavailable: {_state.reason}")
    x, w = x.contiguous(), w.contiguous()
    b = None if b is None else b.contiguous()
    y = torch.empty(*x.shape[:-1], N, dtype=x.dtype)
    rc = getattr(lib, _SYMBOLS[x.dtype])(x.data_ptr(), w.data_ptr(), None if b is None else b.data_ptr(),
                                        y.data_ptr(), M, N, K, torch.get_num_threads())
    if rc:
        raise RuntimeError(f"small_gemm: the kernel refused M={M} N={N} K={K}")
    return y


_LIBRARY = torch.library.Library("llmperf", "FRAGMENT")  # noqa: TOR901 - a plain CPU kernel, no autograd
_LIBRARY.define("small_gemm(Tensor x, Tensor w, Tensor? b) -> Tensor")
_LIBRARY.impl("small_gemm", _small_gemm, "CPU")
small_gemm = torch.ops.llmperf.small_gemm.default


@flop_counter.register_flop_formula(torch.ops.llmperf.small_gemm)
def _small_gemm_flops(x_shape: torch.Size, w_shape: torch.Size, *args: Any, **kwargs: Any) -> int:
    """2 * rows * in * out, as `FlopCounterMode` counts `mm` (the bias not counted)."""
    return 2 * math.prod(x_shape[:-1]) * w_shape[0] * w_shape[1]
