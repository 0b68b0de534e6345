"""What one calibration measurement is: a streamed buffer, a timed GEMM or attention call, an
all-reduce, each with its bytes, FLOPs, fastest and typical time and spread.

A ceiling is the fastest call observed (as the Berkeley Empirical Roofline Toolkit reports the best
of its trials: a shared machine only ever slows a call down); the time model's efficiencies are
fitted on the typical (median) call. All-reduce bandwidth follows nccl-tests:
`busbw = bytes / time * 2 (n - 1) / n`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class StreamPoint:
    kind: str  # "read" | "copy" | "add"
    size_bytes: int  # one buffer
    bytes_moved: int  # per call: read + written
    seconds: float
    spread_s: float
    n: int

    @property
    def bytes_per_s(self) -> float:
        return self.bytes_moved / self.seconds


@dataclass(frozen=True, kw_only=True)
class ComputePoint:
    """A timed GEMM (`op="matmul"`) or SDPA call (`op="attention"`) with its FLOPs and bytes.

    `seconds` is the fastest call: what a ceiling reports (peak FLOP/s, GEMV bandwidth), as empirical
    roofline tools do. `median_s` is the typical call: what the time model's efficiencies are fitted
    on, because a prediction is compared with typical (median) calls. Fitting them on the fastest
    call made every calibrated prediction optimistic by the run-to-run spread (on a 2-core CPU the
    p10-p90 spread of a GEMV is 25-60% of its fastest call)."""

    op: str
    dtype: str
    rows: int  # batch * q_len: the time model's key
    shape: str
    seconds: float
    spread_s: float
    n: int
    flops: float
    bytes: float
    median_s: float = 0.0  # 0: unknown (the fastest call stands in)
    memory_bound: bool = False  # by construction (a decode attention call streams its KV cache)
    # a read of the same weight copies just before the call (bytes/s; the CPU weight-size sweep's decode
    # rows, `cpu_gemm_sizes`): the host's DRAM speed at that moment, which `fit_gemm_e_memory` reads the
    # call against. 0: not probed
    read_bytes_per_s: float = 0.0
    group: int = 0  # attention: query heads per KV head (`fit_decode_groups`); 0: not an attention point

    @property
    def typical_s(self) -> float:
        return self.median_s if self.median_s > 0 else self.seconds

    @property
    def flops_per_s(self) -> float:
        return self.flops / self.seconds

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / self.seconds


@dataclass(frozen=True, kw_only=True)
class AllreducePoint:
    backend: str
    world: int
    size_bytes: int
    seconds: float

    @property
    def algbw(self) -> float:
        return self.size_bytes / self.seconds

    @property
    def busbw(self) -> float:
        return self.algbw * 2 * (self.world - 1) / self.world
