"""Predicted seconds of the operators and steps `profile` measures, under two time models.

`roofline` (e = 1, overhead 0, on the same hardware spec: for `local`, the ceilings calibrate
measured, i.e. uncalibrated but peak-measured) and `calibrated` (the spec's time model,
`llmperf.analysis.timemodel`). The calibrated terms come from `llmperf calibrate`'s own
micro-benchmarks only: nothing is fitted here, so the errors reported on the generations are
held-out errors. A fused measurement (`qkv_proj`, `gate_up_proj`, `shared_gate_up_proj`) is priced
as the sum of its parts (`FUSED_PARTS`), its input read once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from llmperf.analysis.memory import weight_bytes_per_gpu
from llmperf.analysis.operators import ForwardModel
from llmperf.analysis.roofline import OpCost
from llmperf.analysis.timemodel import ROOFLINE_MODEL, EfficiencyTimeModel, time_model_for
from llmperf.analysis.vocabulary import FUSED_PARTS, Op
from llmperf.specs import HardwareSpec, ModelSpec, Precision
from llmperf.specs.model import LayerKind


@dataclass
class Predictor:
    """Predicted seconds of operators under the roofline and the calibrated model. A per-layer operator
    is priced for one layer of a given kind (`LayerKind`: sliding or full attention, dense or MoE FFN;
    default the model's first layer's), the kind of the layer it was measured in."""

    fm: ForwardModel
    hardware: HardwareSpec
    compute_dtype: str
    calibrated: EfficiencyTimeModel | None

    def cost(self, op: Op, batch: int, q_len: int, kv_len: int, kind: LayerKind | None = None) -> OpCost | None:
        """One call's cost (one layer of `kind`, or the model for embed/final_norm/lm_head); a fused name
        is the sum of its parts, its input read once. None when the model has no such operator."""
        for c in self._layer_and_model_ops(batch, q_len, kv_len, kind):
            if c.name == op.value:
                return c
        if op in FUSED_PARTS:
            parts = [self.cost(p, batch, q_len, kv_len, kind) for p in FUSED_PARTS[op]]
            parts = [p for p in parts if p is not None]
            if not parts:
                return None
            fields = ("flops", "weight_bytes", "act_write_bytes", "kv_read_bytes", "kv_write_bytes", "comm_bytes")
            return OpCost(name=op.value, kind=parts[0].kind, act_read_bytes=parts[0].act_read_bytes,
                          layer=parts[0].layer, rows=parts[0].rows,
                          **{f: sum(getattr(p, f) for p in parts) for f in fields})
        split = replace(self.fm, fused_qkv=False, fused_gate_up=False)  # a part of a fused GEMM (micro rows)
        for c in (split.head_ops(batch, q_len, kv_len) + split.layer_ops(batch, q_len, kv_len, kind)
                  + split.tail_ops(batch, q_len, kv_len)):
            if c.name == op.value:
                return c
        return None

    def _layer_and_model_ops(self, batch: int, q_len: int, kv_len: int,
                             kind: LayerKind | None = None) -> list[OpCost]:
        fm = self.fm
        return (fm.head_ops(batch, q_len, kv_len) + fm.layer_ops(batch, q_len, kv_len, kind)
                + fm.tail_ops(batch, q_len, kv_len))

    @staticmethod
    def rows(cost: OpCost, batch: int, q_len: int, fm: ForwardModel) -> float:
        """Rows through the operator, as the analytical model counts them (`OpCost.rows`: a MoE layer's
        routed experts see tokens x k, the LM head one row per sequence unless all logits); a cost
        without them, the step's tokens."""
        return cost.rows if cost.rows else batch * q_len

    def times(self, cost: OpCost, batch: int, q_len: int, micro: bool = False) -> tuple[float, float]:
        """(roofline, calibrated) seconds of one call; calibrated is NaN without a calibrated model.

        `micro`: an isolated kernel call (a micro-benchmark), priced with the per-kind overhead of one
        tiny framework call; the per-operator overheads are what the ENGINE pays around its kernels
        (reshapes, cache bookkeeping, several calls per operator), which a lone call does not."""
        rows = self.rows(cost, batch, q_len, self.fm)
        roof = float(ROOFLINE_MODEL.op_time_s(cost, self.hardware, self.compute_dtype, rows))
        tm = self.calibrated_for(q_len)
        if tm is not None and micro:
            tm = tm.per_kind_overheads()
        cal = float(tm.op_time_s(cost, self.hardware, self.compute_dtype, rows)) if tm else math.nan
        return roof, cal

    def calibrated_for(self, q_len: int) -> EfficiencyTimeModel | None:
        """The calibrated model for a step of `q_len` tokens a sequence: a decode step's (one), else a
        prefill's (`EfficiencyTimeModel.for_phase`: on a CPU every operator of a prefill is called one
        by one). None without a calibrated model."""
        tm = self.calibrated
        return tm.for_phase("decode" if q_len == 1 else "prefill") if tm is not None else None

    def forward(self, batch: int, q_len: int, kv_len: int) -> tuple[float, float]:
        """(roofline, calibrated) seconds of a whole forward pass: the model-level operators once, and
        each layer kind's operators times its number of layers (`ForwardModel.group_ops`)."""
        fm = self.fm
        parts = [(1, fm.head_ops(batch, q_len, kv_len) + fm.tail_ops(batch, q_len, kv_len))]
        parts += [(count, ops) for _kind, count, ops in fm.group_ops(batch, q_len, kv_len)]
        roof = cal = 0.0
        for mult, ops in parts:
            for c in ops:
                r, k = self.times(c, batch, q_len)
                roof, cal = roof + mult * r, cal + mult * k
        return roof, cal

    def step(self, batch: int, q_len: int, kv_len: int) -> tuple[float, float]:
        """A whole engine step: the forward pass, plus the calibrated host overhead per step."""
        roof, cal = self.forward(batch, q_len, kv_len)
        tm = self.calibrated_for(q_len)
        return roof, cal + (tm.step_overhead_s if tm is not None else math.nan)

    def pipeline_step(self, batch: int, q_len: int, kv_len: int) -> float:
        """A diagnostic, not a time model: the calibrated step with the host and the device as a two-stage
        pipeline. The host issues each operator in execution order (head, every layer in turn, tail) in
        its overlapped dispatch time; the device runs it once it is issued and the previous one is
        done (its device time and any serial overhead); the step ends with the last operator, plus the
        step overhead: the largest over k of the host's time to issue operators 1..k and the device's
        to run k..n. So it is at least `max(sum host, sum device)`, and at most `step`'s sum of
        per-operator maxima (which charges a device-bound operator its excess even where the host runs
        ahead, docs/time-models.md) plus one operator's min(host, device) (no operator runs before it
        is issued). NaN without a calibrated model."""
        tm = self.calibrated_for(q_len)
        if tm is None:
            return math.nan
        fm = self.fm
        ops = fm.head_ops(batch, q_len, kv_len)
        for kind in fm.model.layer_kinds():
            ops += fm.layer_ops(batch, q_len, kv_len, kind)
        ops += fm.tail_ops(batch, q_len, kv_len)
        issued = done = 0.0
        for c in ops:
            device, host, serial = tm.op_parts_s(c, self.hardware, self.compute_dtype, self.rows(c, batch, q_len, fm))
            issued += float(host)
            done = max(done, issued) + float(device) + float(serial)
        return done + tm.step_overhead_s


def own_engine_time_model(hardware: HardwareSpec, efficiency: str | None, compute_dtype: str,
                          backend: str = "sdpa") -> EfficiencyTimeModel:
    """The time model that prices a run of llmperf's own engine on `hardware`: `efficiency`, or by
    default `calibrated` where the spec carries a calibration (a CPU's or `calibrate --device cuda`'s:
    the engine's own overheads, measured for its attention `backend`), else the device's expected time
    (`default_efficiency`: `typical` on a GPU, the roofline on an uncalibrated CPU). On a GPU the
    engine profile is `eager` (llmperf's engine launches each operator from Python, no CUDA graph),
    never the deployment default a capacity answer takes; a CPU takes none."""
    from llmperf.analysis.timemodel import default_efficiency, is_cpu
    eff = efficiency or ("calibrated" if getattr(hardware, "efficiency", None) else default_efficiency(hardware))
    return time_model_for(hardware, eff, compute_dtype, backend=backend, engine=None if is_cpu(hardware) else "eager")


def calibrated_model(hardware: HardwareSpec, spec: ModelSpec, prec: Precision, compute_dtype: str,
                     backend: str) -> EfficiencyTimeModel:
    """The calibrated time model that predicts `spec` as the engine runs it: the backend's per-operator
    overheads, warm ones when the model's weights fit the private caches (`time_model_for`), those of
    the path its decode step takes (in one call or one by one: `for_model`). On a GPU the
    engine profiled is llmperf's own, eager one: its `eager` profile (the calibration's own overheads)."""
    from llmperf.analysis.timemodel import is_cpu
    return time_model_for(hardware, "calibrated", compute_dtype, backend=backend,
                          weight_bytes=weight_bytes_per_gpu(spec, prec),
                          engine=None if is_cpu(hardware) else "eager").for_model(spec)
