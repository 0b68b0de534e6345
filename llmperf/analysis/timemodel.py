"""The calibrated time model: how long an operator really takes on a device, not only its roofline.

    time = max(flops / (peak * e_compute), bytes / (bandwidth * e_memory)) + overhead_s   (mode "add")
    time = max(flops / (peak * e_compute), bytes / (bandwidth * e_memory), overhead_s)   (mode "overlap")

`peak` and `bandwidth` come from the `HardwareSpec` (datasheet figures, or the ceilings `llmperf
calibrate` measured). The efficiencies (fractions of those roofs, in (0, 1]) and the host overhead
depend on the operator's kind, name and `rows` (tokens through it, `batch * q_len`), never on the
context length, so every decode step's time stays a maximum of lines in the context and the sum over
a generation keeps its closed form (`llmperf.analysis.rollup.sum_max_lines`).

Three models (`--efficiency`, `time_model_for`): `roofline` (e = 1, no overhead), `typical`
(published and fitted fractions for GPUs, `models_spec/efficiency/typical.yaml`, each figure cited
there) and `calibrated` (the `efficiency:` block `llmperf calibrate` writes into a hardware YAML), all
`EfficiencyTimeModel`s. Beyond the kinds' curves over rows, a model may carry per-operator overheads
(`op_overhead_s`, `op_overhead_rows_s`), memory efficiencies (`op_e_memory`) and device floors
(`floor_s`, `op_floor_s`); GEMM shape terms (`gemm:`, priced by `llmperf.analysis.gemm`) and fused
attention terms (`attention_eff:`, `llmperf.analysis.attention_eff`); on a CPU, decode attention's cost
per byte as a line in its query-head group (`decode_attention:`, additive, not a max of roofs).
`EngineProfile` (`models_spec/engines/`, `load_engine`) replaces the host terms with a serving engine's on a GPU.

An efficiency curve is a list of `[rows, value]` points interpolated linearly in log(rows) and held
flat beyond its ends. Why each term exists and how it combines with the others: docs/time-models.md.
Pure Python + numpy (no torch), like the rest of `llmperf.analysis`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from llmperf.analysis.attention_eff import AttentionEfficiency
from llmperf.analysis.collectives import Collectives, latency_share, load_collectives
from llmperf.analysis.gemm import GemmParams, GemmShape, gemm_time_for
from llmperf.analysis.roofline import MATRIX_KINDS, Efficiency, Number, OpCost, peak_for
from llmperf.errors import SpecError
from llmperf.specs import HardwareSpec
from llmperf.specs import efficiency as _schema
from llmperf.specs.efficiency import (  # noqa: F401  (the efficiency block's schema, read in specs; re-exported)
    BACKENDS,
    BYTES_CURVE_OPS,
    EFFICIENCY_SCHEMA,
    OP_KINDS,
    OVERHEAD_MODES,
    READABLE_SCHEMAS,
    Curve,
    DecodeGroupTerms,
    GemmBytesCurves,
    KindTerms,
    check_seconds,
    parse_kinds,
    parse_op_e_memory,
    parse_op_floors,
    parse_op_overhead_rows,
    parse_op_overheads,
)

TIME_MODELS = ("roofline", "typical", "calibrated")


def _rows_of(cost: OpCost, rows: Number | None) -> Number:
    """`rows`, else the cost's own rows; 1 where neither says (an efficiency curve starts at 1 row)."""
    if rows is None:
        rows = getattr(cost, "rows", None)
    return 1.0 if rows is None or np.all(np.asarray(rows) == 0) else rows


def _group_rows(shape: GemmShape, rows: Number) -> Number:
    """The rows of each group's GEMM of `shape` (a routed expert's share; at least 1) at `rows`."""
    return np.maximum(np.asarray(shape.m(rows), dtype=float), 1.0)


#: how an engine launches a MoE layer's routed-expert GEMMs (`EfficiencyTimeModel.expert_launches`)
EXPERT_LAUNCHES = ("grouped", "per_expert")

#: `gemm_e_memory` curves whose largest rows reach this price the GEMMs past them at the FLOP rate their
#: weight reached there; curves that stop at decode rows leave those GEMMs to the matmul kind's curves
GEMM_TOP_ROWS_MIN = 64

_UNIT = KindTerms(e_compute=Curve(((1.0, 1.0),)), e_memory=Curve(((1.0, 1.0),)))


@dataclass(frozen=True, kw_only=True)
class EfficiencyTimeModel:
    """A `TimeModel` (see `llmperf.analysis.roofline`): per-kind efficiencies and overheads.

    `name` says which model produced a number ("roofline", "typical" or "calibrated"); `dtype` is the
    compute dtype the terms were measured at; `step_overhead_s` is the host's fixed cost per engine
    step outside the forward pass (sampling, cache bookkeeping), added by whoever prices a step.
    """

    name: str
    kinds: Mapping[str, KindTerms] = field(default_factory=dict, hash=False)
    dtype: str = ""
    step_overhead_s: float = 0.0
    source: str = ""
    op_overhead_s: Mapping[str, float] = field(default_factory=dict, hash=False)  # operator name -> s
    overhead_mode: str = "add"  # "add" (serial host dispatch) or "overlap" (asynchronous launches)
    backend: str = ""  # the attention backend `op_overhead_s` was measured with
    op_e_memory: Mapping[str, Curve] = field(default_factory=dict, hash=False)  # operator -> e_memory(bytes)
    op_overhead_rows: Mapping[str, Curve] = field(default_factory=dict, hash=False)  # operator -> seconds(rows)
    # CPU: the operators' dispatch called one by one (schema 8), for `for_model` to price a model that
    # does not run its decode step in one call, and where one does (most rows, largest head dim; 0: never)
    op_overhead_rows_by_op: Mapping[str, Curve] = field(default_factory=dict, hash=False)
    one_call_rows: int = 0
    one_call_max_head_dim: int = 0
    # CPU: a routed expert's own operators called once per expert (`expert_launches` per_expert), by rows
    op_overhead_rows_expert: Mapping[str, Curve] = field(default_factory=dict, hash=False)
    op_floor_s: Mapping[str, float] = field(default_factory=dict, hash=False)  # operator -> device floor, s
    # collectives priced as latency + bytes / bus bandwidth by GPU count (`typical`); None: the link's bandwidth
    collectives: Collectives | None = field(default=None, hash=False, compare=False)
    # weight GEMMs priced from their shape (`OpCost.gemm`) with these terms; None: by the matmul kind's curves
    gemm: GemmParams | None = None
    # CPU: a weight GEMM's e_memory by rows and weight bytes (calibrated, schema 6-7); None: the kind's curves
    gemm_e_memory: GemmBytesCurves | None = field(default=None, hash=False)
    compute_dtype: str = ""  # the phase's compute dtype this model prices (the GEMM model's peak); "" : fp16
    # fused attention priced by its shape (`OpCost.attn`); None: the attention kind's curves over rows
    attention_eff: AttentionEfficiency | None = None
    # CPU: decode attention's seconds per byte as a line in its query-head group (calibrated, schema 9,
    # `decode_group_efficiency`); None: the attention kind's curves
    decode_attention: DecodeGroupTerms | None = field(default=None, hash=False)
    engine: str = ""  # the engine profile that set the launch and step terms ("" : none, the roofline)
    graph_max_rows: float = 0.0  # steps of up to this many rows replay as a CUDA graph: no host launch
    # how the engine launches a MoE layer's routed-expert GEMMs: "grouped" (one kernel over every expert,
    # vLLM / SGLang / TensorRT-LLM) or "per_expert" (a GEMM call per touched expert: llmperf's own engine,
    # which `calibrate` measures), each call then paying its overhead and floor at its own rows
    expert_launches: str = "grouped"
    # the same model for a prefill (or mixed) step, when the engine prices it differently (`for_phase`)
    prefill: EfficiencyTimeModel | None = field(default=None, hash=False, compare=False)

    def for_phase(self, phase: str) -> EfficiencyTimeModel:
        """This model for a step of `phase`: a decode step as it is, any other step (prefill, mixed,
        verify) with the engine's prefill terms (an eager launch, its own step overhead)."""
        return self if phase == "decode" or self.prefill is None else self.prefill

    def for_model(self, spec: Any, one_call: bool | None = None) -> EfficiencyTimeModel:
        """This model for `spec` as llmperf's CPU engine runs it: a decode step of a model whose layers
        run in one call of its kernels (`ModelSpec.one_call_layers`, a head dim and rows they take, the
        sdpa backend) pays the one call's dispatch (`op_overhead_rows`), every other step (today's
        families, more rows, a prefill or mixed step) each operator's called one by one
        (`op_overhead_rows_by_op`; measured on the 2-core development CPU: an RMSNorm 2 us in the one
        call, 14-20 us one by one). Itself where no one-by-one figures were measured (a GPU, an older
        calibration); the weight GEMMs keep their rows curves either way. `one_call` False: the engine
        runs this model's operators one by one whatever its shape (a tensor-parallel shard); None: by
        the spec."""
        if not self.op_overhead_rows_by_op:
            return self
        fits = (bool(getattr(spec, "one_call_layers", False)) and 0 < spec.head_dim <= self.one_call_max_head_dim
                and one_call is not False)
        n = self.one_call_rows if fits else 0
        by_op = {**self.op_overhead_rows, **self.op_overhead_rows_by_op}
        decode = {op: _joined(self.op_overhead_rows.get(op), c, n) for op, c in self.op_overhead_rows_by_op.items()}
        prefill = replace(self, op_overhead_rows=by_op, op_overhead_rows_by_op={}, prefill=None)
        return replace(self, op_overhead_rows={**self.op_overhead_rows, **decode}, op_overhead_rows_by_op={},
                       prefill=prefill)

    def __post_init__(self) -> None:
        if self.overhead_mode not in OVERHEAD_MODES:
            raise SpecError(f"overhead_mode: must be one of {', '.join(OVERHEAD_MODES)}, got {self.overhead_mode!r}")
        if self.expert_launches not in EXPERT_LAUNCHES:
            raise SpecError(f"expert_launches: must be one of {', '.join(EXPERT_LAUNCHES)}, "
                            f"got {self.expert_launches!r}")

    def terms(self, kind: str) -> KindTerms:
        """The terms of operator kind `kind` (the unit terms, e = 1 and no overhead, for a kind the model does
        not list)."""
        return self.kinds.get(kind, _UNIT)

    @property
    def has_op_overheads(self) -> bool:
        """Whether any operator's overhead is its own (`op_overhead_s` or `op_overhead_rows`)."""
        return bool(self.op_overhead_s or self.op_overhead_rows)

    def per_kind_overheads(self) -> EfficiencyTimeModel:
        """This model with only the per-kind overheads (a micro-benchmark's back-to-back calls pay no
        engine operator's dispatch)."""
        if not self.has_op_overheads:
            return self
        return replace(self, op_overhead_s={}, op_overhead_rows={}, op_overhead_rows_by_op={},
                       op_overhead_rows_expert={}, backend="")

    def overhead_for(self, cost: OpCost, rows: Number | None = None, expert: bool = False) -> tuple[float, str]:
        """The host overhead of one call of `cost` at `rows` (default: `cost.rows`) and where it comes
        from ("op" or "kind"); `expert`: one routed expert's call, which takes `op_overhead_rows_expert`
        where it has the operator."""
        if self.graph_max_rows:  # a CUDA graph replays the step: no kernel pays a host launch
            r = np.asarray(_rows_of(cost, rows), dtype=float)
            if np.all(r <= self.graph_max_rows):
                return 0.0, "graph"
            graph = r <= self.graph_max_rows
            plain = replace(self, graph_max_rows=0.0)
            value, where = plain.overhead_for(cost, rows)
            return np.where(graph, 0.0, value), where
        curve = self.op_overhead_rows_expert.get(cost.name) if expert else None
        curve = curve or self.op_overhead_rows.get(cost.name)
        if curve is not None:
            return curve(_rows_of(cost, rows)), "op"
        if cost.name in self.op_overhead_s:
            return self.op_overhead_s[cost.name], "op"
        return self.terms(cost.kind).overhead_s, "kind"

    def efficiency(self, cost: OpCost, hardware: HardwareSpec | None = None,
                   rows: Number | None = None, peak: float | None = None) -> Efficiency:
        """The efficiencies of `cost` at `rows` (default: `cost.rows`), and its overhead as a serial
        `overhead_s` (mode add) or an overlapped `host_s` (mode overlap). A weight GEMM with a shape
        (`OpCost.gemm`), under a model with `gemm` terms, gets the efficiencies its shape implies
        (`gemm_efficiency`, relative to `peak`: default the one `op_time` uses)."""
        t = self.terms(cost.kind)
        rows = _rows_of(cost, rows)
        launches = self.launches(cost)
        if launches is None:
            overhead, _ = self.overhead_for(cost, rows)
        else:  # one call per touched expert, each at its own share of the rows
            share = (_group_rows(cost.gemm, rows) if cost.gemm is not None
                     else np.maximum(np.asarray(rows, dtype=float) / np.maximum(launches, 1.0), 1.0))
            overhead, _ = self.overhead_for(cost, share, expert=True)
            overhead = overhead * launches
        by_bytes = self.op_e_memory.get(cost.name)
        if by_bytes is not None:  # one call's bytes (a cost scaled to L layers carries L calls)
            e_memory = by_bytes(np.maximum(np.asarray(cost.bytes_total, dtype=float)
                                           / max(float(getattr(cost, "calls", 1.0)), 1.0), 1.0))
        else:
            e_memory = t.e_memory(rows)
        comm = {}
        if cost.kind == "comm" and self.collectives is not None and hardware is not None:
            alpha, e_comm = self.collectives.terms(hardware.name, getattr(cost, "comm_gpus", 0) or 2)
            comm = dict(e_comm=e_comm, comm_latency_s=alpha * latency_share(cost.name))
        floor = self.floor_for(cost) * (1.0 if launches is None else launches)
        e_compute = None
        if self.gemm_e_memory is not None and cost.kind == "matmul" and np.all(np.asarray(cost.weight_bytes) > 0):
            e_compute, e_memory = self.gemm_bytes_efficiency(cost, rows, t, hardware, peak)
        # the shape model needs the device's SMs; a datasheet without them takes the kind's curves
        if (self.gemm is not None and cost.kind == "matmul" and cost.gemm is not None and hardware is not None
                and getattr(hardware, "num_sms", None)):
            e_compute, e_memory = self.gemm_efficiency(cost, hardware, rows, peak)
        shape = getattr(cost, "attn", None)
        if cost.kind == "attention" and shape is not None and self.attention_eff is None:
            # the kind's curves key a prefill by its sequences' length, a decode by its batch: what
            # calibrate times (causal squares of one sequence; decode batches), so 4 prompts of 512
            # tokens read the 512-token square's efficiency, not a 2048-token one's
            q_len = np.asarray(shape.q_len, dtype=float)
            keyed = np.where(q_len > 1, q_len, np.asarray(rows, dtype=float))
            e_memory, e_compute = t.e_memory(keyed), t.e_compute(keyed)
            if self.decode_attention is not None and hardware is not None:
                e_compute, e_memory = self.decode_group_efficiency(shape, hardware, e_compute, e_memory)
        if e_compute is None:
            e_compute = t.e_compute(rows)
        if cost.kind == "attention" and shape is not None and self.attention_eff is not None:
            e_compute, e_memory = self.attention_eff.efficiencies(shape, getattr(hardware, "num_sms", None))
            comm = dict(latency_s=self.attention_eff.latency(shape, getattr(hardware, "num_sms", None)))
        if self.overhead_mode == "overlap":
            return Efficiency(e_compute=e_compute, e_memory=e_memory, host_s=overhead, floor_s=floor, **comm)
        return Efficiency(e_compute=e_compute, e_memory=e_memory, overhead_s=overhead, floor_s=floor, **comm)

    def decode_group_efficiency(self, shape: Any, hardware: HardwareSpec, e_compute: Number, e_memory: Number
                                ) -> tuple[Number, Number]:
        """(e_compute, e_memory) of attention of `shape` under `decode_attention`: a decode (one query per
        sequence) whose group G (query heads per KV head) is a whole number takes `e_memory = 1 / (bw
        (a + c G))`, so its memory roof is its bytes times `a + c G` seconds, and `e_compute = 1`, so the
        compute roof (its FLOPs at the peak) never binds unless the fit claims a FLOP rate above the peak:
        the additive cost the calibration measured (`llmperf.measure.calibrate.fit.fit_decode_groups`),
        not `max(compute, memory)` from one group's efficiencies. `e_memory` is at most 1 (never faster
        than the bandwidth). Every other shape keeps the efficiencies given: prefill (q > 1), a fractional
        group (tensor parallelism splitting heads unevenly), and MLA (`shape.latent`: its absorbed form
        reads one latent as both K and V for every head, twice a GQA cache's FLOPs per byte at the same
        group and another kernel, so the calibrated group line does not apply; its unabsorbed form reads
        K and V materialised as activations). The overheads are the caller's, as for any attention."""
        assert self.decode_attention is not None
        group = np.asarray(shape.group, dtype=float)
        whole = np.round(group)
        use = ((np.asarray(shape.q_len, dtype=float) == 1) & (whole >= 1) & (np.abs(group - whole) < 1e-9)
               & ~np.asarray(shape.latent, dtype=bool))
        if not np.any(use):
            return e_compute, e_memory
        e_add = np.clip(1.0 / (hardware.mem_bandwidth_bytes_per_s
                               * self.decode_attention.seconds_per_byte(np.maximum(whole, 1.0))), 1e-12, 1.0)
        e_c, e_m = np.where(use, 1.0, e_compute), np.where(use, e_add, e_memory)
        return (float(e_c), float(e_m)) if e_c.ndim == 0 and e_m.ndim == 0 else (e_c, e_m)

    def launches(self, cost: OpCost) -> Number | None:
        """The calls one layer's `cost` makes when the engine runs each routed expert apart
        (`expert_launches` "per_expert"): the experts it touches (`OpCost.experts`, the expectation under
        uniform routing; 0 when none is), for a MoE layer's routed operators (the experts' GEMMs and
        activation, `moe_sum`). None for every other operator and under "grouped"."""
        experts = getattr(cost, "experts", None)
        if self.expert_launches != "per_expert" or experts is None:
            return None
        return float(experts) if np.ndim(experts) == 0 else np.asarray(experts, dtype=float)

    def gemm_bytes_efficiency(self, cost: OpCost, rows: Number, t: KindTerms, hardware: HardwareSpec | None = None,
                              peak: float | None = None) -> tuple[Number, Number]:
        """(e_compute, e_memory) of a weight GEMM under `gemm_e_memory`, looked up at one call's rows and
        weight: with a shape (`OpCost.gemm`), each group's (a routed expert's rows `m` and its N x K
        weight; a dense projection is one group of all the rows), else the operator's rows and one
        layer's weight. At rows the calibration swept, e_compute is 1 and e_memory is its curve's (each
        point's efficiency is its whole call's time as a weight stream: a compute-bound point measured a
        lower e_memory, and `peak` is the fastest GEMM measured, so the compute roof never exceeds it);
        under `weight` curves (schema 7) scaled by the cost's bytes over its weight's, so the GEMM takes
        the point's time at its rows and weight whatever its N x K (at most 1: never faster than its own
        bytes at the full bandwidth).
        Past the largest swept rows a GEMM is compute-bound: a shaped one keeps the FLOP rate its
        weight reached at those rows (`_gemm_top_e_compute`; continuous there) where they reach a
        prefill's (`GEMM_TOP_ROWS_MIN`); one without a shape or a device, or past curves that stop at
        decode rows (files from before the prefill rows were swept), takes the matmul kind's curves."""
        assert self.gemm_e_memory is not None
        curves, shape = self.gemm_e_memory, getattr(cost, "gemm", None)
        calls = np.maximum(np.asarray(getattr(cost, "calls", 1.0), dtype=float), 1.0)
        groups = 1.0 if shape is None else np.maximum(np.asarray(shape.groups, dtype=float), 1.0)
        m = rows if shape is None else _group_rows(shape, rows)
        one = np.maximum(np.asarray(cost.weight_bytes, dtype=float) / (calls * groups), 1.0)
        inside = curves.covers(m)
        e_inside = curves(m, one)
        if curves.reads == "weight":  # the point's time is its weight's bytes at e: this call's bytes in that time
            e_inside = np.minimum(e_inside * np.asarray(cost.bytes_total, dtype=float)
                                  / np.asarray(cost.weight_bytes, dtype=float), 1.0)
        if np.all(inside):
            return 1.0, e_inside
        if shape is None or hardware is None or curves.max_rows < GEMM_TOP_ROWS_MIN:
            return (np.where(inside, 1.0, t.e_compute(rows)),
                    np.where(inside, e_inside, t.e_memory(rows)))
        e_top = self._gemm_top_e_compute(shape, one, hardware, self.gemm_peak(cost, hardware) if peak is None else peak)
        return np.where(inside, 1.0, e_top), np.where(inside, e_inside, 1.0)

    def _gemm_top_e_compute(self, shape: GemmShape, one: Number, hardware: HardwareSpec, peak: float) -> Number:
        """The compute efficiency a GEMM of `shape` (one group's weight `one` bytes) reached at the
        largest rows `gemm_e_memory` swept: that call's time read back from its e_memory (its weight
        alone, or under `call` curves its weight and activations, streamed at `bw e_memory`), its FLOPs
        over `peak` times it; at most 1."""
        assert self.gemm_e_memory is not None
        top = self.gemm_e_memory.max_rows
        read = np.asarray(one, dtype=float)
        if self.gemm_e_memory.reads == "call":
            read = read / (shape.n * shape.k) * (shape.n * shape.k + top * (shape.n + shape.k))
        seconds = read / (hardware.mem_bandwidth_bytes_per_s * self.gemm_e_memory(top, one))
        return np.clip(2.0 * top * shape.n * shape.k / (peak * seconds), 1e-12, 1.0)

    def gemm_peak(self, cost: OpCost, hardware: HardwareSpec) -> float:
        """The peak `op_time` divides a matmul's FLOPs by: its module's format where the device has
        units for it, else this model's compute dtype."""
        dtype = self.compute_dtype or "fp16"
        if cost.compute_dtype is not None and cost.kind in MATRIX_KINDS and cost.compute_dtype in hardware.peak_tflops:
            dtype = cost.compute_dtype
        return peak_for(cost.kind, hardware, dtype)

    def gemm_parts_s(self, cost: OpCost, hardware: HardwareSpec, rows: Number, peak: float) -> tuple[Number, Number]:
        """One call of a weight GEMM priced from its shape (`llmperf.analysis.gemm`), its element sizes
        read off the cost (quantised weights and their scales included): (its tiles' time, its HBM
        stream's time), each never below its own roof; the GEMM takes the larger."""
        shape, calls = cost.gemm, np.maximum(np.asarray(getattr(cost, "calls", 1.0), dtype=float), 1e-300)
        flops, nbytes = cost.flops / calls, cost.bytes_total / calls
        m = np.asarray(shape.m(rows), dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            w = np.asarray(cost.weight_bytes / calls, dtype=float) / (shape.groups * shape.n * shape.k)
            a = np.asarray(cost.act_read_bytes / calls, dtype=float) / (m * shape.groups * shape.k)
        w = np.where(np.isfinite(w) & (w > 0), w, 2.0)
        a = np.where(np.isfinite(a) & (a > 0), a, 2.0)
        bw = hardware.mem_bandwidth_bytes_per_s
        work, stream = gemm_time_for(shape, rows, peak_flops_per_s=peak, bandwidth_bytes_per_s=bw,
                                     num_sms=int(hardware.num_sms), params=self.gemm, w_bytes=w, a_bytes=a,
                                     parts=True)
        return np.maximum(work, flops / peak), np.maximum(stream, nbytes / bw)

    def gemm_efficiency(self, cost: OpCost, hardware: HardwareSpec, rows: Number,
                        peak: float | None = None) -> tuple[Number, Number] | tuple[None, None]:
        """(e_compute, e_memory) that make `op_time`'s compute roof the shape model's tile time and its
        memory roof its HBM stream time (`gemm_parts_s`): their maximum is the GEMM's time, the larger
        says its bound, and the efficiencies are what the GEMM reaches, so every table that shows them
        stays true. (None, None) where the device's SM count is unknown (the per-rows curves then)."""
        if not hardware.num_sms:
            return None, None
        peak = self.gemm_peak(cost, hardware) if peak is None else peak
        calls = np.maximum(np.asarray(getattr(cost, "calls", 1.0), dtype=float), 1e-300)
        work, stream = self.gemm_parts_s(cost, hardware, rows, peak)
        flops, nbytes = np.asarray(cost.flops / calls, dtype=float), np.asarray(cost.bytes_total / calls, dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            e_c = np.where((flops > 0) & (work > 0), flops / (peak * work), 1.0)
            e_m = np.where((nbytes > 0) & (stream > 0), nbytes / (hardware.mem_bandwidth_bytes_per_s * stream), 1.0)
        e_c, e_m = np.clip(e_c, 1e-12, 1.0), np.clip(e_m, 1e-12, 1.0)
        return (float(e_c), float(e_m)) if e_c.ndim == 0 and e_m.ndim == 0 else (e_c, e_m)

    def floor_for(self, cost: OpCost) -> float:
        """A kernel's minimum device time for `cost` (per launch): the operator's own (`op_floor_s`),
        else its kind's `floor_s`; 0 where neither is given. Unlike the host's overhead it never adds:
        the operator takes at least this long on the device, whatever its roofs say."""
        floor = self.op_floor_s.get(cost.name)
        return self.terms(cost.kind).floor_s if floor is None else floor

    def op_time_s(self, cost: OpCost, hardware: HardwareSpec, compute_dtype: str, rows: Number) -> Number:
        """`max(flops / (peak e_c), bytes / (bw e_m), latency + comm / (link e_comm), host) + overhead` at
        `rows`: `llmperf.analysis.roofline.op_time` at given rows."""
        device, host, serial = self.op_parts_s(cost, hardware, compute_dtype, rows)
        return np.maximum(device, host) + serial

    def op_parts_s(self, cost: OpCost, hardware: HardwareSpec, compute_dtype: str, rows: Number
                   ) -> tuple[Number, Number, Number]:
        """(device, overlapped host, serial overhead) seconds of `cost` at `rows`: the device's time
        (`max` of the compute, memory and interconnect roofs and the kernels' floor), the host dispatch
        that overlaps it (mode overlap) and the one that adds to it (mode add); `op_time_s` is
        `max(device, host) + serial`."""
        peak = peak_for(cost.kind, hardware, compute_dtype)
        eff = self.efficiency(cost, hardware, rows, peak=peak)
        compute = cost.flops / (peak * eff.e_compute)
        memory = cost.bytes_total / (hardware.mem_bandwidth_bytes_per_s * eff.e_memory)
        calls = getattr(cost, "calls", 1.0)  # an operator scaled to L layers launches L times
        compute, memory = compute + eff.latency_s * calls, memory + eff.latency_s * calls
        comm = (cost.comm_bytes / (hardware.interconnect_bytes_per_s * eff.e_comm)
                + np.where(np.asarray(cost.comm_bytes) > 0, eff.comm_latency_s * calls, 0.0)
                if hardware.interconnect_bytes_per_s else 0.0 * cost.comm_bytes)
        device = np.maximum(np.maximum(np.maximum(compute, memory), comm), eff.floor_s * calls)
        return device, eff.host_s * calls, eff.overhead_s * calls

    def to_dict(self) -> dict[str, Any]:
        """Every term of the model as plain data (curves as point lists), for run.json and reports."""
        return dict(model=self.name, engine=self.engine, dtype=self.dtype, step_overhead_s=self.step_overhead_s,
                    prefill_step_overhead_s=self.for_phase("prefill").step_overhead_s,
                    graph_max_rows=self.graph_max_rows, source=self.source,
                    overhead_mode=self.overhead_mode, backend=self.backend, op_overhead_s=dict(self.op_overhead_s),
                    op_e_memory={op: c.to_list() for op, c in self.op_e_memory.items()},
                    op_overhead_rows_s={op: c.to_list() for op, c in self.op_overhead_rows.items()},
                    op_overhead_rows_by_op_s={op: c.to_list() for op, c in self.op_overhead_rows_by_op.items()},
                    one_call_rows=self.one_call_rows, one_call_max_head_dim=self.one_call_max_head_dim,
                    op_overhead_rows_expert_s={op: c.to_list() for op, c in self.op_overhead_rows_expert.items()},
                    op_floor_s=dict(self.op_floor_s), gemm=None if self.gemm is None else self.gemm.to_dict(),
                    attention_eff=self.attention_eff.to_dict() if self.attention_eff is not None else None,
                    gemm_e_memory=None if self.gemm_e_memory is None else self.gemm_e_memory.to_dict(),
                    gemm_e_memory_reads=None if self.gemm_e_memory is None else self.gemm_e_memory.reads,
                    decode_attention=None if self.decode_attention is None else self.decode_attention.to_dict(),
                    kinds={k: dict(e_compute=t.e_compute.to_list(), e_memory=t.e_memory.to_list(),
                                   overhead_s=t.overhead_s, floor_s=t.floor_s) for k, t in self.kinds.items()})


ROOFLINE_MODEL = EfficiencyTimeModel(name="roofline", source="pure roofline: efficiency 1, overhead 0")


def _joined(one_call: Curve | None, by_op: Curve, rows: int) -> Curve:
    """Seconds by rows: `one_call`'s up to `rows` (a decode step the one call takes), `by_op`'s beyond;
    `by_op` alone where `rows` is 0 or the one call has no figure for the operator."""
    if not rows or one_call is None:
        return by_op
    below = [(r, v) for r, v in one_call.points if r < rows] + [(float(rows), float(one_call(float(rows))))]
    above = [(r, v) for r, v in by_op.points if r > rows + 1]
    return Curve((*below, (rows + 1.0, float(by_op(rows + 1.0))), *above))


def parse_attention_eff(raw: Any, where: str) -> dict[str, AttentionEfficiency]:
    """`attention_eff`: {compute dtype: terms} (`llmperf.specs.efficiency.parse_attention_eff`) as
    `AttentionEfficiency` objects."""
    return {d: AttentionEfficiency(**t) for d, t in _schema.parse_attention_eff(raw, where).items()}


def parse_efficiency(raw: Any, where: str) -> dict[str, Any]:
    """An `efficiency:` block checked by `llmperf.specs.efficiency.parse_efficiency`, its `gemm` and
    `attention_eff` terms as `GemmParams` and `AttentionEfficiency`."""
    parsed = _schema.parse_efficiency(raw, where)
    return {**parsed, "gemm": None if parsed["gemm"] is None else GemmParams(**parsed["gemm"]),
            "attention_eff": {d: AttentionEfficiency(**t) for d, t in parsed["attention_eff"].items()}}


def typical_path() -> Path:
    """The installed `models_spec/efficiency/typical.yaml`, the terms of `--efficiency typical`."""
    return Path(str(resources.files("models_spec").joinpath("efficiency", "typical.yaml")))


# ---- engine profiles (`--engine`): what the serving stack adds to a GPU's kernels --------------------
ENGINE_SCHEMA = 1
DEFAULT_ENGINE = "compiled"  # a GPU's default: a CUDA-graph serving stack (vLLM, SGLang, TensorRT-LLM)
_ENGINE_FIELDS = ("schema_version", "name", "description", "source", "launch_s", "graph_max_batch",
                  "calibrated_overheads", "expert_launches", "decode", "prefill")


@dataclass(frozen=True, kw_only=True)
class EnginePhase:
    """An engine's terms for one kind of step: its fixed cost outside the forward pass (scheduler,
    sampling, host-device sync) and whether it replays as a CUDA graph (no host launch per kernel)."""

    step_overhead_s: float
    cuda_graph: bool


@dataclass(frozen=True, kw_only=True)
class EngineProfile:
    """A serving stack's host-side terms (`models_spec/engines/<name>.yaml`, each figure cited there):
    the host launch of one kernel per operator kind (overlapped with the device work), the largest
    decode batch that replays as a graph, and the decode and prefill steps' terms.
    `calibrated_overheads`: the engine `llmperf calibrate` measures (llmperf's own), so under
    `calibrated` the calibration's overheads stay and its step overhead wins where it measured one."""

    name: str
    description: str = ""
    source: str = ""
    launch_s: Mapping[str, float] = field(default_factory=dict, hash=False)
    graph_max_batch: int = 0
    calibrated_overheads: bool = False
    expert_launches: str = "grouped"  # a MoE layer's routed experts: one grouped kernel, or a call each
    decode: EnginePhase
    prefill: EnginePhase

    @classmethod
    def parse(cls, raw: Any, where: str) -> EngineProfile:
        """From a profile's mapping; a bad or unknown field raises one line naming it (`where`.field)."""
        if not isinstance(raw, Mapping):
            raise SpecError(f"{where}: expected a mapping with {', '.join(_ENGINE_FIELDS)}, got {raw!r}")
        unknown = sorted(set(raw) - set(_ENGINE_FIELDS))
        if unknown:
            raise SpecError(f"{where}: unknown field {unknown[0]!r} (fields: {', '.join(_ENGINE_FIELDS)})")
        if raw.get("schema_version") != ENGINE_SCHEMA:
            raise SpecError(f"{where}.schema_version: expected {ENGINE_SCHEMA}, got {raw.get('schema_version')!r}")
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            raise SpecError(f"{where}.name: expected a name, got {name!r}")
        launch = raw.get("launch_s", {})
        if not isinstance(launch, Mapping):
            raise SpecError(f"{where}.launch_s: expected a mapping of operator kind -> seconds, got {launch!r}")
        for kind in launch:
            if kind not in OP_KINDS:
                raise SpecError(f"{where}.launch_s: unknown operator kind {kind!r} (kinds: {', '.join(OP_KINDS)})")
        graph_max = raw.get("graph_max_batch", 0)
        if isinstance(graph_max, bool) or not isinstance(graph_max, int) or graph_max < 0:
            raise SpecError(f"{where}.graph_max_batch: must be an integer >= 0, got {graph_max!r}")
        calibrated = raw.get("calibrated_overheads", False)
        if not isinstance(calibrated, bool):
            raise SpecError(f"{where}.calibrated_overheads: must be true or false, got {calibrated!r}")
        experts = raw.get("expert_launches", "grouped")
        if experts not in EXPERT_LAUNCHES:
            raise SpecError(f"{where}.expert_launches: must be one of {', '.join(EXPERT_LAUNCHES)}, got {experts!r}")
        phases = {}
        for phase in ("decode", "prefill"):
            terms = raw.get(phase)
            at = f"{where}.{phase}"
            if not isinstance(terms, Mapping) or set(terms) != {"step_overhead_s", "cuda_graph"}:
                raise SpecError(f"{at}: expected a mapping with step_overhead_s and cuda_graph, got {terms!r}")
            if not isinstance(terms["cuda_graph"], bool):
                raise SpecError(f"{at}.cuda_graph: must be true or false, got {terms['cuda_graph']!r}")
            phases[phase] = EnginePhase(step_overhead_s=check_seconds(terms["step_overhead_s"],
                                                                      f"{at}.step_overhead_s"),
                                        cuda_graph=terms["cuda_graph"])
        if any(p.cuda_graph for p in phases.values()) and not graph_max:
            raise SpecError(f"{where}.graph_max_batch: a CUDA-graph phase needs the largest batch it captures")
        return cls(name=name, description=str(raw.get("description", "")), source=str(raw.get("source", "")),
                   launch_s={str(k): check_seconds(v, f"{where}.launch_s.{k}") for k, v in launch.items()},
                   graph_max_batch=graph_max, calibrated_overheads=calibrated, expert_launches=experts, **phases)

    def apply(self, model: EfficiencyTimeModel) -> EfficiencyTimeModel:
        """`model` (the device's kernels: typical or calibrated) priced as this engine runs it: the
        decode step's terms, with `.prefill` the prefill step's (`EfficiencyTimeModel.for_phase`)."""
        keep = self.calibrated_overheads and model.name == "calibrated"

        def priced(phase: EnginePhase) -> EfficiencyTimeModel:
            graph = float(self.graph_max_batch) if phase.cuda_graph else 0.0
            if keep:  # the calibration measured this very engine: its host terms stay
                return replace(model, engine=self.name, graph_max_rows=graph, expert_launches=self.expert_launches,
                               step_overhead_s=model.step_overhead_s or phase.step_overhead_s)
            kinds = {k: replace(model.terms(k), overhead_s=self.launch_s.get(k, 0.0)) for k in OP_KINDS}
            return replace(model, kinds=kinds, op_overhead_s={}, op_overhead_rows={}, op_overhead_rows_by_op={},
                           op_overhead_rows_expert={}, backend="", engine=self.name, graph_max_rows=graph,
                           step_overhead_s=phase.step_overhead_s, expert_launches=self.expert_launches)
        return replace(priced(self.decode), prefill=priced(self.prefill))


def engines_path() -> Path:
    """The folder of the built-in engine profiles (`models_spec/engines/`)."""
    return Path(str(resources.files("models_spec").joinpath("engines")))


def engine_names() -> list[str]:
    """The names `--engine` accepts: one per profile file."""
    return sorted(p.stem for p in engines_path().glob("*.yaml"))


def load_engine(name: str) -> EngineProfile:
    """The engine profile `name` (`models_spec/engines/<name>.yaml`); an unknown name is refused with
    the profiles there."""
    names = engine_names()
    if name not in names:
        raise SpecError(f"--engine: unknown engine profile {name!r} (profiles: {', '.join(names)})")
    path = engines_path() / f"{name}.yaml"
    profile = EngineProfile.parse(_read_yaml(path), str(path))
    if profile.name != name:
        raise SpecError(f"{path}.name: must be the file's name {name!r}, got {profile.name!r}")
    return profile


def is_cpu(hardware: HardwareSpec) -> bool:
    """Whether `hardware` is a CPU (its vendor or variant says so): no typical terms, no engine profile."""
    return hardware.vendor.lower() == "cpu" or "cpu" in (hardware.variant or "").lower().split()


def default_efficiency(hardware: HardwareSpec) -> str:
    """The expected time's model: `calibrated` for a calibrated CPU (`--hardware local`), `typical`
    for a GPU; a CPU nobody calibrated has only its roofline."""
    if is_cpu(hardware):
        return "calibrated" if getattr(hardware, "efficiency", None) else "roofline"
    return "typical"



def _read_yaml(path: Path) -> Any:
    import yaml

    try:
        return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # libyaml: faster
    except (OSError, yaml.YAMLError) as exc:
        raise SpecError(f"{path}: cannot read the efficiency file ({str(exc).splitlines()[0]})") from None


def _pick_dtype(parsed: dict[str, Any], dtype: str, where: str) -> tuple[str, dict[str, KindTerms]]:
    dtypes = parsed["dtypes"]
    if dtype in dtypes:
        return dtype, dtypes[dtype]
    if "default" in dtypes:
        return "default", dtypes["default"]
    raise SpecError(f"{where}: no efficiency terms for compute dtype {dtype!r} "
                    f"(measured: {', '.join(dtypes)}); run `llmperf calibrate --dtypes {dtype}`")


def _from_parsed(name: str, parsed: dict[str, Any], dtype: str, where: str, backend: str,
                 weight_bytes: float | None = None, collectives: Collectives | None = None) -> EfficiencyTimeModel:
    used, kinds = _pick_dtype(parsed, dtype, where)
    if backend not in BACKENDS:
        raise SpecError(f"--backend: must be one of {', '.join(BACKENDS)}, got {backend!r}")
    ops = parsed["op_overhead_s"].get(backend, {})  # a backend never measured: the per-kind figures
    warm = parsed.get("op_overhead_warm_s", {}).get(backend, {})
    by_rows = parsed.get("op_overhead_rows_s", {}).get(used, {}).get(backend, {})
    by_op = parsed.get("op_overhead_rows_by_op_s", {}).get(used, {}).get(backend, {})
    experts = parsed.get("op_overhead_rows_expert_s", {}).get(used, {}).get(backend, {})
    if warm and weight_bytes is not None and weight_bytes <= parsed.get("warm_below_bytes", 0.0):
        # weights that stay in the private caches leave the dispatch warm
        ops, by_rows, by_op, experts = warm, {}, {}, {}
    one_call = parsed.get("one_call") or {}
    return EfficiencyTimeModel(name=name, kinds=kinds, dtype=used, step_overhead_s=parsed["step_overhead_s"],
                               source=parsed["source"], op_overhead_s=ops, overhead_mode=parsed["overhead_mode"],
                               backend=backend if ops or by_rows else "",
                               op_e_memory=parsed.get("op_e_memory", {}).get(used, {}), op_overhead_rows=by_rows,
                               op_overhead_rows_by_op=by_op,  # the one call runs the sdpa backend only
                               one_call_rows=one_call.get("rows", {}).get(used, 0) if backend == "sdpa" else 0,
                               one_call_max_head_dim=one_call.get("max_head_dim", 0),
                               op_overhead_rows_expert=experts,
                               op_floor_s=parsed.get("op_floor_s", {}).get(used, {}),
                               collectives=collectives, gemm=parsed.get("gemm"), compute_dtype=dtype,
                               attention_eff=_attention_eff_for(parsed, used),
                               gemm_e_memory=parsed.get("gemm_e_memory", {}).get(used),
                               decode_attention=parsed.get("decode_attention", {}).get(used),
                               # a calibration measured llmperf's own engine, which calls each expert
                               expert_launches="per_expert" if name == "calibrated" else "grouped")


def _attention_eff_for(parsed: dict[str, Any], dtype: str) -> AttentionEfficiency | None:
    by_dtype = parsed.get("attention_eff", {})
    return by_dtype.get(dtype, by_dtype.get("default"))


def time_model_for(hardware: HardwareSpec, efficiency: str = "roofline", compute_dtype: str = "fp16",
                   backend: str = "sdpa", weight_bytes: float | None = None,
                   engine: str | None = None) -> EfficiencyTimeModel:
    """The time model `efficiency` names, for `hardware` at `compute_dtype`, with the per-operator
    overheads measured for the attention `backend` (sdpa unless said: the engine's default).
    `weight_bytes`: the model's weights on the device; when a CPU calibration measured warm overheads
    too (`op_overhead_warm_s`) and the weights fit its private caches (`warm_below_bytes`), those
    are used: every operator then dispatches with warm caches (a toy model), not after a weight
    matrix streamed through them (a real one, the default).

    `calibrated` needs a spec written by `llmperf calibrate` (its `efficiency:` block); `typical`
    reads `models_spec/efficiency/typical.yaml` and is refused for a CPU (its figures are GPU
    measurements); its collectives take a latency and a bus bandwidth by GPU count
    (`models_spec/efficiency/collectives.yaml`, `llmperf.analysis.collectives`).

    `engine`: the serving stack's profile (`models_spec/engines/`, `DEFAULT_ENGINE` for a GPU unless
    said): its launch and step terms replace the model's (`EngineProfile.apply`). The roofline is the
    bound and takes none; a CPU runs llmperf's own engine, measured by its calibration, and refuses one."""
    if efficiency not in TIME_MODELS:
        raise SpecError(f"--efficiency: must be one of {', '.join(TIME_MODELS)}, got {efficiency!r}")
    profile = load_engine(engine) if engine is not None else None
    if efficiency == "roofline":
        return ROOFLINE_MODEL
    if profile is not None and is_cpu(hardware):
        raise SpecError(f"--engine {engine}: {hardware.name!r} is a CPU, which runs llmperf's own engine as its "
                        "calibration measured it (leave --engine out)")
    if not is_cpu(hardware):
        profile = profile or load_engine(DEFAULT_ENGINE)
    if efficiency == "calibrated":
        raw = getattr(hardware, "efficiency", None)
        if not raw:
            raise SpecError(f"--efficiency calibrated: hardware {hardware.name!r} has no calibration "
                            "(run `llmperf calibrate`, then use --hardware local)")
        parsed = parse_efficiency(raw, f"{hardware.name}: efficiency")
        model = _from_parsed("calibrated", parsed, compute_dtype, f"{hardware.name}: efficiency", backend,
                             weight_bytes)
        return profile.apply(model) if profile is not None else model
    if is_cpu(hardware):
        raise SpecError(f"--efficiency typical: the typical figures are GPU measurements; {hardware.name!r} "
                        "is a CPU (use --efficiency calibrated)")
    path = typical_path()
    parsed = parse_efficiency(_read_yaml(path), str(path))
    return profile.apply(_from_parsed("typical", parsed, compute_dtype, str(path), backend,
                                      collectives=load_collectives()))


def sweep_jobs(efficiency: str | None, models: Sequence[Any], devices: Sequence[Any], options: Mapping[str, Any],
               engine: str | None = None) -> list[tuple[list[Any], list[Any], dict[str, Any]]]:
    """Split a sweep so each part has one time model: `(models, devices, options + time_model)`.

    The roofline needs no split (one part, the default time model). `typical` and `calibrated` terms
    belong to one device and one compute dtype, so the sweep is split per model, device and
    activation precision (in the sweep's own row order: model, hardware, precision), each part
    carrying the `time_model` `time_model_for` gives (with the `engine` profile). `efficiency` None:
    each device's expected time (`default_efficiency`)."""
    from llmperf.specs import load_hardware, load_model

    if efficiency is not None and efficiency not in TIME_MODELS:
        raise SpecError(f"--efficiency: must be one of {', '.join(TIME_MODELS)}, got {efficiency!r}")
    if engine is not None:
        load_engine(engine)  # an unknown name is refused whatever the time model
    if efficiency == "roofline":
        return [(list(models), list(devices), dict(options))]
    jobs = []
    for m_ref in models:
        model = load_model(m_ref)
        for d_ref in devices:
            hw = load_hardware(d_ref)
            eff = efficiency or default_efficiency(hw)
            if eff == "roofline":
                jobs.append(([m_ref], [d_ref], dict(options)))
                continue
            if options.get("activations"):
                key, values = "activations", list(options["activations"])
            elif options.get("precision"):
                key, values = "precision", list(options["precision"])
            else:
                key, values = None, [model.dtype]
            for act in values:
                name = act if isinstance(act, str) else getattr(act, "activations", model.dtype)
                tm = time_model_for(hw, eff, hw.compute_dtype(name), engine=engine)
                opts = dict(options, time_model=tm)
                if key is not None:
                    opts[key] = [act]
                jobs.append(([m_ref], [d_ref], opts))
    return jobs
