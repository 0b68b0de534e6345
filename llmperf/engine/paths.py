"""Which kernel runs each of the engine's GEMMs on this machine, and why: one answer for the engine,
`calibrate` (its GEMM sweep and dispatch rows step at each edge between two paths), `engine_bench`'s
header and CI's machine line, so that all of them change together when the CPU does.

A GEMM of R rows (B*T: sequences times new tokens) of dtype `dtype` runs on, in this order of rows:

- llmperf's weight-streaming kernel (`cpu.kernels.small_gemm`) up to `cpu.kernels.rows_for(dtype)`
  rows, where the kernels run (AVX-512 F/BW + AVX512_BF16 and a compiler);
- on a CPU with AMX, bf16 rows `cpu.kernels.amx_rows` (3-16) on llmperf's AMX GEMM instead;
- oneDNN's packed GEMM from `cpu.ops.packed_min_rows` rows (fp32 2; bf16 1, only where oneDNN has
  native bf16: AVX512_BF16 or AMX, which `ONEDNN_MAX_CPU_ISA` can hide);
- torch's own kernel below that (fp32 at one row: the matrix-vector product on a transposed copy)
  or at every row where nothing else runs (bf16 without native bf16: a GEMM that converts every
  element, ~10x slower than a native one; fp16; CUDA: cuBLAS).

The choice itself is `llmperf.engine.cpu.ops.CpuOps.linear`; this module describes it.

    python -m llmperf.engine.paths     # the machine line CI prints: CPU features and engine paths
"""

from __future__ import annotations

import platform
from dataclasses import dataclass

import torch

from llmperf.engine.cpu import kernels as cpu_kernels
from llmperf.engine.cpu import ops as cpu_ops

#: `GemmPath.kernel` -> what it is, for the reader
KERNELS = {
    "stream": "llmperf's weight-streaming GEMM (cpu.kernels.small_gemm)",
    "amx": "llmperf's AMX GEMM (cpu.kernels.amx_gemm)",
    "packed": "oneDNN's packed GEMM (mkldnn._linear_pointwise)",
    "gemv": "torch's matrix-vector product on a transposed (in, out) copy",
    "torch": "torch's F.linear",
}
SHORT = {"stream": "llmperf", "amx": "llmperf-AMX", "packed": "oneDNN", "gemv": "torch-GEMV", "torch": "torch"}


@dataclass(frozen=True, kw_only=True)
class GemmPath:
    """GEMMs of `first`..`last` rows (None: every row count from `first`) run on `kernel` (`KERNELS`)."""

    first: int
    last: int | None
    kernel: str

    def __str__(self) -> str:
        rows = f"{self.first}+" if self.last is None else str(self.first) if self.last == self.first \
            else f"{self.first}-{self.last}"
        return f"{SHORT[self.kernel]} {rows}"


def native_bf16() -> bool:
    """Whether bf16 GEMMs have a native kernel here: llmperf's (AVX512_BF16) or oneDNN's (AVX512_BF16
    or AMX; `ONEDNN_MAX_CPU_ISA` may hide them). Without one, torch converts every element and a bf16
    GEMM is compute-bound on the conversions, about 10x slower than fp32."""
    return cpu_kernels.available() or cpu_ops.onednn_bf16()


def native_kernel(dtype: torch.dtype) -> bool:
    """Whether GEMMs of `dtype` have a native kernel on this CPU: fp32 always, bf16 `native_bf16`, fp16
    where oneDNN has one (AVX512_FP16 or AMX-FP16)."""
    if dtype == torch.bfloat16:
        return native_bf16()
    if dtype == torch.float16:
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    return True


def gemm_paths(dtype: torch.dtype, device: torch.device | str = "cpu") -> tuple[GemmPath, ...]:
    """The kernel of the engine's GEMMs (`cpu.ops.CpuOps.linear`, the "auto" weight layout) per row
    count, in order of rows, the last open-ended."""
    device = torch.device(device)
    cpu = device.type == "cpu" and dtype in (torch.float32, torch.bfloat16)  # `ops.ops_for`: CpuOps
    own = cpu_kernels.rows_for(dtype) if cpu else 0
    amx = cpu_kernels.amx_rows(dtype) if cpu else None
    starts: list[tuple[int, str]] = []  # (first row, kernel)
    if own:
        starts += [(1, "stream"), (amx[0], "amx")] if amx and amx[0] > 1 else [(1, "amx" if amx else "stream")]
    after = own + 1
    packed = cpu_ops.packed_min_rows(dtype) if cpu else None
    plain = "gemv" if cpu and dtype == torch.float32 and not own and cpu_ops.GEMV_ROWS else "torch"
    if packed is None:
        starts.append((after, plain))
    else:
        if packed > after:
            starts.append((after, plain))
        starts.append((max(packed, after), "packed"))
    return tuple(GemmPath(first=first, last=starts[i + 1][0] - 1 if i + 1 < len(starts) else None, kernel=kernel)
                 for i, (first, kernel) in enumerate(starts))


def gemm_path_edges(dtype: torch.dtype, device: torch.device | str = "cpu") -> tuple[int, ...]:
    """Rows on both sides of each change of path (`gemm_paths`): fp32 with llmperf's kernels (8, 9),
    without them (1, 2); bf16 (4, 5), or (2, 3, 16, 17) on AMX; () where one path runs at every row
    count (bf16 on oneDNN alone, CUDA)."""
    return tuple(r for p in gemm_paths(dtype, device)[:-1] for r in (p.last, p.last + 1))


def one_call_rows(dtype: torch.dtype) -> int:
    """The most rows of a decode step whose layers run in one call of llmperf's kernels (a Llama-family
    model, `cpu.ops.CpuOps.decode_layers`); 0: never here."""
    return cpu_kernels.rows_for(dtype) if dtype in (torch.float32, torch.bfloat16) else 0


@dataclass(frozen=True, kw_only=True)
class EnginePaths:
    """What the engine runs on this CPU, and why."""

    features: tuple[str, ...]  # the CPU features that decide a path, present
    absent: tuple[str, ...]  # and absent (or hidden by LLMPERF_MAX_CPU_ISA)
    torch_capability: str  # ATen's vector ISA (`ATEN_CPU_CAPABILITY` caps it)
    kernels: str  # cpu_kernels.status()
    amx: str  # "on", or why not
    native_bf16: bool
    gemm: dict[str, tuple[GemmPath, ...]]  # dtype name -> paths
    one_call: dict[str, int]  # dtype name -> most rows of the one-call decode step (0: never)
    decode_attention: str

    def line(self) -> str:
        """One line: CPU features, then each dtype's GEMM paths and the rest."""
        gemm = "; ".join(f"{d} {', '.join(map(str, p))}" for d, p in self.gemm.items())
        one = ", ".join(f"{d} <= {n} rows" for d, n in self.one_call.items() if n) or "off"
        bf16 = "native" if self.native_bf16 else "EMULATED (no AVX512_BF16/AMX: converts every element)"
        return (f"cpu: {' '.join(self.features) or '-'} (absent: {' '.join(self.absent) or '-'}; torch "
                f"{self.torch_capability}) | llmperf kernels {self.kernels}, AMX {self.amx} | GEMM rows {gemm} | "
                f"bf16 {bf16} | decode layers in one call: {one} | decode attention: {self.decode_attention}")


#: the CPU features that decide a path (`cpu_kernels.ISA`, `cpu_kernels.AMX_ISA`, and AVX2/FMA)
DECIDING = ("avx2", "fma", *cpu_kernels.ISA, *cpu_kernels.AMX_ISA)


def engine_paths() -> EnginePaths:
    """The engine's paths on this CPU now (compiles llmperf's kernels on first use)."""
    flags = cpu_kernels.cpu_features()
    on = cpu_kernels.available()
    if not on:
        amx = "off (no kernels)"
    elif cpu_kernels.amx_available():
        amx = "on"
    else:
        amx = f"off ({cpu_kernels._state.amx_reason})"
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    return EnginePaths(features=tuple(f for f in DECIDING if f in flags),
                       absent=tuple(f for f in DECIDING if f not in flags),
                       torch_capability=torch.backends.cpu.get_cpu_capability(), kernels=cpu_kernels.status(),
                       amx=amx, native_bf16=native_bf16(),
                       gemm={d: gemm_paths(t) for d, t in dtypes.items()},
                       one_call={d: one_call_rows(t) for d, t in dtypes.items()},
                       decode_attention="llmperf's kernel" if on else "torch SDPA")


def machine_line() -> str:
    """CI's line: the machine, then `EnginePaths.line`."""
    from llmperf.engine.cpu.allocator import describe, keep_freed_memory

    keep_freed_memory()  # as every CPU engine runs
    return f"machine: {cpu_kernels.cpu_model()} ({platform.machine()}) | {engine_paths().line()} | {describe()}"


if __name__ == "__main__":
    print(machine_line())


__all__ = ["EnginePaths", "GemmPath", "KERNELS", "engine_paths", "gemm_path_edges", "gemm_paths", "machine_line",
           "native_bf16", "native_kernel", "one_call_rows"]
