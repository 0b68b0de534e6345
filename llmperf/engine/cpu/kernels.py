"""llmperf's own CPU kernels for a decode step (`kernels.cpp`), bound through ctypes: a
weight-streaming GEMM for few rows (`small_gemm`), a bf16 GEMM of up to 16 rows on AMX tiles
(`amx_pack`, `amx_gemm`), one call each for the RMSNorm (`rms_norm`), the RoPE (`rope`), SwiGLU's
activation (`silu_mul`) and decode attention (`decode_attention`), and all of a decode step's layers
in one call (`decode_layers`, the twelve operators of `LAYER_PARTS`).

A decode step multiplies a few rows of activations by every weight matrix: a stream of the weights
through the cores, so how close a step gets to the memory roofline is how fast the GEMM streams.
`y = x W^T + b` here reads each row of `W (out, in)` once, in bands per thread, prefetching the next
block of weight rows, and accumulates in fp32. After each weight stream the framework's dispatch
state is cold, so each kernel replaces several framework calls with one. The kernels round where
`transformers` and torch round (RoPE bit for bit; `decode_layers` gives the same logits as the
operators called one by one).

Which kernel runs a GEMM: `gemm_kernel` (up to `ROWS[dtype]` rows on the streaming GEMM, bf16 rows
`AMX_MIN_ROWS`-`AMX_ROWS` on AMX where `amx_available()`); `llmperf.engine.paths` prints the choice.
The kernels are compiled at first use with `$CXX` (default `c++`) into `$LLMPERF_CACHE_DIR`, and used
only on an x86-64 Linux CPU with AVX-512 F/BW and AVX512_BF16 and `LLMPERF_CPU_KERNELS` not `0`
(`available()`, `status()` says why not); `build()` compiles them on any x86-64 host, and
`LLMPERF_MAX_CPU_ISA` (`isa_cap`) makes them see a smaller CPU. The GEMMs are also the torch ops
`torch.ops.llmperf.small_gemm` and `.amx_gemm`, so `FlopCounterMode` counts their FLOPs.

Each kernel's design: docs/engine.md, "llmperf's CPU kernels"; what each earned, measured:
reports/engine/README.md.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import platform
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.utils import flop_counter
from torch.utils._python_dispatch import _get_current_dispatch_mode

from llmperf.outputs import cache_dir

SOURCE = Path(__file__).with_name("kernels.cpp")
MAX_ROWS = 8  # the kernel's limit (register blocking); the engine's use is `ROWS`
ROWS = {torch.bfloat16: 4, torch.float32: 8}  # dtype -> most rows the engine runs on the GEMM (docs/engine.md says why)
ISA = ("avx512f", "avx512bw", "avx512_bf16")  # /proc/cpuinfo flags the kernel needs
AMX_ISA = ("amx_tile", "amx_bf16")  # and the bf16 AMX GEMM
AMX_ROWS = 16  # the most rows of the AMX GEMM (one tile of rows)
AMX_MIN_ROWS = 3  # where AMX runs, the engine's bf16 GEMMs of 3-16 rows run on it (1-2 on the other kernel)
# -ffp-contract=off: the RoPE rounds each product as torch does (the GEMM's FMAs are explicit intrinsics)
FLAGS = ("-O3", "-mavx512f", "-mavx512bw", "-mavx512bf16", "-mamx-tile", "-mamx-bf16", "-mfma", "-ffp-contract=off",
         "-fopenmp", "-fPIC", "-shared", "-Wl,-z,defs")  # -z defs: an undefined symbol fails the link, not the load
SWITCH = "LLMPERF_CPU_KERNELS"  # "0": never use the kernels
_SUFFIXES = {torch.bfloat16: "bf16", torch.float32: "f32"}  # dtype -> the kernels' name suffix


class _State:
    lib: ctypes.CDLL | None = None
    fns: dict[torch.dtype, Any] = {}  # dtype -> the GEMM's entry point
    norms: dict[torch.dtype, Any] = {}  # dtype -> the RMSNorm's entry point
    ropes: dict[torch.dtype, Any] = {}  # dtype -> the RoPE's entry point
    silu_muls: dict[torch.dtype, Any] = {}  # dtype -> SwiGLU's activation's entry point
    attentions: dict[torch.dtype, Any] = {}  # dtype -> the decode attention's entry point
    layer_fns: dict[torch.dtype, Any] = {}  # dtype -> the decode layers' entry point
    amx_fns: tuple[Any, Any] | None = None  # (pack, GEMM) entry points
    reason: str | None = None  # why the kernels are unavailable (None: not tried yet, or available)
    amx: bool | None = None  # whether the AMX GEMM runs here (None: not asked yet)
    amx_reason: str | None = None  # why not
    tried = False
    enabled = True


_state = _State()


MAX_ISA = "LLMPERF_MAX_CPU_ISA"  # run as a CPU without the features above this level (as oneDNN's ONEDNN_MAX_CPU_ISA)
#: level -> the prefixes of /proc/cpuinfo flags it hides ("native": none)
ISA_LEVELS = {"avx2": ("avx512", "amx"), "avx512": ("amx",), "native": ()}


def _proc_cpu_flags() -> set[str]:
    """/proc/cpuinfo's flags (tests replace this to fake another CPU)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), or the machine's architecture."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.machine()


def isa_cap() -> tuple[str, str | None]:
    """(`$LLMPERF_MAX_CPU_ISA` or "native", None) or ("native", why the value is refused). With "avx2"
    the kernels see a CPU without AVX-512 and AMX, with "avx512" one without AMX: to measure on this
    machine what such a CPU runs. torch and oneDNN have their own switches, read when torch loads:
    `ATEN_CPU_CAPABILITY=avx2` and `ONEDNN_MAX_CPU_ISA=AVX2` (oneDNN then has no native bf16 either)."""
    level = os.environ.get(MAX_ISA, "").strip().lower() or "native"
    if level not in ISA_LEVELS:
        return "native", f"{MAX_ISA}: must be one of {', '.join(ISA_LEVELS)}, got {os.environ[MAX_ISA]!r}"
    return level, None


def cpu_features() -> set[str]:
    """This CPU's /proc/cpuinfo flags, less those above `$LLMPERF_MAX_CPU_ISA` (`isa_cap`)."""
    hidden = ISA_LEVELS[isa_cap()[0]]
    return {f for f in _proc_cpu_flags() if not f.startswith(hidden)} if hidden else _proc_cpu_flags()


def _compile(cxx: str) -> Path:
    """The shared library for this source and these flags, compiled now unless already cached."""
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join((cxx, *FLAGS)).encode()).hexdigest()[:16]
    out = cache_dir() / f"cpu_kernels-{key}.so"
    if out.exists():
        return out
    from llmperf.errors import SpecError
    from llmperf.outputs import check_dir, check_file
    try:  # atomic (llmperf.outputs): a concurrent build or a reader never sees half a library
        check_dir(out.parent, "LLMPERF_CACHE_DIR").create()
        with check_file(out, "LLMPERF_CACHE_DIR").replacing() as tmp:
            done = subprocess.run([cxx, *FLAGS, "-o", str(tmp), str(SOURCE)], capture_output=True, text=True,
                                  timeout=300)
            if done.returncode != 0:
                first = next((ln for ln in done.stderr.splitlines() if "error" in ln), done.stderr.strip()[:200])
                raise RuntimeError(f"{cxx} failed on {SOURCE.name}: {first}")
    except SpecError as exc:  # the cache folder cannot be written: no library (the torch path runs)
        raise RuntimeError(str(exc)) from None
    return out


def _entry(lib: ctypes.CDLL, name: str, argtypes: list[Any]) -> Any:
    """The kernel `name` of `lib`, typed (every entry point returns 0, or 1 for refused arguments)."""
    fn = getattr(lib, name)
    fn.argtypes, fn.restype = argtypes, ctypes.c_int
    return fn


def _load() -> ctypes.CDLL | None:
    if _state.tried:
        return _state.lib
    _state.tried = True
    missing = [f for f in ISA if f not in cpu_features()]
    cxx = os.environ.get("CXX", "c++")
    level, refused = isa_cap()
    if refused:
        _state.reason = refused
    elif missing:
        _state.reason = f"the CPU lacks {', '.join(missing)}" + (f"; {MAX_ISA}={level}" if level != "native" else "")
    elif shutil.which(cxx) is None:
        _state.reason = f"no C++ compiler ({cxx!r} not found; set CXX)"
    else:
        try:
            lib = ctypes.CDLL(str(_compile(cxx)))
            _bind(lib)
        except (OSError, RuntimeError, subprocess.SubprocessError, AttributeError) as exc:
            _state.reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        else:
            _state.lib = lib
    return _state.lib


def build() -> Path:
    """The kernels' shared library, compiled now unless cached, on any x86-64 host with a compiler:
    the compiler targets AVX-512 and AMX whatever this CPU runs, so a syntax or link error shows on
    every machine (`tests/engine/test_cpu_kernels.py` builds it even where it cannot run). Loading it
    runs none of its instructions; `_bind` checks that every entry point is there. Raises
    RuntimeError when there is no compiler or it fails."""
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        raise RuntimeError(f"no C++ compiler ({cxx!r} not found; set CXX)")
    return _compile(cxx)


def _bind(lib: ctypes.CDLL, state: _State | None = None) -> None:
    """Type every entry point of `lib` into `state` (default `_state`; AttributeError naming one that is
    missing)."""
    state = _state if state is None else state
    gemm_args = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    rope_args = [ctypes.c_void_p, *[ctypes.c_int64] * 5, *[ctypes.c_void_p] * 3, ctypes.c_int64, ctypes.c_int]
    norm_args = [ctypes.c_void_p, ctypes.c_int64, *[ctypes.c_void_p] * 2, *[ctypes.c_int64] * 4, ctypes.c_float,
                 ctypes.c_int]
    silu_args = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 2 + [ctypes.c_int]
    attention_args = ([ctypes.c_void_p, *[ctypes.c_int64] * 2, *[ctypes.c_void_p] * 2, *[ctypes.c_int64] * 3,
                       ctypes.c_void_p, *[ctypes.c_int64] * 2, ctypes.c_void_p, *[ctypes.c_int64] * 3,
                       ctypes.c_void_p, *[ctypes.c_int64] * 4, ctypes.c_float, ctypes.c_int])

    def entries(name: str, args: list[Any]) -> dict[torch.dtype, Any]:
        return {dtype: _entry(lib, f"llmperf_{name}_{suffix}", args) for dtype, suffix in _SUFFIXES.items()}

    state.fns, state.norms = entries("gemm", gemm_args), entries("rms_norm", norm_args)
    state.ropes, state.silu_muls = entries("rope", rope_args), entries("silu_mul", silu_args)
    state.attentions = entries("decode_attention", attention_args)
    layers_args = ([*[ctypes.c_void_p] * 3, *[ctypes.c_int64] * 8, ctypes.c_float, *[ctypes.c_void_p] * 3,
                    *[ctypes.c_int64] * 2, ctypes.c_void_p, *[ctypes.c_int64] * 6, ctypes.c_int,
                    ctypes.c_void_p, ctypes.c_int])
    state.layer_fns = entries("decode_layers", layers_args)
    state.amx_fns = (_entry(lib, "llmperf_amx_pack_bf16", [ctypes.c_void_p, *[ctypes.c_int64] * 2,
                                                           ctypes.c_void_p, ctypes.c_int]),
                     _entry(lib, "llmperf_gemm_amx_bf16", gemm_args))
    _entry(lib, "llmperf_amx_enable", [])


def available() -> bool:
    """Whether the kernel can run here (compiles it on first call; False when switched off)."""
    return _state.enabled and (_state.lib if _state.tried else _load()) is not None and os.environ.get(SWITCH) != "0"


def status() -> str:
    """One line for benchmark headers: whether the engine runs these kernels, or why not."""
    if os.environ.get(SWITCH) == "0":
        return f"off ({SWITCH}=0)"
    if not _state.enabled:
        return "off (disabled)"
    return "on" if _load() is not None else f"off ({_state.reason})"


@contextmanager
def disabled() -> Iterator[None]:
    """Run torch's operators instead within the block (side-by-side measurements)."""
    before, _state.enabled = _state.enabled, False
    try:
        yield
    finally:
        _state.enabled = before


def amx_available() -> bool:
    """Whether the bf16 AMX GEMM runs here: the kernels available, the CPU has AMX tiles with bf16, and
    Linux grants this process the tile state (asked once)."""
    if not available():
        return False
    if _state.amx is None:
        missing = [f for f in AMX_ISA if f not in cpu_features()]
        if missing:
            _state.amx, _state.amx_reason = False, f"the CPU lacks {', '.join(missing)}"
        elif _state.lib.llmperf_amx_enable() != 0:
            _state.amx, _state.amx_reason = False, "Linux refused the AMX tile state (arch_prctl)"
        else:
            _state.amx = True
    return _state.amx


def rows_for(dtype: torch.dtype) -> int:
    """The most rows of a GEMM the engine runs on these kernels in `dtype` (0: none): bf16 `AMX_ROWS`
    where the AMX GEMM runs, else `ROWS`."""
    if not available():
        return 0
    if dtype == torch.bfloat16 and amx_available():
        return AMX_ROWS
    return ROWS.get(dtype, 0)


STREAM, AMX = 1, 2  # `gemm_kernel`'s answers: the weight-streaming kernel (`small_gemm`), the AMX one


def gemm_kernel(x: torch.Tensor, w: torch.Tensor) -> int:
    """Which of these kernels runs the engine's GEMM of `x (..., in)` by `w (out, in)`: `AMX` (bf16 of
    `AMX_MIN_ROWS`-`AMX_ROWS` rows where AMX runs), `STREAM` (up to `rows_for` rows of fp32 / bf16), or
    0 (none: another dtype or device, more rows, the kernels unavailable). One call per GEMM, on the
    hot path: every check here costs microseconds once a GEMM has flushed the caches."""
    most = ROWS.get(x.dtype)
    if most is None or not x.is_cpu or w.dtype != x.dtype or not available():
        return 0
    rows = x.numel() // x.shape[-1]
    if x.dtype == torch.bfloat16 and (_state.amx if _state.amx is not None else amx_available()):
        return 0 if rows > AMX_ROWS else AMX if rows >= AMX_MIN_ROWS else STREAM
    return STREAM if rows <= most else 0


def amx_rows(dtype: torch.dtype) -> tuple[int, int] | None:
    """The rows (first, last) of `dtype`'s GEMMs that the engine runs on the AMX kernel (None: none)."""
    return (AMX_MIN_ROWS, AMX_ROWS) if dtype == torch.bfloat16 and amx_available() else None


def _refusal(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, rows: int) -> str | None:
    """What is wrong with these operands of `y = x w^T + b` (None: nothing)."""
    if w.dim() != 2 or x.shape[-1] != w.shape[1] or (b is not None and (b.dim() != 1 or b.shape[0] != w.shape[0])):
        return (f"small_gemm: x {tuple(x.shape)}, w {tuple(w.shape)}, b {None if b is None else tuple(b.shape)} "
                "do not fit y = x w^T + b")
    if x.dtype not in _SUFFIXES or w.dtype != x.dtype or (b is not None and b.dtype != x.dtype):
        return (f"small_gemm: dtypes must be one of fp32 / bf16 and agree, got x {x.dtype}, w {w.dtype}, "
                f"b {None if b is None else b.dtype}")
    if not 1 <= rows <= MAX_ROWS:
        return f"small_gemm: rows must be 1-{MAX_ROWS}, got {rows}"
    return None


def _small_gemm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    K = x.shape[-1]
    M = x.numel() // K if K else 0
    problem = _refusal(x, w, b, M)
    if problem:
        raise ValueError(problem)
    if _load() is None:
        raise RuntimeError(f"small_gemm: the kernel is unavailable: {_state.reason}")
    N = w.shape[0]
    x, w = x.contiguous(), w.contiguous()
    y = x.new_empty((*x.shape[:-1], N))
    rc = _state.fns[x.dtype](x.data_ptr(), w.data_ptr(), None if b is None else b.contiguous().data_ptr(),
                             y.data_ptr(), M, N, K, torch.get_num_threads())
    if rc:
        raise RuntimeError(f"small_gemm: the kernel refused M={M} N={N} K={K}")
    return y


_LIBRARY = torch.library.Library("llmperf", "FRAGMENT")  # noqa: TOR901 - a plain CPU kernel, no autograd
_LIBRARY.define("small_gemm(Tensor x, Tensor w, Tensor? b) -> Tensor")
_LIBRARY.impl("small_gemm", _small_gemm, "CPU")
OP = torch.ops.llmperf.small_gemm.default


def small_gemm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """`y = x w^T + b` for 1-`MAX_ROWS` rows of `x (..., in)`, `w (out, in)`, fp32 or bf16 on CPU.
    Runs as the op `OP` (`torch.ops.llmperf.small_gemm`) while a dispatch mode watches
    (`FlopCounterMode`, ...), otherwise calls the kernel directly: the dispatcher's round trip through
    Python costs 2 us a call, 5% of a bf16 batch-1 decode step's GEMM time."""
    if _get_current_dispatch_mode() is not None:
        return OP(x, w, b)
    return _small_gemm(x, w, b)


@flop_counter.register_flop_formula(torch.ops.llmperf.small_gemm)
def _small_gemm_flops(x_shape: torch.Size, w_shape: torch.Size, *args: Any, **kwargs: Any) -> int:
    """2 * rows * in * out, as `FlopCounterMode` counts `mm` (the bias not counted)."""
    return 2 * math.prod(x_shape[:-1]) * w_shape[0] * w_shape[1]


def amx_packed_size(n: int, k: int) -> int:
    """bf16 elements of `amx_pack`'s copy of an `(n, k)` weight: outputs padded to panels of 64, inputs
    to blocks of 32."""
    return -(-n // 64) * 64 * (-(-k // 32) * 32)


def amx_pack(w: torch.Tensor) -> torch.Tensor:
    """The copy of bf16 `w (out, in)` the AMX GEMM reads (1-D: panels of 64 outputs, VNNI tiles of 32
    inputs, zero-padded), made once per weight by the caller (`ops.CpuOps` keeps it like oneDNN's)."""
    if w.dtype != torch.bfloat16 or w.dim() != 2 or not w.is_cpu or w.numel() == 0:
        raise ValueError(f"amx_pack: w must be a non-empty 2-D bf16 CPU tensor, got {tuple(w.shape)} {w.dtype}")
    if not amx_available():
        raise RuntimeError(f"amx_pack: the AMX GEMM is unavailable: {_state.reason or _state.amx_reason}")
    N, K = w.shape
    w = w.contiguous()
    out = torch.empty(amx_packed_size(N, K), dtype=torch.bfloat16)
    _state.amx_fns[0](w.data_ptr(), N, K, out.data_ptr(), torch.get_num_threads())
    return out


def _amx_gemm(x: torch.Tensor, packed: torch.Tensor, n: int, b: torch.Tensor | None) -> torch.Tensor:
    K = x.shape[-1]
    M = x.numel() // K if K else 0
    if (x.dtype != torch.bfloat16 or packed.dtype != torch.bfloat16 or not 1 <= M <= AMX_ROWS or n < 1
            or packed.numel() != amx_packed_size(n, K) or (b is not None and (b.shape != (n,) or b.dtype != x.dtype))):
        raise ValueError(f"amx_gemm: x {tuple(x.shape)} {x.dtype} (1-{AMX_ROWS} rows), packed {packed.numel()} "
                         f"{packed.dtype} for {n} outputs, b {None if b is None else tuple(b.shape)} do not fit")
    x = x.contiguous()
    y = x.new_empty((*x.shape[:-1], n))
    rc = _state.amx_fns[1](x.data_ptr(), packed.data_ptr(), None if b is None else b.contiguous().data_ptr(),
                           y.data_ptr(), M, n, K, torch.get_num_threads())
    if rc:
        raise RuntimeError(f"amx_gemm: the kernel failed on M={M} N={n} K={K} (code {rc}: 2 is out of memory)")
    return y


_LIBRARY.define("amx_gemm(Tensor x, Tensor packed, int n, Tensor? b) -> Tensor")
_LIBRARY.impl("amx_gemm", _amx_gemm, "CPU")
AMX_OP = torch.ops.llmperf.amx_gemm.default


def amx_gemm(x: torch.Tensor, packed: torch.Tensor, n: int, b: torch.Tensor | None = None) -> torch.Tensor:
    """`y = x w^T + b` for 1-`AMX_ROWS` rows of bf16 `x (..., in)`, on `packed = amx_pack(w)` of `w
    (n, in)`, fp32 accumulation and one rounding; as the op `AMX_OP` while a dispatch mode watches."""
    if _get_current_dispatch_mode() is not None:
        return AMX_OP(x, packed, n, b)
    return _amx_gemm(x, packed, n, b)


@flop_counter.register_flop_formula(torch.ops.llmperf.amx_gemm)
def _amx_gemm_flops(x_shape: torch.Size, packed_shape: torch.Size, n: int, *args: Any, **kwargs: Any) -> int:
    """2 * rows * in * out, as `FlopCounterMode` counts `mm` (the bias not counted)."""
    return 2 * math.prod(x_shape[:-1]) * x_shape[-1] * n


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of fp32 or bf16 `x (..., n)` with weight `w (n,)` of the same dtype, in one call:
    `w * (x * rsqrt(mean(x^2) + eps))`, the mean in fp32; bf16 rounds as Hugging Face's
    `LlamaRMSNorm`: `w * (x.float() * rsqrt(...)).to(bf16)`."""
    n = x.shape[-1]
    if x.dtype not in _SUFFIXES or w.dtype != x.dtype or tuple(w.shape) != (n,) or not x.is_cpu or n < 1:
        raise ValueError(f"rms_norm: x {tuple(x.shape)} {x.dtype} and w {tuple(w.shape)} {w.dtype} must be "
                         "fp32 / bf16 CPU tensors of one dtype with w (n,) for x (..., n)")
    if _load() is None:
        raise RuntimeError(f"rms_norm: the kernels are unavailable: {_state.reason}")
    x, w = x.contiguous(), w.contiguous()
    y = torch.empty_like(x)
    if x.numel():
        _state.norms[x.dtype](x.data_ptr(), n, w.data_ptr(), y.data_ptr(), n, x.numel() // n, 1, n, eps,
                              torch.get_num_threads())
    return y


def rms_norm_heads_(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """`rms_norm` of every head of `x (N, heads, n)` in place, `x` returned: the heads of each token
    adjacent with contiguous features (`stride(2) == 1`, `stride(1) == n`), the tokens any stride
    apart, as the q or the k heads of a fused QKV GEMM's output `(N, H + 2 H_kv, n)` lie. The same
    values as `rms_norm(x, w, eps)`, bit for bit (one kernel), without a copy in, a fresh output or a
    concatenation: at Qwen3-30B-A3B's 2,048-token prefill those cost 8x the norm (page faults on
    tens of MB of fresh memory, `reports/engine/README.md`)."""
    if x.dim() != 3 or x.stride(2) != 1 or x.stride(1) != x.shape[2] or x.stride(0) < x.shape[1] * x.shape[2]:
        raise ValueError(f"rms_norm_heads_: x must be (tokens, heads, n) with each token's heads adjacent, got "
                         f"shape {tuple(x.shape)} strides {x.stride()}")
    N, heads, n = x.shape
    if x.dtype not in _SUFFIXES or w.dtype != x.dtype or tuple(w.shape) != (n,) or not x.is_cpu or n < 1:
        raise ValueError(f"rms_norm_heads_: x {tuple(x.shape)} {x.dtype} and w {tuple(w.shape)} {w.dtype} must be "
                         "fp32 / bf16 CPU tensors of one dtype with w (n,) for x (..., n)")
    if _load() is None:
        raise RuntimeError(f"rms_norm_heads_: the kernels are unavailable: {_state.reason}")
    w = w.contiguous()
    if x.numel():
        _state.norms[x.dtype](x.data_ptr(), x.stride(0), w.data_ptr(), x.data_ptr(), x.stride(0), N, heads, n, eps,
                              torch.get_num_threads())
    return x


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's activation of fp32 or bf16 `gate_up (..., 2f)` = [gate | up]: `F.silu(gate) * up`
    `(..., f)` in one call, rounded where torch rounds (silu in fp32, rounded to the dtype, then the
    product); its exp differs from torch's by an ulp or two of fp32."""
    two_f = gate_up.shape[-1]
    if gate_up.dtype not in _SUFFIXES or not gate_up.is_cpu or two_f < 2 or two_f % 2:
        raise ValueError(f"silu_mul: gate_up must be an fp32 / bf16 CPU tensor (..., 2f), got "
                         f"{tuple(gate_up.shape)} {gate_up.dtype}")
    if _load() is None:
        raise RuntimeError(f"silu_mul: the kernels are unavailable: {_state.reason}")
    gate_up = gate_up.contiguous()
    y = gate_up.new_empty((*gate_up.shape[:-1], two_f // 2))
    if y.numel():
        _state.silu_muls[gate_up.dtype](gate_up.data_ptr(), y.data_ptr(), gate_up.numel() // two_f, two_f // 2,
                                        torch.get_num_threads())
    return y


def use_ops_for(x: torch.Tensor) -> bool:
    """Whether the engine's RoPE, RMSNorm and SwiGLU activation of `x` run here: fp32 or bf16 on CPU,
    the kernels available."""
    return x.dtype in _SUFFIXES and x.is_cpu and available()


def rope(qkv: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor, in_place: bool = False) -> torch.Tensor:
    """`apply_rope` of the engine on the first `heads` heads of `qkv (N, heads_total, D)` (a GEMM
    output: each token's heads adjacent, features contiguous) with tables `cos`, `sin` of N rows of
    rotary_dim (any leading shape), in one call: `(N, heads, D)`, bit for bit what torch computes.
    `in_place`: written over those heads of `qkv` (which must then have that layout) and returned as
    a view of it, so no fresh tensor (tens of MB at a long prefill, paid in page faults)."""
    if in_place and (qkv.dim() != 3 or (qkv.numel() and (qkv.stride(2) != 1 or qkv.stride(1) != qkv.shape[2]))):
        raise ValueError(f"rope: in place needs qkv (tokens, heads, D) with each token's heads adjacent, got "
                         f"shape {tuple(qkv.shape)} strides {qkv.stride()}")
    if qkv.dim() != 3 or not qkv.is_cpu or qkv.dtype not in _SUFFIXES or not 1 <= heads <= qkv.shape[1]:
        raise ValueError(f"rope: qkv must be a (tokens, heads, D) fp32 / bf16 CPU tensor with at least {heads} "
                         f"heads, got {tuple(qkv.shape)} {qkv.dtype}")
    N, _, D = qkv.shape
    rd = cos.shape[-1]
    if (cos.dtype != qkv.dtype or sin.dtype != qkv.dtype or cos.numel() != N * rd or sin.shape != cos.shape
            or rd > D or rd % 2):
        raise ValueError(f"rope: tables cos {tuple(cos.shape)} {cos.dtype}, sin {tuple(sin.shape)} {sin.dtype} "
                         f"do not fit {N} tokens of head dim {D} in {qkv.dtype}")
    if qkv.stride(2) != 1 or qkv.stride(1) != D:
        qkv = qkv.contiguous()
    if _load() is None:
        raise RuntimeError(f"rope: the kernels are unavailable: {_state.reason}")
    cos, sin = cos.contiguous(), sin.contiguous()
    out = qkv[:, :heads] if in_place else qkv.new_empty((N, heads, D))
    if N:
        _state.ropes[qkv.dtype](qkv.data_ptr(), N, qkv.stride(0), heads, D, rd, cos.data_ptr(), sin.data_ptr(),
                                out.data_ptr(), out.stride(0), torch.get_num_threads())
    return out


MAX_HEAD_DIM = 128  # the decode attention's limit (register blocking)


def use_layers_for(x: torch.Tensor) -> bool:
    """Whether a decode step of activations `x` may run its layers in one call (`decode_layers`): fp32 or
    bf16 on CPU, the kernels available, and no dispatch mode watching (`FlopCounterMode` counts the
    GEMMs only when they run one by one, as ops)."""
    return use_ops_for(x) and _get_current_dispatch_mode() is None


def use_attention_for(q: torch.Tensor) -> bool:
    """Whether the engine's decode attention of queries `q (..., D)` runs here: fp32 or bf16 on CPU,
    D <= `MAX_HEAD_DIM`, the kernels available."""
    return q.dtype in _SUFFIXES and q.is_cpu and q.shape[-1] <= MAX_HEAD_DIM and available()


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                     window: int | None = None, block_tables: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of one query per sequence and head, `q (B, H, D)`, over its cached keys and values:
    `k`, `v (B, H_kv, S, D)` (any strides with D contiguous, the same for both), or with `block_tables`
    `(B, max_blocks)` int32 a paged cache's block pools `(N, P, H_kv, D)`, read in place (key s of
    sequence b in block `block_tables[b, s // P]`, slot `s % P`). Sequence b sees keys
    `[max(0, len_b - window), len_b)`, `len_b = seq_lens[b]` (int32, at most S = max_blocks * P when
    paged); softmax(scale q k^T) v in fp32. Returns `(B, H * D)`, what `F.scaled_dot_product_attention`
    gives with that mask up to the order of the sums."""
    B, H, D = q.shape
    paged = block_tables is not None
    kv_heads = k.shape[2 if paged else 1] if k.dim() == 4 else 0
    if (q.dtype not in _SUFFIXES or not q.is_cpu or k.dim() != 4 or (not paged and k.shape[0] != B)
            or k.shape[-1] != D or v.shape != k.shape or k.dtype != q.dtype or v.dtype != q.dtype or not kv_heads
            or H % kv_heads or D > MAX_HEAD_DIM):
        raise ValueError(f"decode_attention: q {tuple(q.shape)} {q.dtype}, k {tuple(k.shape)} {k.dtype}, "
                         f"v {tuple(v.shape)} {v.dtype} do not fit q (B, H, D), k = v (B, H_kv, S, D) (paged: "
                         f"(blocks, P, H_kv, D)) of one fp32 / bf16 dtype on CPU, H_kv dividing H, D <= {MAX_HEAD_DIM}")
    if seq_lens.dtype != torch.int32 or tuple(seq_lens.shape) != (B,) or window is not None and window < 1:
        raise ValueError(f"decode_attention: seq_lens must be ({B},) int32 and window None or >= 1, got "
                         f"{tuple(seq_lens.shape)} {seq_lens.dtype}, window {window}")
    if paged and (block_tables.dtype != torch.int32 or block_tables.dim() != 2 or block_tables.shape[0] != B):
        raise ValueError(f"decode_attention: block_tables must be ({B}, max_blocks) int32, got "
                         f"{tuple(block_tables.shape)} {block_tables.dtype}")
    if _load() is None:
        raise RuntimeError(f"decode_attention: the kernels are unavailable: {_state.reason}")
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k.stride(-1) != 1 or v.stride() != k.stride():
        k, v = k.contiguous(), v.contiguous()
    seq_lens = seq_lens.contiguous()
    if paged:
        tables = block_tables.contiguous()
        # pools (N, P, H_kv, D): block, slot and head strides; S = the slots a table row addresses
        strides, S = (k.stride(0), k.stride(2), k.stride(1)), tables.shape[1] * k.shape[1]
        table_args = (tables.data_ptr(), tables.stride(0), k.shape[1], k.shape[0])
    else:
        strides, S, table_args = (k.stride(0), k.stride(1), k.stride(2)), k.shape[2], (None, 0, 0, 0)
    out = q.new_empty((B, H * D))
    rc = _state.attentions[q.dtype](q.data_ptr(), q.stride(0), q.stride(1), k.data_ptr(), v.data_ptr(), *strides,
                                    seq_lens.data_ptr(), S, window or 0, *table_args, out.data_ptr(), B, H, kv_heads,
                                    D, scale, torch.get_num_threads())
    if rc == 3:
        raise ValueError(f"decode_attention: block_tables name a block outside the {k.shape[0]} of the pools")
    if rc:
        raise RuntimeError(f"decode_attention: the kernel failed (code {rc}: 2 is out of memory)")
    return out


#: the parts of a decode layer (`decode_layers`), in the order they run: the engine's operator names
LAYER_PARTS = ("attn_norm", "qkv_proj", "rope", "kv_write", "attention", "o_proj", "attn_residual", "mlp_norm",
               "gate_up_proj", "act", "down_proj", "mlp_residual")
#: per layer, the addresses `decode_layers` takes (`ptrs` row), in this order (0 for an absent bias)
LAYER_PTRS = ("attn_norm", "qkv", "qkv_bias", "o", "o_bias", "mlp_norm", "gate_up", "gate_up_bias", "down",
              "down_bias", "k", "v")


def decode_layers(x: torch.Tensor, ptrs: torch.Tensor, scales: torch.Tensor, *, heads: int, kv_heads: int,
                  head_dim: int, ffn: int, eps: float, cos: torch.Tensor, sin: torch.Tensor, seq_lens: torch.Tensor,
                  max_len: int, window: int | None, tables: torch.Tensor, k_blocks: torch.Tensor, amx: bool,
                  times: torch.Tensor | None = None) -> torch.Tensor:
    """Every layer of a Llama-family decode step in one call, on `x (B, C)` (the residual stream after
    the embedding, contiguous; updated in place and returned): per layer RMSNorm, the fused QKV GEMM,
    RoPE, the KV write, decode attention, o_proj and the residual, RMSNorm, the fused gate/up GEMM,
    SwiGLU and down_proj and the residual: the kernels of this module, called as the engine calls them
    one by one, so the result is the same bit for bit, without the framework between them.

    `ptrs (L, len(LAYER_PTRS))` int64: each layer's addresses (`LAYER_PTRS`: norms and weights `(out,
    in)`, or with `amx` their `amx_pack` copies, biases or 0, and the layer's K and V blocks); `scales (L,)`
    fp32 the softmax scale per layer. The cache is blocks: `k_blocks (N, P, H_kv, D)` is layer 0's K,
    whose strides every layer's K and V share; sequence b's token p sits in block `tables[b, p // P]`,
    slot `p % P` (a paged cache's block tables, or a contiguous cache's row per sequence as its one block).
    Each sequence's new token (position `seq_lens[b] - 1`, int32, each in [1, `max_len`]) is written
    there, then attended with the keys `[max(0, len - window), len)`. `cos`, `sin`: the RoPE tables of
    the B tokens, `(B, rotary_dim)` in x's dtype. `times (L * 12,)` fp64: if given, each part's seconds
    (`LAYER_PARTS` order per layer).
    The caller checks the model's structure; this checks what could write out of bounds."""
    B, C = x.shape
    L = ptrs.shape[0]
    rd = cos.shape[-1]
    if (x.dtype not in _SUFFIXES or not x.is_cpu or not x.is_contiguous() or ptrs.dtype != torch.int64
            or tuple(ptrs.shape) != (L, len(LAYER_PTRS)) or scales.dtype != torch.float32
            or tuple(scales.shape) != (L,) or cos.dtype != x.dtype or sin.shape != cos.shape
            or cos.numel() != B * rd or not cos.is_contiguous() or not sin.is_contiguous()
            or seq_lens.dtype != torch.int32 or tuple(seq_lens.shape) != (B,) or tables.dtype != torch.int32
            or tables.dim() != 2 or tables.shape[0] != B or not tables.is_contiguous() or k_blocks.dim() != 4
            or tuple(k_blocks.shape[2:]) != (kv_heads, head_dim) or k_blocks.dtype != x.dtype
            or (times is not None and (times.dtype != torch.float64 or times.numel() != L * len(LAYER_PARTS)))
            or (amx and x.dtype != torch.bfloat16)):
        raise ValueError(f"decode_layers: arguments do not fit x {tuple(x.shape)} {x.dtype}: ptrs "
                         f"{tuple(ptrs.shape)}, scales {tuple(scales.shape)}, cos {tuple(cos.shape)} {cos.dtype}, "
                         f"seq_lens {tuple(seq_lens.shape)} {seq_lens.dtype}, tables {tuple(tables.shape)} "
                         f"{tables.dtype}, k_blocks {tuple(k_blocks.shape)} {k_blocks.dtype}")
    if _load() is None:
        raise RuntimeError(f"decode_layers: the kernels are unavailable: {_state.reason}")
    rc = _state.layer_fns[x.dtype](x.data_ptr(), ptrs.data_ptr(), scales.data_ptr(), L, B, C, heads, kv_heads,
                                   head_dim, rd, ffn, eps, cos.data_ptr(), sin.data_ptr(), seq_lens.data_ptr(), max_len,
                                   window or 0, tables.data_ptr(), tables.shape[1], k_blocks.shape[1],
                                   k_blocks.shape[0], k_blocks.stride(0), k_blocks.stride(1), k_blocks.stride(2),
                                   int(amx), None if times is None else times.data_ptr(), torch.get_num_threads())
    if rc == 3:
        raise ValueError(f"decode_layers: the tables name a block outside the {k_blocks.shape[0]} of the cache")
    if rc:
        raise RuntimeError(f"decode_layers: the kernels refused the step (code {rc}: 1 sizes, 2 out of memory)")
    return x
