"""`llmperf calibrate`: measure this device's real ceilings and fit the calibrated time model.

What is measured (an empirical roofline toolkit's method: Berkeley ERT, Intel Advisor, Nsight
Compute's roofline; see REFERENCE.md):
- streaming `read` (a sum) and `copy` bandwidth over buffer sizes that reveal the caches (bytes moved
  = read + written, decimal GB/s), and an elementwise `add` on the largest buffer;
- GEMM throughput per dtype the device supports, `x (rows, K) @ W (K, N)` with a weight too large for
  the cache, over rows = 1 .. R: rows = 1 is a GEMV, the matrix-vector bandwidth decode really gets.
  On CPU the calls cycle through copies of W that together fill twice the largest cache reported (at
  least 512 MiB, `working_set_for`): a single 67 MB weight stayed in this machine's shared L3 and its
  GEMV ran twice as fast as any real model's;
- attention through `torch.nn.functional.scaled_dot_product_attention` as the engine calls it, with 4
  query heads per KV head (decode: a large KV cache, cycled through copies like W, memory-bound by
  construction, the group folded into the query axis; prefill: causal squares), per dtype;
- the fixed cost of a tiny operator of each kind (host dispatch on CPU, launch on GPU): the mean
  time of back-to-back calls on 1-row tensors, and the host time of an engine step outside its
  forward pass (sampling and cache bookkeeping, from a tiny model's generation);
- the dispatch cost of each engine OPERATOR (`attn_norm`, `qkv_proj`, `rope`, `kv_write`,
  `attention`, ...), per attention backend (sdpa and naive; triton on CUDA only, where it is timed):
  the median per-layer time of each operator over the decode steps of a tiny model's recorded greedy
  generation (hidden 64, 2 layers: nothing like a model anyone evaluates, so no evaluated
  configuration leaks into the calibration). At that size the device work is a fraction of a
  microsecond (every weight is a few KiB and cache-resident), so what is measured is what the
  engine's eager Python pays per operator: one operator can be many framework calls (the RoPE is
  about ten), which one tiny call per kind does not see. On CUDA the per-operator CUDA events of the
  recorder measure the time the GPU waits between the operator's first and last launch: in a
  launch-bound tiny model, its host dispatch;
- on CPU, the same per compute dtype (fp32, bf16) at one and two rows (`op_overhead_rows_s`), and
  for the weight GEMMs also on both sides of each edge between the engine's GEMM paths: a
  projection of few rows runs a kernel of llmperf's own (`engine.cpu_kernels`: up to 8 fp32 / 4 bf16
  rows, bf16 3-16 on its AMX GEMM where the CPU has AMX; without them torch's fp32 GEMV at one row),
  anything else oneDNN's packed GEMM,
  whose cold call costs up to three times as much (38 us against 123 us);
- on CPU, the dispatch of every operator that reads no weights (norms, RoPE, the KV write, attention
  over a short context, the activation, residual adds, the embedding) where it really runs: in the
  recorded decode of a model with Llama 3.2 1B's layer shapes (hidden 2048, FFN 8192, 32 query and
  8 KV heads; 2 layers, `dispatch_hidden`), between GEMMs whose weights stream from DRAM. The tiny
  model with a 32 MiB GEMV before EVERY operator prices them twice as slow as any real layer does
  (fp32 RMSNorm: 78 us there, 33-45 us in layers 768 to 2048 wide, measured 2026-11-23), because
  in a layer most of them follow another small operator, not a GEMM. The weight GEMMs keep the tiny
  model's cold figure (their own time in a real layer is the weight stream);
- where the engine runs a decode step's layers in one call (a Llama-family model at fp32 / bf16 on a
  CPU with llmperf's kernels, as both models above are: `engine.cpu_kernels.decode_layers`), what
  the recorder gives each operator is its part of that call, timed inside it, and the cold GEMV runs
  once before the call: so the dispatch measured at 1 and 2 rows, and at the GEMM edges the call
  takes (fp32 up to 8 rows, bf16 up to 16 on AMX), is what the engine pays, 1-10 us where the
  operators called one by one paid 15-80 us; past those rows the operators dispatch one by one
  again, and the edges' other side measures that. Measured 2026-11-24: in the one call, the small
  operators' own work at the in-situ model's width (2048) is most of what is measured, so a
  1024-wide, 4-layer model's norms, RoPE, KV write, activation and residuals are priced at 2-3x
  their measured 4-35 us per step, all layers (0.1-0.2 ms of a 7-20 ms step); its GEMMs and
  attention within 0-15%;
- the engine's vector operators at size (`op_e_memory`): norms, RoPE, the gated activation, residual
  adds and the KV write are several framework calls each, with fresh (page-faulting) outputs, so a
  large prefill runs them at a fraction of the streaming bandwidth (the engine's RMSNorm over 8192 x
  1024 fp32 moved 64 MB at 5.8 GB/s). Recorded prefills of a hidden-512 one-layer model at 128 to
  32768 tokens give each operator's memory efficiency as a curve over the bytes one call moves;
- with more than one CUDA device (NCCL) or on CPU with two processes (gloo), all-reduce latency and
  bus bandwidth as nccl-tests reports them: `busbw = bytes / time * 2 (n - 1) / n`.

Timers: `llmperf.measure.timers` (CUDA events via `triton.testing.do_bench` on GPU; a warmed-up
`perf_counter` on CPU, threads recorded). A ceiling is the fastest call observed (as ERT reports the
best of its trials: a shared machine only ever slows a call down); every figure keeps the spread
(p90 - p10) of its calls beside it. The dispatch overheads are medians of back-to-back rounds.

From these, `fit_terms` derives the calibrated time model (`llmperf.analysis.timemodel`):
the spec's `peak_tflops[dtype]` is the best GEMM throughput measured at that dtype and
`memory_bandwidth_gbps` the best DRAM-sized stream (read, copy or GEMV), so every efficiency is in
(0, 1]. For each measured GEMM / attention point, with `t' = t - overhead`:
`e_compute(rows) = min(1, flops / (peak * t'))` and `e_memory(rows) = min(1, max(e_gemv,
bytes / (bw * t')))`, so the model reproduces every calibration point and interpolates in log(rows)
between them. Vector operators get `e_memory = add bandwidth / bw`. The overheads combine with
the device time by `overhead_mode`: `add` on CPU (dispatch and work run on one thread), `overlap` on
CUDA (asynchronous launches; see `llmperf.analysis.timemodel`), where the fit takes `t' = t`: a
CUDA-event time of back-to-back calls is the device's own time. Nothing from `profile`'s
configurations is used: calibration is fitted on these micro-benchmarks only.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from llmperf.analysis.operators import attention_cost
from llmperf.analysis.timemodel import EFFICIENCY_SCHEMA
from llmperf.analysis.vocabulary import WEIGHT_MATMUL_OPS
from llmperf.measure.device import describe, versions
from llmperf.measure.timers import gc_paused, pooled, time_fn
from llmperf.specs import HardwareSpec
from llmperf.specs.local import CALIBRATION_SCHEMA, CALIBRATION_TOOL, LOCAL_NAME

DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
VECTOR_KINDS = ("elementwise", "norm", "embedding")
MiB = 1 << 20

Progress = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class Settings:
    """What to measure. `for_device` gives the full run; `tiny()` a seconds-long one for tests."""

    device: str = "cpu"
    dtypes: tuple[str, ...] = ("fp32", "bf16", "fp16")
    stream_sizes: tuple[int, ...] = tuple(s * 1024 for s in (64, 256, 1024, 4096, 16384, 65536, 262144))
    gemm_k: int = 4096
    gemm_n: int = 8192
    gemm_rows: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    gemm_call_budget_s: float = 0.8  # stop growing rows before a call predicted to take longer (slow dtypes)
    # a dtype's GEMM sweep stops before a point predicted to take it past this many seconds (`sweep_fits`)
    gemm_sweep_budget_s: float = 30.0
    # the vector-operator prefills of a dtype stop before one predicted to take them past this (`sweep_fits`)
    vector_budget_s: float = 20.0
    # CPU: either sweep of a dtype without a native kernel here (`engine.paths.native_kernel`: bf16 on an
    # AVX2-only CPU, fp16 on most) stops at this instead. Such a GEMM converts every element, ~10x fp32's
    # time: on an AVX2 EPYC the bf16 sweep took 66 s and its vector prefills 75 s, of a 330 s calibration
    emulated_budget_s: float = 8.0
    gemm_rounds: int = 3  # CPU: interleaved rounds of the memory-bound GEMM points (`measure_gemm`)
    attn_heads: int = 16
    attn_head_dim: int = 128
    # query heads per KV head (`attn_heads` query heads, attn_heads / attn_group KV heads): attention is
    # timed as the engine's SDPA backend runs grouped-query attention (decode: the group folded into the
    # query axis, read once per KV head; prefill: `enable_gqa`). 4: Llama 3 8B, Mistral 7B
    attn_group: int = 4
    attn_decode: tuple[tuple[int, int], ...] = ((1, 4096), (4, 4096))  # (batch, context)
    attn_prefill: tuple[int, ...] = (256, 1024)  # causal square, batch 1
    reps: int = 5
    allreduce: bool = True
    allreduce_sizes: tuple[int, ...] = (4096, 65536, MiB, 16 * MiB)
    step_overhead: bool = True
    op_overhead: bool = True  # per engine operator and attention backend, from a tiny model's generation
    op_overhead_tokens: int = 32  # tokens the tiny model generates for it
    # CPU: the width of `dispatch_spec`'s model, whose recorded decode gives the dispatch of the operators
    # that read no weights (0: they keep the tiny model's cold figure, as the GEMMs do)
    dispatch_hidden: int = 2048
    threads: int | None = None  # CPU threads (torch.set_num_threads) while measuring; None: torch's default
    # CPU: the bytes a GEMM's weights / a decode's KV cache cycle through (copies used in turn), so every
    # call streams from DRAM as in a real model's step. None: `working_set_for` decides (0: one copy).
    working_set_bytes: int | None = None
    # (batch, prompt) prefills of VECTOR_SPEC whose recorded operators give `op_e_memory`; () skips it
    vector_prefills: tuple[tuple[int, int], ...] = ((1, 128), (4, 512), (16, 1024), (32, 1024))
    vector_reps: int = 3

    def __post_init__(self) -> None:
        """Settings that cannot be measured are refused before anything runs, naming the field."""
        if self.attn_group < 1 or self.attn_heads % self.attn_group:
            raise ValueError(f"attn_group: must divide attn_heads={self.attn_heads}, got {self.attn_group!r}")
        if self.dispatch_hidden < 0 or self.dispatch_hidden % 64:
            raise ValueError("dispatch_hidden: must be 0 or a multiple of 64 (heads of 64), "
                             f"got {self.dispatch_hidden!r}")
        if self.gemm_rounds < 1:
            raise ValueError(f"gemm_rounds: must be >= 1, got {self.gemm_rounds!r}")

    @classmethod
    def for_device(cls, device: str, **changes: Any) -> Settings:
        if device == "cuda":
            base = cls(device="cuda", stream_sizes=tuple(s * MiB for s in (1, 8, 32, 128, 512, 2048)),
                       gemm_k=8192, gemm_n=8192, gemm_rows=(1, 4, 16, 64, 256, 1024, 4096, 8192),
                       gemm_call_budget_s=1.0, gemm_sweep_budget_s=60.0, vector_budget_s=60.0,
                       emulated_budget_s=60.0, attn_heads=32, attn_decode=((1, 8192), (32, 8192)),
                       attn_prefill=(1024, 4096), allreduce_sizes=(4096, 65536, MiB, 16 * MiB, 256 * MiB))
        else:
            base = cls(device=device)
        from dataclasses import replace
        return replace(base, **changes)

    @classmethod
    def tiny(cls, **changes: Any) -> Settings:
        """Sizes small enough for a test (the figures are meaningless, the code paths are not)."""
        from dataclasses import replace
        base = cls(dtypes=("fp32", "bf16"), stream_sizes=(64 * 1024, 4 * MiB), gemm_k=256, gemm_n=512,
                   gemm_rows=(1, 8, 64), attn_heads=2, attn_head_dim=32, attn_group=2, attn_decode=((1, 256),),
                   attn_prefill=(64,), reps=3, allreduce=False, step_overhead=False, op_overhead_tokens=6,
                   working_set_bytes=0, vector_prefills=((1, 8), (2, 32)), vector_reps=2, dispatch_hidden=128)
        return replace(base, **changes)


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


@dataclass(kw_only=True)
class Calibration:
    """Everything measured, with where and how."""

    device: dict[str, Any]
    versions: dict[str, str]
    created: str
    settings: Settings
    streams: list[StreamPoint] = field(default_factory=list)
    compute: list[ComputePoint] = field(default_factory=list)
    overhead_s: dict[str, float] = field(default_factory=dict)
    op_overhead_s: dict[str, dict[str, float]] = field(default_factory=dict)  # backend -> operator -> s
    op_overhead_warm_s: dict[str, dict[str, float]] = field(default_factory=dict)  # CPU: without the cold GEMV
    op_e_memory: dict[str, dict[str, list[list[float]]]] = field(default_factory=dict)  # dtype -> op -> [[bytes, e]]
    # CPU: dtype -> backend -> op -> [[rows, seconds]] (the packed GEMM path dispatches differently)
    op_overhead_rows_s: dict[str, dict[str, dict[str, list[list[float]]]]] = field(default_factory=dict)
    step_overhead_s: float = 0.0
    floor_s: dict[str, float] = field(default_factory=dict)  # CUDA: kind -> a tiny kernel's device time
    # CUDA: GEMMs by shape (dtype, m, n, k, seconds) and the shape model's terms fitted on them
    gemm_shapes: list[tuple[str, int, int, int, float]] = field(default_factory=list)
    gemm: dict[str, Any] | None = None
    # CUDA: fused attention (SDPA) by shape and its terms (`llmperf.analysis.attention_eff`) fitted on them
    attention_shapes: list[dict[str, Any]] = field(default_factory=list)
    attention_eff: dict[str, Any] | None = None
    allreduce: list[AllreducePoint] = field(default_factory=list)
    datasheet: HardwareSpec | None = None
    notes: list[str] = field(default_factory=list)

    # ---- the ceilings ---------------------------------------------------------------------------
    def private_cache_bytes(self) -> int:
        """The cores' private caches together (L2 x cores): a model whose weights fit there keeps the
        dispatch state cached between operators (`op_overhead_warm_s` applies)."""
        caches = self.device.get("caches") or {}
        return int(caches.get("L2", 0)) * int(self.device.get("cores", 1) or 1)

    def dram_size_bytes(self) -> int:
        """Buffers at least 4x the last-level cache (or the largest measured) stream from DRAM."""
        caches = self.device.get("caches") or {}
        llc = max(caches.values()) if caches else self.device.get("l2_cache_bytes", 0)
        largest = max(p.size_bytes for p in self.streams)
        return min(largest, 4 * llc) if llc else largest

    def memory_bytes_per_s(self) -> float:
        """The best DRAM-sized stream: read, copy, or the GEMV's weight stream."""
        floor = self.dram_size_bytes()
        best = max((p.bytes_per_s for p in self.streams if p.size_bytes >= floor and p.kind != "add"), default=0.0)
        gemv = max((p.bytes_per_s for p in self.compute if p.op == "matmul" and p.rows == 1), default=0.0)
        return max(best, gemv)

    def copy_bytes_per_s(self) -> float:
        return max((p.bytes_per_s for p in self.streams if p.kind == "copy"
                    and p.size_bytes >= self.dram_size_bytes()), default=0.0)

    def peak_flops_per_s(self, dtype: str) -> float:
        return max((p.flops_per_s for p in self.compute if p.op == "matmul" and p.dtype == dtype), default=0.0)

    def measured_dtypes(self) -> list[str]:
        return [d for d in self.settings.dtypes if self.peak_flops_per_s(d) > 0]

    def interconnect_bytes_per_s(self) -> float:
        return max((p.busbw for p in self.allreduce), default=0.0)

    # ---- the time model ---------------------------------------------------------------------------
    @property
    def overhead_mode(self) -> str:
        """`overlap` on CUDA (asynchronous launches), `add` on CPU (see llmperf.analysis.timemodel)."""
        return "overlap" if self.device.get("kind") == "cuda" else "add"

    def fit_terms(self) -> dict[str, Any]:
        """The `efficiency:` block (see the module docstring for the formulas)."""
        bw = self.memory_bytes_per_s()
        overlap = self.overhead_mode == "overlap"
        dtypes: dict[str, Any] = {}
        add = [p for p in self.streams if p.kind == "add"]
        e_vec = min(1.0, max(p.bytes_per_s for p in add) / bw) if add else 1.0
        for dtype in self.measured_dtypes():
            peak = self.peak_flops_per_s(dtype)
            kinds: dict[str, Any] = {}
            for op in ("matmul", "attention"):
                pts = sorted((p for p in self.compute if p.op == op and p.dtype == dtype), key=lambda p: p.rows)
                if not pts:
                    continue
                oh = self.overhead_s.get(op, 0.0)
                kinds[op] = fit_curves(pts, peak, bw, 0.0 if overlap else oh)
                kinds[op]["overhead_s"] = _clean(oh)
            for kind in VECTOR_KINDS:
                kinds[kind] = dict(e_compute=1.0, e_memory=_clean(e_vec),
                                   overhead_s=_clean(self.overhead_s.get(kind, 0.0)))
                if kind in self.floor_s:
                    kinds[kind]["floor_s"] = _clean(self.floor_s[kind])
            if self.allreduce:
                small = min(self.allreduce, key=lambda p: p.size_bytes)
                kinds["comm"] = dict(e_compute=1.0, e_memory=1.0, overhead_s=_clean(small.seconds))
            dtypes[dtype] = kinds
        # CUDA: 4 with the device floors, 5 with the GEMM and attention shape terms
        schema = 5 if self.gemm or self.attention_eff else 4 if self.floor_s else EFFICIENCY_SCHEMA
        out = dict(schema_version=schema, model="calibrated", step_overhead_s=self.step_overhead_s,
                   source=f"{CALIBRATION_TOOL}, {self.created}", overhead_mode=self.overhead_mode)
        if self.op_overhead_s:
            out["op_overhead_s"] = _clean_ops(self.op_overhead_s)
        if self.op_overhead_warm_s:
            out["op_overhead_warm_s"] = _clean_ops(self.op_overhead_warm_s)
            out["warm_below_bytes"] = self.private_cache_bytes()
        if self.op_overhead_rows_s:
            out["op_overhead_rows_s"] = {
                d: {b: {op: [[int(r), max(_clean(v), 1e-9)] for r, v in pts] for op, pts in ops.items()}
                    for b, ops in backends.items()}
                for d, backends in self.op_overhead_rows_s.items() if d in dtypes}
        if self.op_e_memory:
            out["op_e_memory"] = {d: {op: [[int(b), _clean(e)] for b, e in pts] for op, pts in ops.items()}
                                  for d, ops in self.op_e_memory.items() if d in dtypes}
        if self.gemm:
            out["gemm"] = dict(self.gemm)
        if self.attention_eff:
            out["attention_eff"] = {"default": dict(self.attention_eff)}
        out["dtypes"] = dtypes
        return out

    # ---- the hardware YAML ------------------------------------------------------------------------
    def to_mapping(self, name: str = LOCAL_NAME) -> dict[str, Any]:
        """A hardware mapping `llmperf.specs` loads (HardwareSpec fields + efficiency + calibration)."""
        dev = self.device
        cuda = dev.get("kind") == "cuda"
        ds = self.datasheet
        peaks = {d: _clean(self.peak_flops_per_s(d) / 1e12) for d in self.measured_dtypes()}
        caches = dev.get("caches") or {}
        if cuda:
            sram = ds.sram_per_sm_kib if ds else 228.0
            llc_mib = dev.get("l2_cache_bytes", 0) / MiB or (ds.l2_cache_mib if ds else 1.0)
            units = int(dev.get("sms") or (ds.num_sms if ds else 1))
        else:
            cores = int(dev.get("cores") or 1)
            sram = (caches.get("L1d", 0) + caches.get("L2", 0)) / 1024 or 1.0  # private caches per core
            llc_mib = max(caches.values()) / MiB if caches else 1.0
            units = cores
        return dict(
            name=name, vendor="NVIDIA" if cuda else "cpu",
            variant=str(dev.get("name", "")) if cuda else f"CPU {dev.get('name', '')}",
            source=f"measured by {CALIBRATION_TOOL} on {self.created}",
            peak_tflops=peaks, memory_bandwidth_gbps=_clean(self.memory_bytes_per_s() / 1e9),
            memory_gib=_clean(dev.get("memory_bytes", 0) / 2**30) or 1.0,
            interconnect_gbps=_clean(self.interconnect_bytes_per_s() / 1e9),
            num_sms=units, sram_per_sm_kib=_clean(sram), l2_cache_mib=_clean(llc_mib),
            device_names=[str(dev.get("name", ""))] if dev.get("name") else [],
            efficiency=self.fit_terms(),
            calibration=self.provenance())

    def provenance(self) -> dict[str, Any]:
        ds = self.datasheet
        return dict(
            tool=CALIBRATION_TOOL, schema_version=CALIBRATION_SCHEMA, created=self.created, device=self.device,
            versions=self.versions, threads=self.device.get("threads", 0), settings=_plain(asdict(self.settings)),
            datasheet=None if ds is None else dict(name=ds.name, peak_tflops=dict(ds.peak_tflops),
                                                    memory_bandwidth_gbps=ds.memory_bandwidth_gbps,
                                                    source=ds.source),
            ceilings=dict(memory_gbps=_clean(self.memory_bytes_per_s() / 1e9),
                          copy_gbps=_clean(self.copy_bytes_per_s() / 1e9),
                          peak_tflops={d: _clean(self.peak_flops_per_s(d) / 1e12) for d in self.measured_dtypes()},
                          interconnect_busbw_gbps=_clean(self.interconnect_bytes_per_s() / 1e9)),
            overhead_s={k: _clean(v) for k, v in self.overhead_s.items()},
            op_overhead_s=_clean_ops(self.op_overhead_s),
            op_overhead_model=dict(TINY_SPEC, cache="contiguous", tokens=self.settings.op_overhead_tokens,
                                   cold=(f"a (1,{COLD_GEMM[0]})@({COLD_GEMM[0]},{COLD_GEMM[1]}) fp32 GEMV before each "
                                         "operator" if self.device.get("kind") == "cpu" else "none (GPU: warm host)"),
                                   in_situ=(dict(dispatch_spec(self.settings.dispatch_hidden), cache="contiguous",
                                                 tokens=self.settings.op_overhead_tokens,
                                                 ops="every operator but the weight GEMMs (op_overhead_rows_s, "
                                                     "op_overhead_s)")
                                            if self.settings.dispatch_hidden and self.op_overhead_rows_s else None)),
            step_overhead_s=_clean(self.step_overhead_s),
            floor_s={k: _clean(v) for k, v in self.floor_s.items()},
            gemm_shapes=[dict(dtype=d, m=m, n=n, k=k, seconds=_clean(t)) for d, m, n, k, t in self.gemm_shapes],
            attention_shapes=[{k: _clean(v) if isinstance(v, float) else v for k, v in r.items()}
                              for r in self.attention_shapes],
            op_e_memory_model=dict(VECTOR_SPEC, cache="contiguous",
                                   prefills=[list(p) for p in self.settings.vector_prefills],
                                   reps=self.settings.vector_reps) if self.op_e_memory else None,
            streams=[dict(kind=p.kind, size_bytes=p.size_bytes, gb_per_s=_clean(p.bytes_per_s / 1e9),
                          seconds=_clean(p.seconds), spread_s=_clean(p.spread_s), n=p.n) for p in self.streams],
            compute=[dict(op=p.op, dtype=p.dtype, rows=p.rows, shape=p.shape, seconds=_clean(p.seconds),
                          median_s=_clean(p.typical_s), spread_s=_clean(p.spread_s), n=p.n,
                          tflops_per_s=_clean(p.flops_per_s / 1e12),
                          gb_per_s=_clean(p.bytes_per_s / 1e9)) for p in self.compute],
            allreduce=[dict(backend=p.backend, world=p.world, size_bytes=p.size_bytes, seconds=_clean(p.seconds),
                            busbw_gbps=_clean(p.busbw / 1e9)) for p in self.allreduce],
            notes=list(self.notes))

    def to_spec(self, name: str = LOCAL_NAME) -> HardwareSpec:
        from llmperf.specs.loader import hardware_from_mapping
        return hardware_from_mapping(self.to_mapping(name), origin=name)


MEMORY_BOUND_SHARE = 0.8  # a point whose memory time explains this share of its time is memory-bound


def fit_curves(pts: Sequence[ComputePoint], peak: float, bw: float, overhead: float) -> dict[str, Any]:
    """`e_compute(rows)`, `e_memory(rows)` that reproduce every point `t = max(c / e_c, m / e_m) + overhead`.

    `e_mem0`, the smallest-rows point's bytes / (bw t'), is the streaming efficiency (a GEMV's). A point
    whose memory time at `e_mem0` explains most of its time is memory-bound: its `e_memory` is its own
    bytes / (bw t') and its `e_compute` is only bounded below (compute must not exceed t'), so it takes
    the first compute-bound point's value when that is higher: interpolating a memory-bound point's
    `flops / (peak t')` to more rows would wrongly make those rows compute-bound. A compute-bound point
    gets `e_compute = flops / (peak t')` and `e_memory = e_mem0`. A point marked `memory_bound` (a decode
    attention call: its time is its KV stream, however slow) is memory-bound whatever its time. All
    values are clipped to (0, 1].
    With t' = t - overhead, t the point's typical (median) call (at least half of t: the overhead never
    explains a whole call)."""
    by_rows: dict[int, list[ComputePoint]] = {}
    for p in pts:
        by_rows.setdefault(p.rows, []).append(p)
    rows = sorted(by_rows)

    def t_prime(p: ComputePoint) -> float:  # the typical call, less the overhead
        return max(p.typical_s - overhead, 0.5 * p.typical_s)

    first = by_rows[rows[0]][0]
    e_mem0 = min(1.0, first.bytes / (bw * t_prime(first)))
    ec_floor: dict[int, float] = {}
    em: dict[int, float] = {}
    memory_bound: dict[int, bool] = {}
    for r in rows:
        ps = by_rows[r]
        ec_floor[r] = min(1.0, max(p.flops / (peak * t_prime(p)) for p in ps))
        em[r] = min(1.0, max(e_mem0, max(p.bytes / (bw * t_prime(p)) for p in ps)))
        memory_bound[r] = all(p.memory_bound or p.bytes / (bw * e_mem0) >= MEMORY_BOUND_SHARE * t_prime(p)
                              for p in ps)
    compute_rows = [r for r in rows if not memory_bound[r]]
    ec = {}
    for r in rows:
        if memory_bound[r]:
            later = [ec_floor[c] for c in compute_rows if c > r]
            ec[r] = max(ec_floor[r], later[0]) if later else 1.0
            em[r] = min(1.0, max(p.bytes / (bw * t_prime(p)) for p in by_rows[r]))
        else:
            ec[r] = ec_floor[r]
            em[r] = e_mem0
    return dict(e_compute=[[r, _clean(max(ec[r], 1e-6))] for r in rows],
                e_memory=[[r, _clean(max(em[r], 1e-6))] for r in rows], overhead_s=_clean(overhead))


def _clean(x: float) -> float:
    """Round to 4 significant figures for a readable YAML (the spreads are far wider)."""
    x = float(x)
    return float(f"{x:.4g}") if math.isfinite(x) and x != 0 else x


def _clean_ops(per_backend: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """{backend: {operator: seconds}} with every figure `_clean`ed, for the YAML."""
    return {b: {op: _clean(v) for op, v in ops.items()} for b, ops in per_backend.items()}


def _plain(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def yaml_text(mapping: dict[str, Any]) -> str:
    """The calibration YAML as written (a header saying what it is, then the mapping)."""
    import yaml

    header = ("# Written by `llmperf calibrate`: measured ceilings of this device and the calibrated time\n"
              "# model (efficiency). Use it as `--hardware local` (or pass this path).\n")
    return header + yaml.safe_dump(mapping, sort_keys=False, default_flow_style=None, width=120)


def write_yaml(mapping: dict[str, Any], path: Path | Any, option: str = "--output") -> Path:
    """Write through `llmperf.outputs` (atomically, as `> FILE`). A path's missing folders are created
    (the cache's); `path` may instead be a `FileTarget` the command line checked before measuring."""
    from llmperf.outputs import FileTarget, check_dir, write_file

    if not isinstance(path, FileTarget):
        check_dir(Path(path).parent, option).create()
    write_file(path, yaml_text(mapping), option)
    return Path(path.shown) if isinstance(path, FileTarget) else Path(path)


# ---- the measurements (torch) ----------------------------------------------------------------------


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_streams(s: Settings, device: Any, progress: Progress) -> list[StreamPoint]:
    import torch

    out = []
    for size in s.stream_sizes:
        progress(f"stream {size / MiB:g} MiB")
        n = max(size // 4, 1)
        src = torch.rand(n, device=device)
        dst = torch.empty_like(src)
        for kind, fn, moved in (("read", lambda: src.sum(), 4 * n), ("copy", lambda: dst.copy_(src), 8 * n)):
            t = time_fn(fn, device, reps=s.reps, min_time_s=0.05)
            out.append(StreamPoint(kind=kind, size_bytes=4 * n, bytes_moved=moved, seconds=t.min_s,
                                   spread_s=t.spread_s, n=t.n))
        if size == max(s.stream_sizes):
            t = time_fn(lambda: dst.add_(src), device, reps=s.reps, min_time_s=0.02)  # reads 2, writes 1
            out.append(StreamPoint(kind="add", size_bytes=4 * n, bytes_moved=12 * n, seconds=t.min_s,
                                   spread_s=t.spread_s, n=t.n))
    return out


WORKING_SET_MIN = 512 * MiB  # CPU: at least this much in turn, whatever the caches report


def working_set_for(s: Settings, device: Any) -> int:
    """The bytes a CPU micro-benchmark's large operand cycles through: `s.working_set_bytes` if set,
    else twice the largest cache the CPU reports, and at least `WORKING_SET_MIN`, at most an eighth of
    the memory. Measured here: a (1, 4096) x (4096, 8192) bf16 GEMV (67 MB of weights) ran at
    49 GB/s back to back and 25 GB/s cycling through twelve copies; the engine's decode GEMVs stream
    at 18-25 GB/s (a shared last-level cache of hundreds of MB held the single copy). On CUDA
    `do_bench` already flushes the L2 before every call: 0."""
    if s.working_set_bytes is not None:
        return max(0, int(s.working_set_bytes))
    if getattr(device, "type", str(device)) != "cpu":
        return 0
    from llmperf.measure.device import _total_memory_bytes, cpu_caches

    caches = cpu_caches()
    target = max(WORKING_SET_MIN, 2 * max(caches.values(), default=0))
    memory = _total_memory_bytes()
    return min(target, memory // 8) if memory else target


def copies_for(one_bytes: int, working_set: int, limit: int = 64) -> int:
    """How many copies of an operand of `one_bytes` fill `working_set` (1 .. `limit`)."""
    if working_set <= one_bytes or one_bytes <= 0:
        return 1
    return min(limit, math.ceil(working_set / one_bytes))


def _in_turn(fns: Sequence[Callable[[], Any]]) -> Callable[[], Any]:
    """One call of the next function of `fns`, round robin."""
    if len(fns) == 1:
        return fns[0]
    state = [0]

    def call() -> Any:
        i = state[0]
        state[0] = (i + 1) % len(fns)
        return fns[i]()
    return call


class _Weights:
    """The engine's `x @ W` for one dtype and device, over `copies` weight matrices used in turn (its
    weight layout and, where it packs weights for oneDNN, the packed GEMM of
    `llmperf.engine.ops.ops_for`, packed before timing)."""

    def __init__(self, k: int, n: int, dtype: Any, device: Any, copies: int) -> None:
        import torch

        from llmperf.engine.ops import ops_for

        self.k, self.dtype, self.device = k, dtype, device
        in_out = False  # the engine stores (out, in) on every device
        self.ws = [torch.randn((k, n) if in_out else (n, k), device=device, dtype=dtype) for _ in range(copies)]
        self.linear = ops_for(device, dtype).linear

    def fn(self, rows: int) -> Callable[[], Any]:
        import torch

        x = torch.randn(rows, self.k, device=self.device, dtype=self.dtype)
        for w in self.ws:
            self.linear(x, w)  # packs now (once per weight), outside the timing
        return _in_turn([lambda w=w: self.linear(x, w) for w in self.ws])


ROUND_BELOW_S = 0.02  # CPU GEMM calls faster than this (the memory-bound rows) are timed in rounds
DISTURBED = 1.5  # a point whose median call is this much slower than its fastest was disturbed
RETRIES = 2


def _time_steady(fn: Callable[[], Any], device: Any, *, reps: int, warmup: int, notes: list[str], what: str) -> Any:
    """`time_fn`, timed again (up to `RETRIES` times, the steadiest kept) while the median call is over
    `DISTURBED` x the fastest: on a shared machine one burst of another job's work can land on half the
    calls of a point (a bf16 GEMM at 256 rows: median 21.6 ms, fastest 9.6 ms; timed again, 10.4 ms),
    and the fit reads medians."""
    t = time_fn(fn, device, reps=reps, warmup=warmup)
    for _ in range(RETRIES):
        if t.median_s <= DISTURBED * t.min_s:
            break
        again = time_fn(fn, device, reps=reps, warmup=warmup)
        notes.append(f"{what}: timed again (median {t.median_s * 1e3:.3g} ms, fastest {t.min_s * 1e3:.3g} ms; "
                     f"then {again.median_s * 1e3:.3g} ms)")
        t = min(t, again, key=lambda x: x.median_s / x.min_s)
    return t


WEIGHT_OPS = frozenset(str(op) for op in WEIGHT_MATMUL_OPS)  # the engine's weight GEMMs, by name


def _gemm_path_edges(dname: str, device: Any) -> tuple[int, ...]:
    """`engine.paths.gemm_path_edges` for the dtype named `dname`."""
    import torch

    from llmperf.engine.paths import gemm_path_edges

    return gemm_path_edges(getattr(torch, DTYPE_NAMES[dname]), device)


def sweep_fits(spent_s: float, next_s: float, budget_s: float, call_s: float = 0.0,
               call_budget_s: float = math.inf) -> bool:
    """Whether a sweep that has taken `spent_s` measures its next point, predicted to take `next_s` in
    all (`call_s` a call) from the point before it: within `budget_s` in all and `call_budget_s` a call.
    A sweep's work is sized from what it measured first, so a slow machine or dtype (bf16 without a
    native kernel) measures fewer points instead of running for minutes; every stop is noted."""
    return spent_s + next_s <= budget_s and call_s <= call_budget_s


def sweep_budget_s(s: Settings, dname: str, device: Any, native_s: float) -> float:
    """A dtype's budget for one sweep: `native_s`, or on CPU `s.emulated_budget_s` where the dtype has
    no native kernel (`engine.paths.native_kernel`)."""
    import torch

    from llmperf.engine.paths import native_kernel

    if getattr(device, "type", str(device)) != "cpu" or native_kernel(getattr(torch, DTYPE_NAMES[dname])):
        return native_s
    return min(native_s, s.emulated_budget_s)


def gemm_sweep_rows(s: Settings, dname: str, device: Any) -> tuple[int, ...]:
    """The rows of `dname`'s GEMM sweep: `s.gemm_rows` and both sides of each edge between the engine's
    GEMM paths inside its range (`engine.paths.gemm_path_edges`; fp32 8 and 9 with llmperf's kernels),
    so that the efficiency curve steps where the engine changes kernel instead of blending two
    kernels' speeds over the rows between sweep points (fp32 rows 9-15 had been priced between the
    own GEMM at 8 and oneDNN's at 16)."""
    return tuple(sorted(set(s.gemm_rows) | {r for r in _gemm_path_edges(dname, device) if r < max(s.gemm_rows)}))


def measure_gemm(s: Settings, device: Any, progress: Progress) -> tuple[list[ComputePoint], list[str]]:
    """The GEMM sweep per dtype over `gemm_sweep_rows`. On CPU the calls under `ROUND_BELOW_S` (the
    memory-bound rows) are timed in `s.gemm_rounds` interleaved rounds and pooled (`timers.pooled`): this
    machine's DRAM bandwidth drifts by 10% over a minute, and the decode efficiency of `rows` is the
    ratio of its time to the GEMV's, so both must be measured under the same conditions (the fp32
    4-row GEMM measured 23.4, 28.4 and 25.4 GB/s in three calibrations of one afternoon)."""
    import torch

    out, notes = [], []
    k, n = s.gemm_k, s.gemm_n
    working_set = working_set_for(s, device)
    for dname in s.dtypes:
        dtype = getattr(torch, DTYPE_NAMES[dname])
        elem = torch.empty((), dtype=dtype).element_size()
        copies = copies_for(elem * k * n, working_set)
        reps = max(s.reps, copies)
        weights = None
        timed: dict[int, list[Any]] = {}
        again: dict[int, Callable[[], Any]] = {}
        sweep = gemm_sweep_rows(s, dname, device)
        budget = sweep_budget_s(s, dname, device, s.gemm_sweep_budget_s)
        if budget < s.gemm_sweep_budget_s:
            notes.append(f"gemm {dname}: no native kernel on this CPU"
                         + (" (no AVX512_BF16 or AMX)" if dname == "bf16" else "") + ": torch converts every "
                         f"element, about 10x an fp32 GEMM's time; its sweeps stop at {budget:g} s")
        spent, last = 0.0, None  # seconds of this dtype's sweep so far; (rows, median call) of the last point
        for rows in sweep:
            # a compute-bound point (predicted past ROUND_BELOW_S a call) needs no cycling through the copies
            call_s = last[1] * rows / last[0] if last else 0.0
            heavy = call_s >= ROUND_BELOW_S
            n_calls, warmup = (s.reps, 1) if heavy else (reps, copies)
            if last and not sweep_fits(spent, call_s * (n_calls + warmup), budget, call_s, s.gemm_call_budget_s):
                notes.append(f"gemm {dname}: stopped before rows={rows} (predicted {call_s:.2g} s a call from "
                             f"rows={last[0]}; {spent:.1f} s spent of the sweep's {budget:g} s)")
                break
            progress(f"gemm {dname} rows={rows}")
            started = time.perf_counter()
            try:
                if weights is None:
                    weights = _Weights(k, n, dtype, device, copies)
                fn = weights.fn(rows)
                t = _time_steady(fn, device, reps=n_calls, warmup=warmup, notes=notes,
                                 what=f"gemm {dname} rows={rows}")
            except RuntimeError as exc:  # a dtype this device or build cannot multiply
                notes.append(f"gemm {dname}: not measured ({str(exc).splitlines()[0]})")
                break
            spent += time.perf_counter() - started
            last = (rows, t.median_s)
            timed[rows] = [t]
            if device.type == "cpu" and t.median_s < ROUND_BELOW_S:
                again[rows] = fn
            del fn
        for i in range(1, s.gemm_rounds if len(again) > 1 else 1):
            progress(f"gemm {dname} round {i + 1} of {s.gemm_rounds} (rows {', '.join(map(str, again))})")
            for rows, fn in again.items():
                timed[rows].append(time_fn(fn, device, reps=reps, warmup=1))
        for rows, ts in timed.items():
            t = pooled(ts)
            out.append(ComputePoint(op="matmul", dtype=dname, rows=rows,
                                    shape=f"({rows},{k})@({k},{n})" + (f" x{copies} in turn" if copies > 1 else ""),
                                    seconds=t.min_s, median_s=t.median_s, spread_s=t.spread_s, n=t.n,
                                    flops=2.0 * rows * k * n,
                                    bytes=float(elem * (k * n + rows * k + rows * n))))
        del weights, again
    return out, notes


def measure_attention(s: Settings, device: Any, progress: Progress) -> list[ComputePoint]:
    """Attention per dtype as the engine's `sdpa` backend runs it, with `s.attn_group` query heads per
    KV head: decode (one query per sequence over a KV cache through `attention.sdpa_decode`, llmperf's
    own kernel on a CPU that runs them, else SDPA with the group folded into the query axis; copies
    used in turn to fill the working set, memory-bound by construction) and causal prefill squares
    (SDPA, `enable_gqa`). On this CPU SDPA's folded group read the cache at 17 GB/s in fp32 against
    23-27 GB/s for one query per head (measured 2026-11-23): a calibration with one query per head
    priced the engine's decode attention 1.5x fast. What the engine runs is what is timed."""
    import torch
    import torch.nn.functional as F

    from llmperf.engine.attention import sdpa_decode
    from llmperf.engine.step import StepMeta

    out = []
    H, D, G = s.attn_heads, s.attn_head_dim, s.attn_group
    H_kv = H // G  # `Settings` checked that G divides H
    working_set = working_set_for(s, device)
    for dname in s.dtypes:
        dtype = getattr(torch, DTYPE_NAMES[dname])
        elem = torch.empty((), dtype=dtype).element_size()
        shapes = [(b, 1, t) for b, t in s.attn_decode] + [(1, t, t) for t in s.attn_prefill]
        for batch, q_len, kv_len in shapes:
            progress(f"attention {dname} B={batch} q={q_len} kv={kv_len}")
            decode = q_len == 1
            copies = copies_for(2 * batch * H_kv * kv_len * D * elem, working_set) if decode else 1
            # decode: (B, H, D) through the engine's own decode path; prefill: (B, H, T, D)
            q = torch.randn(*((batch, H, D) if decode else (batch, H, q_len, D)), device=device, dtype=dtype)
            kvs = [(torch.randn(batch, H_kv, kv_len, D, device=device, dtype=dtype),
                    torch.randn(batch, H_kv, kv_len, D, device=device, dtype=dtype)) for _ in range(copies)]
            if decode:
                meta, scale = StepMeta.decode(batch, kv_len, device), D ** -0.5
                fn = _in_turn([lambda kk=kk, vv=vv: sdpa_decode(q, kk, vv, meta, scale) for kk, vv in kvs])
            else:
                fn = _in_turn([lambda kk=kk, vv=vv: F.scaled_dot_product_attention(q, kk, vv, is_causal=True,
                                                                                   enable_gqa=G > 1)
                               for kk, vv in kvs])
            try:
                t = time_fn(fn, device, reps=max(s.reps, copies), warmup=copies)
            except RuntimeError:
                break
            cost = attention_cost(batch, q_len, kv_len, num_heads=H, num_kv_heads=H_kv, head_dim=D, act_bytes=elem,
                                  kv_bytes=elem, impl="fused", causal=True)
            out.append(ComputePoint(op="attention", dtype=dname, rows=batch * q_len,
                                    shape=f"B={batch} H={H} H_kv={H_kv} q={q_len} kv={kv_len} D={D}"
                                    + (f" x{copies} in turn" if copies > 1 else ""), seconds=t.min_s,
                                    median_s=t.median_s, memory_bound=decode,
                                    spread_s=t.spread_s, n=t.n, flops=float(cost.flops),
                                    bytes=float(cost.bytes_total)))
            del fn, kvs
    return out


def _per_call_s(fn: Callable[[], Any], device: Any, calls: int = 200, rounds: int = 7) -> float:
    """Mean time of back-to-back calls (what an eager engine pays per operator), median over rounds."""
    import statistics
    import time

    fn()
    _sync(device)
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        _sync(device)
        samples.append((time.perf_counter() - t0) / calls)
    return statistics.median(samples)


def measure_overheads(device: Any, progress: Progress) -> dict[str, float]:
    """Dispatch / launch cost of a tiny operator of each kind (1 row, width 64)."""
    import torch
    import torch.nn.functional as F

    from llmperf.engine.attention import sdpa_decode
    from llmperf.engine.step import StepMeta

    progress("tiny-operator overhead")
    x = torch.randn(1, 64, device=device)
    w = torch.randn(64, 64, device=device)
    y = torch.randn(1, 64, device=device)
    q = torch.randn(1, 1, 64, device=device)
    kv = torch.randn(1, 1, 8, 64, device=device)
    meta = StepMeta.decode(1, 8, device)
    table = torch.randn(256, 64, device=device)
    ids = torch.zeros(1, 1, dtype=torch.long, device=device)
    nw = torch.ones(64, device=device)

    def rmsnorm() -> Any:  # the engine's RMSNorm: square, mean, rsqrt, scale, weight
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * nw

    return dict(matmul=_per_call_s(lambda: torch.matmul(x, w), device),
                attention=_per_call_s(lambda: sdpa_decode(q, kv, kv, meta, 0.125), device),  # the engine's decode
                elementwise=_per_call_s(lambda: y.add_(x), device),
                norm=_per_call_s(rmsnorm, device),
                embedding=_per_call_s(lambda: F.embedding(ids, table), device))


#: CUDA: the (N, K) of the shape sweep: Llama-3-8B's projections and Llama-3-70B's at TP 8 (narrow K / N)
GEMM_SHAPE_NK = ((4096, 4096), (28672, 4096), (4096, 14336), (1280, 8192), (8192, 1024))
GEMM_SHAPE_ROWS = (1, 8, 32, 128, 512, 2048, 8192)


def measure_gemm_shapes(dtypes: Sequence[str], device: Any, progress: Progress
                        ) -> list[tuple[str, int, int, int, float]]:
    """CUDA: `F.linear` over real projections' shapes and rows 1 .. 8192 per measured 16-bit dtype
    (`triton.testing.do_bench`, L2 flushed): what the GEMM shape model (`llmperf.analysis.gemm`) is
    fitted on for this device."""
    import torch

    from llmperf.measure.gpu_terms import _bench_s

    out = []
    for dname in (d for d in dtypes if d in ("bf16", "fp16")):
        dt = getattr(torch, DTYPE_NAMES[dname])
        for n, k in GEMM_SHAPE_NK:
            progress(f"GEMM shapes {dname} {n}x{k}")
            w = torch.randn(n, k, device=device, dtype=dt) * 0.02
            for m in GEMM_SHAPE_ROWS:
                x = torch.randn(m, k, device=device, dtype=dt)
                out.append((dname, m, n, k, _bench_s(lambda: torch.nn.functional.linear(x, w))))
            w = None  # freed now (a `del` would unbind what the timed lambdas close over)
    return out


def fit_gemm_shapes(cal: Calibration) -> dict[str, Any] | None:
    """The GEMM shape model's terms fitted on `cal.gemm_shapes` against the ceilings the calibration
    measured (its peak per dtype, its bandwidth, the device's SMs); None without points."""
    if not cal.gemm_shapes:
        return None
    import numpy as np
    import pandas as pd

    from llmperf.measure.fit_gemm import fit
    from llmperf.specs.precision import dtype_bytes

    df = pd.DataFrame(cal.gemm_shapes, columns=["dtype", "m", "n", "k", "time_s"]).assign(groups=1.0)
    peak = np.array([cal.peak_flops_per_s(d) for d in df["dtype"]])
    sms = float(cal.device.get("sms") or (cal.datasheet.num_sms if cal.datasheet else 1))
    devices = (peak, np.full(len(df), cal.memory_bytes_per_s()), np.full(len(df), sms),
               np.array([dtype_bytes(d) for d in df["dtype"]]))
    params = fit(df, devices, source=f"{CALIBRATION_TOOL}, {cal.created}: F.linear over "
                                     f"{len(GEMM_SHAPE_NK)} shapes x {len(GEMM_SHAPE_ROWS)} row counts")
    return params.to_dict()


def measure_attention_shapes(device: Any, progress: Progress) -> list[dict[str, Any]]:
    """CUDA: SDPA (bf16, causal prefill and one-token decode) over head dims 64 and 128, MHA and 4
    query heads per KV head, contexts 512-32k and batches 1-64 (`llmperf.measure.gpu_terms`): what the
    fused-attention shape model (`llmperf.analysis.attention_eff`) is fitted on for this device."""
    import torch
    import torch.nn.functional as F

    from llmperf.measure.gpu_terms import _bench_s

    out: list[dict[str, Any]] = []
    heads, bf16 = 32, torch.bfloat16
    for hd in (64, 128):
        progress(f"attention shapes, head dim {hd}")
        for kvh in (32, 8):
            for phase, batch, ctx in ([("prefill", 1, c) for c in (512, 2048, 8192)]
                                      + [("decode", b, c) for b in (1, 8, 64) for c in (512, 4096, 32768)]):
                q_len = ctx if phase == "prefill" else 1
                if batch * ctx * kvh * hd * 4 > 8e9:  # K + V over 8 GB
                    continue
                q = torch.randn(batch, heads, q_len, hd, device=device, dtype=bf16)
                k = torch.randn(batch, kvh, ctx, hd, device=device, dtype=bf16)
                v = torch.randn_like(k)
                t = _bench_s(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=phase == "prefill",
                                                                    enable_gqa=True))
                out.append(dict(phase=phase, batch=batch, q_len=q_len, context=ctx, heads=heads, kv_heads=kvh,
                                head_dim=hd, dtype="bf16", impl="sdpa", time_s=t))
                q = k = v = None  # freed now (a `del` would unbind what the timed lambdas close over)
    return out


def fit_attention_shapes(cal: Calibration) -> dict[str, Any] | None:
    """The fused-attention shape model's terms fitted on `cal.attention_shapes` against the calibration's
    own ceilings (bf16 peak, bandwidth, SMs); None without points."""
    if not cal.attention_shapes or cal.peak_flops_per_s("bf16") <= 0:
        return None
    import pandas as pd

    from llmperf.measure.fit_attention import fit, sweep_frame

    sms = int(cal.device.get("sms") or (cal.datasheet.num_sms if cal.datasheet else 132))
    df = sweep_frame(pd.DataFrame(cal.attention_shapes), "calibrate")
    terms = fit(df, (cal.peak_flops_per_s("bf16"), cal.memory_bytes_per_s(), sms)).to_dict()
    return dict(terms, source=f"{CALIBRATION_TOOL}, {cal.created}: SDPA over {len(df)} shapes")


def measure_floors(device: Any, progress: Progress) -> dict[str, float]:
    """CUDA: a kernel's minimum DEVICE time per vector kind (`floor_s`, efficiency schema 4): one-row
    operators at a real width (4096, bf16) replayed 20 to a CUDA graph, so no launch gap is counted
    (`llmperf.measure.gpu_terms`). The engine's RMSNorm is its five kernels; a fused one is faster."""
    import torch
    import torch.nn.functional as F

    from llmperf.measure.gpu_terms import _graph_time_s

    progress("kernel device floors (CUDA graph)")
    x = torch.randn(1, 4096, device=device, dtype=torch.bfloat16)
    y = torch.randn_like(x)
    w = torch.ones(4096, device=device, dtype=torch.bfloat16)
    table = torch.randn(1024, 4096, device=device, dtype=torch.bfloat16)
    ids = torch.zeros(1, dtype=torch.long, device=device)
    return dict(elementwise=_graph_time_s(torch, lambda: x + y, copies=20),
                norm=_graph_time_s(torch, lambda: F.rms_norm(x, (4096,), w, 1e-6), copies=20),
                embedding=_graph_time_s(torch, lambda: F.embedding(ids, table), copies=20))


#: On a CPU, every operator of a real decode step dispatches right after a weight matrix streamed
#: through the caches, which evicts the interpreter's and the framework's dispatch state: measured on
#: the 2-core development machine, the engine's RMSNorm at (4, 1024) fp32 took 14 us back to back but
#: 95 us (1 thread) to 198 us (2 threads) right after a (4,1024)@(1024,7168) GEMM, and 76-117 us after
#: reading 32 MB. So the tiny model's operators are each timed right after such a GEMM (outside the
#: timed region), as `do_bench` flushes a GPU's L2 before each call. A GPU engine's host never streams
#: the weights, so CUDA runs keep warm host caches.
COLD_GEMM = (1024, 8192)  # (K, N) of the fp32 GEMV before each operator: 32 MiB of weights, two of them


def _cold_caches(device: Any) -> Callable[[], Any] | None:
    """The hook a CPU recorder runs before each operator: a GEMV over one of two 32 MiB weight matrices
    in turn (at the calibration's threads, like the engine's own projections)."""
    import itertools

    import torch

    if device.type != "cpu":
        return None
    k, n = COLD_GEMM
    x = torch.randn(1, k)
    weights = itertools.cycle([torch.randn(k, n), torch.randn(k, n)])
    return lambda: torch.matmul(x, next(weights))


#: the tiny model of the engine measurements: hidden 64, 2 layers (nothing like an evaluated model)
TINY_SPEC = dict(name="calibrate-tiny", vocab_size=256, hidden_size=64, num_layers=2, num_heads=4,
                 num_kv_heads=2, ffn_size=128, max_positions=256)


def op_overhead_backends(device: Any) -> tuple[str, ...]:
    """The attention backends whose operator overheads are measured: Triton only where it is timed."""
    return ("sdpa", "naive", "triton") if device.type == "cuda" else ("sdpa", "naive")


def measure_op_overheads(s: Settings, device: Any, progress: Progress, *, cold: bool = True,
                         dtype: str | None = None, batch: int = 1, spec: dict[str, Any] | None = None,
                         model: Any = None) -> dict[str, dict[str, float]]:
    """Per attention backend, the median time of one call of each engine operator over the decode
    steps of a recorded greedy generation of `batch` sequences at `dtype` (default: bf16 on CUDA,
    fp32 on CPU; per layer for per-layer operators) by the model `spec` (default: the tiny model); on
    a CPU with `cold`, each operator right after a 32 MiB GEMV (`_cold_caches`). `model`: that model
    already built at `dtype`, run by every backend's engine (default: one built per backend)."""
    import statistics
    from collections import defaultdict

    import torch

    from llmperf.engine import Engine, Recorder, SamplingParams, build_model
    from llmperf.specs import ModelSpec

    spec = ModelSpec(**(spec or TINY_SPEC))
    before_op = _cold_caches(device) if cold else None
    dtype = dtype or ("bf16" if device.type == "cuda" else "fp32")
    out: dict[str, dict[str, float]] = {}
    prompt = [[1, 2, 3, 4]] * batch
    params = SamplingParams(max_new_tokens=s.op_overhead_tokens, min_new_tokens=s.op_overhead_tokens)
    for backend in op_overhead_backends(device):
        progress(f"operator overheads ({spec.name}, {backend}{', cold caches' if before_op else ''})")
        try:
            net = model or build_model(spec, seed=0, dtype=dtype, device=device, attention=backend)
            engine = Engine(net, cache="contiguous", attention=backend)
            engine.generate(prompt, params)  # warm-up: the same lengths, so every kernel is compiled
            rec = Recorder(device, before_op=before_op)
            with gc_paused():  # as profile times the engine: no garbage collection inside a timed operator
                engine.generate(prompt, params, recorder=rec)
        except Exception:  # noqa: BLE001 - a backend this build cannot run keeps the per-kind figures (noted)
            continue
        samples: dict[str, list[float]] = defaultdict(list)
        for r in rec.trace.ops:
            if r.phase == "decode":
                samples[r.op].append(r.seconds)
        out[backend] = {op: float(statistics.median(v)) for op, v in samples.items()}
        del engine, net
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return out


#: the model whose recorded prefills measure the engine's vector operators at size (hidden 512, one
#: layer: nothing like an evaluated model; its GEMMs are small, so a 32 x 1024 prefill takes a second)
VECTOR_SPEC = dict(name="calibrate-vector", vocab_size=256, hidden_size=512, num_layers=1, num_heads=4,
                   num_kv_heads=2, ffn_size=1536, max_positions=2048)


def fit_op_e_memory(samples: dict[str, list[tuple[float, float]]], bw: float, overheads: dict[str, float]
                    ) -> dict[str, list[list[float]]]:
    """Per operator, `[[bytes, e_memory], ...]` from (bytes of one call, typical seconds) samples:
    `e = bytes / (bw (t - overhead))`, 1 where the memory roof at full bandwidth explains the call
    (a call no slower than its dispatch), clipped to (1e-4, 1]; one point per byte count (the best)."""
    out: dict[str, list[list[float]]] = {}
    for op, pts in samples.items():
        best: dict[int, float] = {}
        for nbytes, seconds in pts:
            if nbytes <= 0:
                continue
            t = seconds - overheads.get(op, 0.0)
            e = 1.0 if t <= nbytes / bw else max(nbytes / (bw * t), 1e-4)
            key = max(1, int(nbytes))
            best[key] = max(best.get(key, 0.0), e)
        if best:
            out[op] = [[b, best[b]] for b in sorted(best)]
    return out


def measure_op_e_memory(s: Settings, device: Any, progress: Progress, dtypes: Sequence[str], bw: float,
                        overheads: dict[str, dict[str, float]], notes: list[str] | None = None
                        ) -> dict[str, dict[str, list[list[float]]]]:
    """Per compute dtype, the memory efficiency of each engine vector operator (norms, RoPE, the gated
    activation, residual adds, the KV write, the embedding) as a function of the bytes one call moves:
    the median time of each operator over `vector_reps` recorded prefills of `VECTOR_SPEC` at each
    (batch, prompt) of `s.vector_prefills`, less its dispatch overhead, against the analytical bytes
    of the same call (`llmperf.analysis.operators`, the engine's fused GEMMs). `overheads`: per dtype,
    the dispatch the time model adds to each operator (none for a dtype it lacks). The prefills of a
    dtype stop before one predicted to take them past `s.vector_budget_s` (noted in `notes`)."""
    import statistics
    from collections import defaultdict

    from llmperf.analysis.operators import ForwardModel
    from llmperf.analysis.timemodel import BYTES_CURVE_OPS
    from llmperf.engine import Engine, Recorder, SamplingParams, build_model
    from llmperf.specs import ModelSpec, Precision

    spec = ModelSpec(**VECTOR_SPEC)
    params = SamplingParams(max_new_tokens=1)
    notes = [] if notes is None else notes
    out: dict[str, dict[str, list[list[float]]]] = {}
    for dname in dtypes:
        try:
            engine = Engine(build_model(spec, seed=0, dtype=dname, device=device), cache="contiguous")
        except (RuntimeError, ValueError):
            continue
        fm = ForwardModel(model=spec, precision=Precision.uniform(dname), fused_qkv=True, fused_gate_up=True)
        samples: dict[str, list[tuple[float, float]]] = defaultdict(list)
        spent, last = 0.0, None  # seconds of this dtype's prefills so far; (tokens, warm-up seconds) of the last
        budget = sweep_budget_s(s, dname, device, s.vector_budget_s)
        for batch, prompt_len in s.vector_prefills:
            # a prefill's time grows about linearly in its tokens (a little faster: attention)
            one_s = last[1] * batch * prompt_len / last[0] if last else 0.0
            if last and not sweep_fits(spent, one_s * (1 + s.vector_reps), budget):
                notes.append(f"vector operators {dname}: stopped before {batch}x{prompt_len} (predicted "
                             f"{one_s:.2g} s a prefill; {spent:.1f} s spent of {budget:g} s)")
                break
            progress(f"vector operators {dname} {batch}x{prompt_len}")
            prompts = [[1 + (7 * i + j) % (spec.vocab_size - 1) for j in range(prompt_len)] for i in range(batch)]
            started = time.perf_counter()
            engine.generate(prompts, params)  # warm-up: the same shapes
            last = (batch * prompt_len, time.perf_counter() - started)
            times: dict[str, list[float]] = defaultdict(list)
            for _ in range(s.vector_reps):
                rec = Recorder(device)
                with gc_paused():
                    engine.generate(prompts, params, recorder=rec)
                for r in rec.trace.ops:
                    if r.phase == "prefill" and r.op in BYTES_CURVE_OPS:
                        times[r.op].append(r.seconds)
            spent += time.perf_counter() - started
            costs = {c.name: c for c in fm.forward_ops(batch, prompt_len, prompt_len)}  # one layer: one call each
            for op, ts in times.items():
                if op in costs:
                    samples[op].append((float(costs[op].bytes_total), float(statistics.median(ts))))
        del engine
        out[dname] = fit_op_e_memory(samples, bw, overheads.get(dname, {}))
    return out


def dispatch_spec(hidden: int) -> dict[str, Any]:
    """The model whose recorded decode gives a CPU's in-situ dispatch (`Settings.dispatch_hidden`): 2
    layers with Llama 3.2 1B's shapes at hidden 2048 (FFN 4x, heads of 64, 4 query heads per KV
    head), vocabulary 256. Nothing like an evaluated model."""
    heads = max(hidden // 64, 1)
    return dict(name="calibrate-dispatch", vocab_size=256, hidden_size=hidden, num_layers=2, num_heads=heads,
                num_kv_heads=max(heads // 4, 1), ffn_size=4 * hidden, max_positions=256)


def in_situ(cold: dict[str, dict[str, float]], situ: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per backend, the weight GEMMs' dispatch from `cold` (the tiny model, a GEMV before each) and
    every other operator's from `situ` (a real layer's decode) where it was measured."""
    return {backend: {op: (v if op in WEIGHT_OPS else situ.get(backend, {}).get(op, v)) for op, v in ops.items()}
            for backend, ops in cold.items()}


def _in_situ_overheads(s: Settings, device: Any, progress: Progress, dname: str, notes: list[str] | None
                       ) -> dict[int, dict[str, dict[str, float]]]:
    """Per rows of `OVERHEAD_ROWS`, the operators' dispatch in `dispatch_spec`'s decode at `dname`
    ({} when `s.dispatch_hidden` is 0, or when the model cannot be built: noted, the cold figures stand)."""
    if not s.dispatch_hidden:
        return {}
    from llmperf.engine import build_model
    from llmperf.specs import ModelSpec

    spec = dispatch_spec(s.dispatch_hidden)
    try:
        model = build_model(ModelSpec(**spec), seed=0, dtype=dname, device=device)
    except (RuntimeError, ValueError, MemoryError) as exc:
        if notes is not None:
            notes.append(f"in-situ dispatch {dname}: not measured ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}); every operator keeps the cold figure")
        return {}
    return {rows: measure_op_overheads(s, device, progress, cold=False, dtype=dname, batch=rows, spec=spec,
                                       model=model) for rows in OVERHEAD_ROWS}


OVERHEAD_ROWS = (1, 2)  # decoding one and two sequences; weight GEMMs add their path edges (gemm_dispatch_rows)
OVERHEAD_DTYPES = ("fp32", "bf16")  # the CPU dtypes whose GEMM path differs (fp16 is never packed)


def gemm_dispatch_rows(dname: str, device: Any) -> tuple[int, ...]:
    """The rows at which `calibrate` times a weight GEMM's dispatch for the engine at `dname`: 1 and 2
    (`OVERHEAD_ROWS`, decoding one and two sequences) and both sides of every edge between the
    engine's GEMM paths (`engine.paths.gemm_path_edges`): fp32 with llmperf's kernels 1, 2, 8, 9 (its
    own GEMM to 8 rows, oneDNN's packed one from 9), bf16 1, 2, 4, 5 (1, 2, 3, 16, 17 on an AMX CPU:
    its own GEMM to 2 rows, AMX 3-16, oneDNN from 17); with torch's kernels alone
    fp32 1, 2 (the GEMV, then packed) and bf16 1, 2 (always packed)."""
    return tuple(sorted(set(OVERHEAD_ROWS) | set(_gemm_path_edges(dname, device))))


def measure_op_overhead_rows(s: Settings, device: Any, progress: Progress, fp32_rows1: dict[str, dict[str, float]],
                             notes: list[str] | None = None) -> dict[str, dict[str, dict[str, list[list[float]]]]]:
    """CPU: each engine operator's dispatch per compute dtype (fp32, bf16) and per rows, as
    `[[rows, seconds], ...]`: the weight GEMMs cold (the tiny model, a 32 MiB GEMV before each;
    `fp32_rows1` is the fp32 one-sequence run already made) at `gemm_dispatch_rows` (1, 2 and each side of
    every edge between the engine's GEMM paths, so that a batch is priced with the path it runs),
    every other operator at 1 and 2 rows in situ (`dispatch_spec`'s decode, unless `s.dispatch_hidden`
    is 0). Measured 2026-11-23 on the 2-core CPU: a projection took 38 us at one fp32 row (torch's
    matrix-vector kernel) and 123 us at two (oneDNN's packed GEMM), bf16 about 130 us at any rows
    (packed); llmperf's own GEMM 72-84 us at one bf16 row."""
    out: dict[str, dict[str, dict[str, list[list[float]]]]] = {}
    for dname in OVERHEAD_DTYPES:
        if dname not in s.dtypes:
            continue
        all_rows = gemm_dispatch_rows(dname, device)
        runs = {}
        for rows in all_rows:
            if dname == "fp32" and rows == 1 and fp32_rows1:
                runs[rows] = fp32_rows1
                continue
            progress(f"operator overheads ({dname}, {rows} row{'s' if rows > 1 else ''}, cold caches)")
            runs[rows] = measure_op_overheads(s, device, progress, dtype=dname, batch=rows)
        for rows, situ in _in_situ_overheads(s, device, progress, dname, notes).items():
            runs[rows] = in_situ(runs[rows], situ)
        table: dict[str, dict[str, list[list[float]]]] = {}
        for backend in runs[all_rows[0]]:
            ops = set.intersection(*(set(runs[r].get(backend, {})) for r in all_rows))
            table[backend] = {op: [[r, runs[r][backend][op]] for r in (all_rows if op in WEIGHT_OPS else OVERHEAD_ROWS)]
                              for op in sorted(ops)}
        out[dname] = table
    return out


def measure_step_overhead(device: Any, progress: Progress) -> float:
    """Host time of an engine decode step outside its forward pass (sampling, cache bookkeeping),
    median over the steps of a tiny model's greedy generation."""
    import statistics

    from llmperf.engine import Engine, Recorder, SamplingParams, build_model
    from llmperf.specs import ModelSpec

    progress("engine step overhead")
    spec = ModelSpec(**TINY_SPEC)
    engine = Engine(build_model(spec, seed=0, device=device), cache="contiguous")
    engine.generate([[1, 2, 3, 4]], SamplingParams(max_new_tokens=4))  # warm-up
    rec = Recorder(device, ops=False)
    with gc_paused():
        engine.generate([[1, 2, 3, 4]], SamplingParams(max_new_tokens=32), recorder=rec)
    gaps = [st.seconds - st.forward_seconds for st in rec.trace.steps if st.phase == "decode"]
    return max(statistics.median(gaps), 0.0) if gaps else 0.0


def _allreduce_worker(rank: int, world: int, backend: str, sizes: Sequence[int], init_file: str,
                      result_file: str) -> None:  # pragma: no cover - runs in spawned processes
    import time

    import torch
    import torch.distributed as dist

    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
        if backend == "nccl":
            torch.cuda.set_device(device)
        results = []
        for size in sizes:
            buf = torch.ones(size // 4, device=device)
            for _ in range(3):
                dist.all_reduce(buf)
            reps = 20 if size <= MiB else 5
            times = []
            for _ in range(reps):
                dist.barrier()
                _sync(device)
                t0 = time.perf_counter()
                dist.all_reduce(buf)
                _sync(device)
                times.append(time.perf_counter() - t0)
            times.sort()
            results.append(dict(size_bytes=size, seconds=times[len(times) // 2]))
        if rank == 0:
            Path(result_file).write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def measure_allreduce(s: Settings, device: Any, progress: Progress) -> list[AllreducePoint]:
    """All-reduce between `world` processes: NCCL over every CUDA device (needs two), gloo over two
    CPU processes."""
    import torch
    import torch.multiprocessing as mp

    if device.type == "cuda":
        world, backend = torch.cuda.device_count(), "nccl"
        if world < 2:
            return []
    else:
        world, backend = 2, "gloo"
    progress(f"all-reduce ({backend}, {world} processes)")
    with tempfile.TemporaryDirectory() as tmp:
        init_file, result_file = os.path.join(tmp, "init"), os.path.join(tmp, "result.json")
        mp.spawn(_allreduce_worker, args=(world, backend, list(s.allreduce_sizes), init_file, result_file),
                 nprocs=world, join=True)
        rows = json.loads(Path(result_file).read_text())
    return [AllreducePoint(backend=backend, world=world, size_bytes=r["size_bytes"], seconds=r["seconds"])
            for r in rows]


def calibrate(settings: Settings | None = None, *, progress: Progress | None = None) -> Calibration:
    """Measure the device `settings.device` names (see the module docstring)."""
    import torch

    s = settings or Settings()
    device = torch.device(s.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device: cuda requested but torch sees no CUDA device")
    tick = progress or (lambda msg: None)
    previous_threads = torch.get_num_threads()
    if s.threads is not None:
        if s.threads < 1:
            raise ValueError(f"--threads: must be a positive integer, got {s.threads}")
        torch.set_num_threads(s.threads)
    try:
        return _calibrate(s, device, tick)
    finally:
        torch.set_num_threads(previous_threads)


def _calibrate(s: Settings, device: Any, tick: Progress) -> Calibration:
    import torch

    from llmperf.specs import match_hardware

    dev = describe(device)
    cal = Calibration(device=dev, versions=versions(), settings=s,
                      created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    if device.type == "cuda":
        cal.datasheet = match_hardware(dev["name"])
    with torch.inference_mode():
        cal.streams = measure_streams(s, device, tick)
        gemm, notes = measure_gemm(s, device, tick)
        cal.compute = gemm + measure_attention(s, device, tick)
        cal.notes += notes
        cal.overhead_s = measure_overheads(device, tick)
        if device.type == "cuda":
            cal.floor_s = measure_floors(device, tick)
            cal.gemm_shapes = measure_gemm_shapes(cal.measured_dtypes(), device, tick)
            cal.gemm = fit_gemm_shapes(cal)
            cal.attention_shapes = measure_attention_shapes(device, tick)
            cal.attention_eff = fit_attention_shapes(cal)
    if s.step_overhead:
        cal.step_overhead_s = measure_step_overhead(device, tick)
    if s.op_overhead:
        with torch.inference_mode():
            cal.op_overhead_s = measure_op_overheads(s, device, tick)
            if device.type == "cpu":
                cal.op_overhead_warm_s = measure_op_overheads(s, device, tick, cold=False)
                cal.op_overhead_rows_s = measure_op_overhead_rows(s, device, tick, cal.op_overhead_s, cal.notes)
                fp32 = cal.op_overhead_rows_s.get("fp32", {})
                if fp32:  # the per-operator fallback: fp32, one row, as the rows table has it
                    cal.op_overhead_s = {b: {op: pts[0][1] for op, pts in ops.items()} for b, ops in fp32.items()}
        missing = [b for b in op_overhead_backends(device) if b not in cal.op_overhead_s]
        if missing:
            cal.notes.append(f"operator overheads not measured for {', '.join(missing)}: the per-kind figures apply")
    if s.vector_prefills and cal.measured_dtypes():
        with torch.inference_mode():
            # CPU: dispatch is serial with the work, so it comes off each call (the figure a prefill is
            # priced with: its dtype's, at the most rows measured); CUDA: event times are device time
            overheads = {}
            if device.type == "cpu":
                rows_s = cal.op_overhead_rows_s
                overheads = {d: {op: pts[-1][1] for op, pts in rows_s.get(d, {}).get("sdpa", {}).items()}
                             or cal.op_overhead_s.get("sdpa", {}) for d in cal.measured_dtypes()}
            cal.op_e_memory = measure_op_e_memory(s, device, tick, cal.measured_dtypes(), cal.memory_bytes_per_s(),
                                                  overheads, cal.notes)
    if s.allreduce:
        try:
            cal.allreduce = measure_allreduce(s, device, tick)
            if not cal.allreduce:
                cal.notes.append("all-reduce not measured: one CUDA device (NCCL needs two or more)")
        except Exception as exc:  # noqa: BLE001 - a sandbox without sockets/shm still calibrates the rest
            cal.notes.append(f"all-reduce not measured ({type(exc).__name__}: {str(exc).splitlines()[0]})")
    if not cal.measured_dtypes():
        raise ValueError(f"--dtypes: no GEMM could be timed for {', '.join(s.dtypes)}")
    return cal


