"""Everything a calibration measured (`Calibration`), the ceilings read from it, and the hardware
mapping it becomes (`to_mapping`: `HardwareSpec` fields, the `efficiency:` block, the provenance).

The device's ceilings are timed in plain torch (streams, and `torch_gemm`: `F.linear`'s GEMV and
largest GEMM); the engine's GEMM sweep (`compute`) is what its curves are fitted on. The spec's
`peak_tflops[dtype]` is the better of the two GEMM throughputs and `memory_bandwidth_gbps` the best
DRAM-sized stream (read, copy or either GEMV), so every efficiency is in (0, 1] and the roofline of
`-H local` stays a bound where the engine beats plain torch (`fit_terms`, formulas in
`llmperf.measure.calibrate.fit`). Vector operators get
`e_memory = add bandwidth / bw`. On a CPU, the weight GEMMs timed at several sizes (`gemm_sizes`,
with the sweep's own shape) give `gemm_e_memory` (schema 7, `fit_gemm_e_memory`), and decode attention
timed at several query-head groups `decode_attention` (schema 9, `fit_decode_groups`). The overheads
combine with the device time by `overhead_mode`:
`add` on CPU (dispatch and work run on one thread), `overlap` on CUDA (asynchronous launches; see
`llmperf.analysis.timemodel`), where the fit takes `t' = t`: a CUDA-event time of back-to-back calls
is the device's own time. Nothing from `profile`'s configurations is used.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from llmperf.analysis.timemodel import EFFICIENCY_SCHEMA
from llmperf.measure.calibrate.fit import _clean, _clean_ops, fit_curves, fit_decode_groups, fit_gemm_e_memory
from llmperf.measure.calibrate.operators import (
    COLD_GEMM,
    FAMILY_DISPATCH,
    MOE_DISPATCH_OPS,
    TINY_SPEC,
    dispatch_by_op_spec,
    dispatch_moe_spec,
    dispatch_spec,
)
from llmperf.measure.calibrate.points import AllreducePoint, ComputePoint, StreamPoint
from llmperf.measure.calibrate.settings import VECTOR_KINDS, MiB, Settings
from llmperf.measure.calibrate.vector_ops import VECTOR_SPEC
from llmperf.specs import HardwareSpec
from llmperf.specs.local import CALIBRATION_SCHEMA, CALIBRATION_TOOL, LOCAL_NAME


@dataclass(kw_only=True)
class Calibration:
    """Everything measured, with where and how."""

    device: dict[str, Any]
    versions: dict[str, str]
    created: str
    settings: Settings
    streams: list[StreamPoint] = field(default_factory=list)
    compute: list[ComputePoint] = field(default_factory=list)  # the engine's GEMM sweep and attention
    # the device's GEMM ceilings in plain torch (`F.linear`) where the engine's GEMM is not plain torch's;
    # the dtypes whose engine GEMM is plain torch (its sweep is the ceiling) in `plain_torch_dtypes`
    torch_gemm: list[ComputePoint] = field(default_factory=list)
    plain_torch_dtypes: list[str] = field(default_factory=list)
    overhead_s: dict[str, float] = field(default_factory=dict)
    op_overhead_s: dict[str, dict[str, float]] = field(default_factory=dict)  # backend -> operator -> s
    op_overhead_warm_s: dict[str, dict[str, float]] = field(default_factory=dict)  # CPU: without the cold GEMV
    op_e_memory: dict[str, dict[str, list[list[float]]]] = field(default_factory=dict)  # dtype -> op -> [[bytes, e]]
    # CPU: dtype -> backend -> op -> [[rows, seconds]] (the packed GEMM path dispatches differently)
    op_overhead_rows_s: dict[str, dict[str, dict[str, list[list[float]]]]] = field(default_factory=dict)
    # CPU: the same for the operators that read no weights, called one by one (`measure_by_op_rows`),
    # and where a decode step runs in one call instead (`one_call_facts`: max_head_dim, rows by dtype)
    op_overhead_rows_by_op_s: dict[str, dict[str, dict[str, list[list[float]]]]] = field(default_factory=dict)
    one_call: dict[str, Any] = field(default_factory=dict)
    # CPU: a routed expert's own operators (`EXPERT_OPS`), called once per expert, the same way
    op_overhead_rows_expert_s: dict[str, dict[str, dict[str, list[list[float]]]]] = field(default_factory=dict)
    step_overhead_s: float = 0.0
    dispatch_probe_s: float = 0.0  # CUDA: the host's time to issue a tiny kernel (`timers.dispatch_seconds`)
    floor_s: dict[str, float] = field(default_factory=dict)  # CUDA: kind -> a tiny kernel's device time
    # CUDA: GEMMs by shape (dtype, m, n, k, seconds) and the shape model's terms fitted on them
    gemm_shapes: list[tuple[str, int, int, int, float]] = field(default_factory=list)
    gemm: dict[str, Any] | None = None
    # CUDA: fused attention (SDPA) by shape and its terms (`llmperf.analysis.attention_eff`) fitted on them
    attention_shapes: list[dict[str, Any]] = field(default_factory=list)
    attention_eff: dict[str, Any] | None = None
    # CPU: (weight bytes, point) of the engine's GEMM at several weight sizes and the decode rows
    gemm_sizes: list[tuple[int, ComputePoint]] = field(default_factory=list)
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
        """The best DRAM-sized stream: read, copy, or a GEMV's weight stream (the engine's or plain torch's)."""
        floor = self.dram_size_bytes()
        best = max((p.bytes_per_s for p in self.streams if p.size_bytes >= floor and p.kind != "add"), default=0.0)
        gemv = max((p.bytes_per_s for p in [*self.compute, *self.torch_gemm] if p.op == "matmul" and p.rows == 1),
                   default=0.0)
        return max(best, gemv)

    def copy_bytes_per_s(self) -> float:
        return max((p.bytes_per_s for p in self.streams if p.kind == "copy"
                    and p.size_bytes >= self.dram_size_bytes()), default=0.0)

    def peak_flops_per_s(self, dtype: str) -> float:
        """The spec's peak: the better of plain torch's GEMM ceiling and the engine's GEMM."""
        return max(self.engine_peak_flops_per_s(dtype), self.torch_peak_flops_per_s(dtype))

    def engine_peak_flops_per_s(self, dtype: str) -> float:
        return max((p.flops_per_s for p in self.compute if p.op == "matmul" and p.dtype == dtype), default=0.0)

    def torch_points(self, dtype: str) -> list[ComputePoint]:
        """The plain-torch GEMM ceilings of `dtype`: its `torch_gemm` points, or the engine's sweep where
        that is plain torch's."""
        if dtype in self.plain_torch_dtypes:
            return [p for p in self.compute if p.op == "matmul" and p.dtype == dtype]
        return [p for p in self.torch_gemm if p.dtype == dtype]

    def torch_peak_flops_per_s(self, dtype: str) -> float:
        return max((p.flops_per_s for p in self.torch_points(dtype)), default=0.0)

    def gemv_bytes_per_s(self, dtype: str, *, plain: bool = False) -> float:
        """The GEMV's (rows = 1) weight stream of `dtype`: the engine's, or with `plain` plain torch's (0: none)."""
        pts = self.torch_points(dtype) if plain else [p for p in self.compute if p.op == "matmul" and p.dtype == dtype]
        return max((p.bytes_per_s for p in pts if p.rows == 1), default=0.0)

    def device_ceilings(self) -> dict[str, Any]:
        """Per measured dtype, plain torch's GEMM ceilings beside the engine's, and which set the peak."""
        out = {}
        for d in self.measured_dtypes():
            torch_peak, engine_peak = self.torch_peak_flops_per_s(d), self.engine_peak_flops_per_s(d)
            out[d] = dict(plain_torch=dict(peak_tflops=_clean(torch_peak / 1e12),
                                           gemv_gbps=_clean(self.gemv_bytes_per_s(d, plain=True) / 1e9)),
                          engine=dict(peak_tflops=_clean(engine_peak / 1e12),
                                      gemv_gbps=_clean(self.gemv_bytes_per_s(d) / 1e9)),
                          peak_set_by="plain torch" if torch_peak >= engine_peak else "engine")
        return out

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
        """The `efficiency:` block (formulas: `llmperf.measure.calibrate.fit`)."""
        bw = self.memory_bytes_per_s()
        overlap = self.overhead_mode == "overlap"
        dtypes: dict[str, Any] = {}
        add = [p for p in self.streams if p.kind == "add"]
        e_vec = min(1.0, max(p.bytes_per_s for p in add) / bw) if add else 1.0
        for dtype in self.measured_dtypes():
            peak = self.peak_flops_per_s(dtype)
            kinds: dict[str, Any] = {}
            for op in ("matmul", "attention"):
                # the attention curves: the settings' group only (the other decode groups: `decode_attention`)
                pts = sorted((p for p in self.compute if p.op == op and p.dtype == dtype
                              and p.group in (0, self.settings.attn_group)), key=lambda p: p.rows)
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
        # CUDA: 4 with the device floors, 5 with the GEMM and attention shape terms; CPU: 7 with the
        # weight GEMMs by size (each point read as its weight's stream; 6 read the whole call), 8 with
        # the operators' dispatch one by one beside the one call's, 9 with decode attention by group
        gemm_e_memory = self.gemm_e_memory()
        decode_attention = self.decode_attention()
        cpu = self.device.get("kind") != "cuda"  # a GPU's engine has no one-call path (nor these tables)
        by_op = {d: b for d, b in self.op_overhead_rows_by_op_s.items() if d in dtypes} if cpu else {}
        experts = {d: b for d, b in self.op_overhead_rows_expert_s.items() if d in dtypes} if cpu else {}
        schema = (9 if decode_attention else 8 if by_op or experts else 7 if gemm_e_memory
                  else 5 if self.gemm or self.attention_eff else 4 if self.floor_s else EFFICIENCY_SCHEMA)
        out = dict(schema_version=schema, model="calibrated", step_overhead_s=self.step_overhead_s,
                   source=f"{CALIBRATION_TOOL}, {self.created}", overhead_mode=self.overhead_mode)
        if self.op_overhead_s:
            out["op_overhead_s"] = _clean_ops(self.op_overhead_s)
        if self.op_overhead_warm_s:
            out["op_overhead_warm_s"] = _clean_ops(self.op_overhead_warm_s)
            out["warm_below_bytes"] = self.private_cache_bytes()
        if self.op_overhead_rows_s:
            out["op_overhead_rows_s"] = _rows_table(self.op_overhead_rows_s, dtypes)
        if by_op:
            out["op_overhead_rows_by_op_s"] = _rows_table(by_op, dtypes)
            out["one_call"] = dict(max_head_dim=int(self.one_call.get("max_head_dim", 0)),
                                   rows={d: int(n) for d, n in self.one_call.get("rows", {}).items() if d in dtypes})
        if experts:
            out["op_overhead_rows_expert_s"] = _rows_table(experts, dtypes)
        if self.op_e_memory:
            out["op_e_memory"] = {d: {op: [[int(b), _clean(e)] for b, e in pts] for op, pts in ops.items()}
                                  for d, ops in self.op_e_memory.items() if d in dtypes}
        if gemm_e_memory:
            out["gemm_e_memory"] = gemm_e_memory
        if decode_attention:
            out["decode_attention"] = decode_attention
        if self.gemm:
            out["gemm"] = dict(self.gemm)
        if self.attention_eff:
            out["attention_eff"] = {"default": dict(self.attention_eff)}
        out["dtypes"] = dtypes
        return out

    def gemm_e_memory(self) -> dict[str, dict[int, list[list[float]]]]:
        """Per measured dtype, `fit_gemm_e_memory` on its `gemm_sizes` points and the GEMM sweep's points
        at the same rows (weights of `gemm_n x gemm_k`), so the curves meet the sweep at its shape."""
        if not self.gemm_sizes or self.device.get("kind") == "cuda":  # CUDA: the shape model (`gemm`)
            return {}
        bw, n, k = self.memory_bytes_per_s(), self.settings.gemm_n, self.settings.gemm_k
        out = {}
        for dtype in self.measured_dtypes():
            own = [(w, p) for w, p in self.gemm_sizes if p.dtype == dtype]
            rows = {p.rows for _, p in own}
            # the sweep's points (timed another moment, not probed) join only an unprobed sweep
            probed = {p.rows for _, p in own if p.read_bytes_per_s > 0}
            sweep = [(p.bytes * n * k / (n * k + p.rows * (n + k)), p) for p in self.compute
                     if p.op == "matmul" and p.dtype == dtype and p.rows in rows - probed]
            if own:
                out[dtype] = fit_gemm_e_memory(own + sweep, bw, self.overhead_s.get("matmul", 0.0))
        return out

    def decode_attention(self) -> dict[str, dict[str, Any]]:
        """Per measured dtype, `fit_decode_groups` on its decode attention points (CPU; CUDA prices
        attention by shape, `attention_eff`); {} where no dtype was timed at two groups."""
        if self.device.get("kind") == "cuda":
            return {}
        oh = self.overhead_s.get("attention", 0.0)
        out = {}
        for dtype in self.measured_dtypes():
            pts = [p for p in self.compute if p.op == "attention" and p.dtype == dtype and p.memory_bound]
            terms = fit_decode_groups(pts, oh)
            if terms is not None:
                out[dtype] = dict(terms, source=f"{CALIBRATION_TOOL}, {self.created}: sdpa_decode at groups "
                                                f"{', '.join(map(str, terms['groups']))}, {len(pts)} points")
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
                          interconnect_busbw_gbps=_clean(self.interconnect_bytes_per_s() / 1e9),
                          gemm=self.device_ceilings()),
            overhead_s={k: _clean(v) for k, v in self.overhead_s.items()},
            op_overhead_s=_clean_ops(self.op_overhead_s),
            op_overhead_model=dict(TINY_SPEC, cache="contiguous", tokens=self.settings.op_overhead_tokens,
                                   cold=(f"a (1,{COLD_GEMM[0]})@({COLD_GEMM[0]},{COLD_GEMM[1]}) fp32 GEMV before each "
                                         "operator" if self.device.get("kind") == "cpu" else "none (GPU: warm host)"),
                                   in_situ=(dict(dispatch_spec(self.settings.dispatch_hidden), cache="contiguous",
                                                 tokens=self.settings.op_overhead_tokens,
                                                 ops="every operator but the weight GEMMs (op_overhead_rows_s, "
                                                     "op_overhead_s)",
                                                 moe=dict(dispatch_moe_spec(self.settings.dispatch_hidden),
                                                          ops=", ".join(MOE_DISPATCH_OPS)),
                                                 by_op=(dict(dispatch_by_op_spec(self.settings.dispatch_hidden),
                                                             ops="every operator but the weight GEMMs, called one "
                                                                 "by one (op_overhead_rows_by_op_s)")
                                                        if self.op_overhead_rows_by_op_s else None))
                                            if self.settings.dispatch_hidden and self.op_overhead_rows_s else None),
                                   families=[dict(spec, cache="contiguous", tokens=self.settings.op_overhead_tokens,
                                                  ops=", ".join(keep))
                                             for _what, spec, keep in FAMILY_DISPATCH
                                             if self.device.get("kind") == "cuda" and any(
                                                 op in ops for ops in self.op_overhead_s.values() for op in keep)]
                                   or None),
            step_overhead_s=_clean(self.step_overhead_s),
            dispatch_probe_us=_clean(self.dispatch_probe_s * 1e6) if self.dispatch_probe_s else None,
            floor_s={k: _clean(v) for k, v in self.floor_s.items()},
            gemm_shapes=[dict(dtype=d, m=m, n=n, k=k, seconds=_clean(t)) for d, m, n, k, t in self.gemm_shapes],
            attention_shapes=[{k: _clean(v) if isinstance(v, float) else v for k, v in r.items()}
                              for r in self.attention_shapes],
            op_e_memory_model=dict(VECTOR_SPEC, cache="contiguous",
                                   prefills=[list(p) for p in self.settings.vector_prefills],
                                   reps=self.settings.vector_reps) if self.op_e_memory else None,
            streams=[dict(kind=p.kind, size_bytes=p.size_bytes, gb_per_s=_clean(p.bytes_per_s / 1e9),
                          seconds=_clean(p.seconds), spread_s=_clean(p.spread_s), n=p.n) for p in self.streams],
            compute=[_compute_row(p) for p in self.compute],
            torch_gemm=[_compute_row(p) for p in self.torch_gemm],
            gemm_sizes=[dict(dtype=p.dtype, rows=p.rows, shape=p.shape, weight_bytes=w, seconds=_clean(p.seconds),
                             median_s=_clean(p.typical_s), spread_s=_clean(p.spread_s), n=p.n,
                             gb_per_s=_clean(p.bytes_per_s / 1e9),
                             **({"read_gb_per_s": _clean(p.read_bytes_per_s / 1e9)} if p.read_bytes_per_s else {}))
                        for w, p in self.gemm_sizes],
            allreduce=[dict(backend=p.backend, world=p.world, size_bytes=p.size_bytes, seconds=_clean(p.seconds),
                            busbw_gbps=_clean(p.busbw / 1e9)) for p in self.allreduce],
            notes=list(self.notes))

    def to_spec(self, name: str = LOCAL_NAME) -> HardwareSpec:
        from llmperf.specs.loader import hardware_from_mapping
        return hardware_from_mapping(self.to_mapping(name), origin=name)


def _compute_row(p: ComputePoint) -> dict[str, Any]:
    """A timed GEMM or attention call as the provenance lists it."""
    return dict(op=p.op, dtype=p.dtype, rows=p.rows, shape=p.shape, seconds=_clean(p.seconds),
                median_s=_clean(p.typical_s), spread_s=_clean(p.spread_s), n=p.n,
                tflops_per_s=_clean(p.flops_per_s / 1e12), gb_per_s=_clean(p.bytes_per_s / 1e9),
                **({"group": p.group} if p.group else {}))


def _rows_table(table: dict[str, dict[str, dict[str, list[list[float]]]]], dtypes: Any
                ) -> dict[str, dict[str, dict[str, list[list[float]]]]]:
    """A dtype -> backend -> operator -> [[rows, seconds], ...] table as the efficiency block writes it
    (the fitted dtypes only; a figure rounded to 0 kept at 1 ns, which the parser's (0, 1) takes)."""
    return {d: {b: {op: [[int(r), max(_clean(v), 1e-9)] for r, v in pts] for op, pts in ops.items()}
                for b, ops in backends.items()} for d, backends in table.items() if d in dtypes}


def _plain(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x
