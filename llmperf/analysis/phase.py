"""Roll-ups of operator costs into one forward pass (a phase: prefill, or one decode step).

A phase's time is the sum of its operators' roofline times (kernels run one after another), plus,
with pipeline parallelism of degree `pp`, `pp - 1` point-to-point transfers of the activations
between stages. Counts are per tensor-parallel rank and cover every layer of the model (all stages).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from llmperf.analysis.operators import ForwardModel
from llmperf.analysis.rollup import phase_bound, pipeline_transfer_s
from llmperf.analysis.roofline import OpTime, TimeModel, op_time, phase_time_model, step_overhead_s
from llmperf.analysis.vocabulary import Phase, as_phase
from llmperf.specs import HardwareSpec

if TYPE_CHECKING:
    import pandas as pd

PHASES = (Phase.prefill.value, Phase.decode.value)
__all__ = ["PHASES", "PhaseEstimate", "estimate_phase", "phase_time_s", "pipeline_transfer_s"]


@dataclass(frozen=True, kw_only=True)
class PhaseEstimate:
    """One forward pass at `(batch, q_len, kv_len)` on a device: per-operator times and totals."""

    phase: str
    batch: int
    q_len: int
    kv_len: int
    hardware: HardwareSpec
    compute_dtype: str
    ops: tuple[OpTime, ...]
    pipeline_s: float = 0.0  # activation transfers between pipeline stages
    step_overhead_s: float = 0.0  # the time model's fixed cost per forward pass, outside the operators
    layers: int = field(default=1)
    pp: int = 1  # pipeline stages: each GPU runs its stage's share while the others wait

    @property
    def flops(self) -> float:
        return float(sum(o.cost.flops for o in self.ops))

    @property
    def bytes_total(self) -> float:
        return float(sum(o.cost.bytes_total for o in self.ops))

    @property
    def weight_bytes(self) -> float:
        return float(sum(o.cost.weight_bytes for o in self.ops))

    @property
    def kv_bytes(self) -> float:
        return float(sum(o.cost.kv_read_bytes + o.cost.kv_write_bytes for o in self.ops))

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes_total if self.bytes_total else 0.0

    @property
    def time_s(self) -> float:
        return float(sum(o.time_s for o in self.ops)) + self.pipeline_s + self.step_overhead_s

    @property
    def compute_s(self) -> float:
        return float(sum(o.compute_s for o in self.ops))

    @property
    def memory_s(self) -> float:
        return float(sum(o.memory_s for o in self.ops))

    @property
    def memory_bound_fraction(self) -> float:
        """Share of the phase's time spent in memory-bound operators."""
        mem = sum(o.time_s for o in self.ops if o.bound == "memory")
        return float(mem / self.time_s) if self.time_s else 0.0

    @property
    def bound(self) -> str:
        """'memory', 'comm' or 'compute': the roof under which the largest share of the phase's
        operator time is spent (`rollup.phase_bound`, the same rule as every summary and sweep row)."""
        mem = sum(o.time_s for o in self.ops if o.bound == "memory")
        comm = sum(o.time_s for o in self.ops if o.cost.kind == "comm" and o.bound == "comm")
        return phase_bound(float(mem), float(sum(o.time_s for o in self.ops)), float(comm))

    @property
    def achieved_flops_per_s(self) -> float:
        return self.flops / self.time_s if self.time_s else 0.0

    @property
    def peak_flops_per_s(self) -> float:
        """The fastest dense peak this pass's matrix work runs at: the compute dtype's, or a module's
        own format (fp8-block, fp4) where the device has units for it."""
        hw = self.hardware
        dtypes = {self.compute_dtype} | {o.cost.compute_dtype for o in self.ops
                                         if o.cost.compute_dtype is not None and o.cost.compute_dtype in hw.peak_tflops}
        return max(hw.peak_flops_per_s(d) for d in dtypes)

    @property
    def peak_fraction(self) -> float:
        """Achieved FLOP/s per GPU as a fraction of the device's dense peak (`peak_flops_per_s`: at the
        compute dtype, or the faster format some modules run in): with `pp` stages the pass's FLOPs
        are spread over `pp` GPUs that run one after another."""
        return self.achieved_flops_per_s / (self.pp * self.peak_flops_per_s)

    def layer_frame(self) -> pd.DataFrame:
        """The operators of ONE transformer block of each layer kind (per-layer rows divided by the
        number of layers of their kind, `layers`); one block for a model whose layers are alike."""
        frame = self.to_frame()
        frame = frame[frame["scope"] == "layer"].copy()
        for col in ("flops", "weight_bytes", "act_bytes", "kv_bytes", "comm_bytes", "bytes_total",
                    "compute_s", "memory_s", "comm_s", "time_s"):
            frame[col] = frame[col] / frame["layers"]
        frame["time_share"] = frame["time_s"] / frame["time_s"].sum()
        return frame.reset_index(drop=True)

    @property
    def layer_time_s(self) -> float:
        """Time of one transformer block (the mean over the layers when they differ)."""
        return float(sum(o.time_s for o in self.ops if o.cost.per_layer)) / self.layers

    def op(self, name: str, layer: str | None = None) -> OpTime:
        """The operator `name` (of the layer kind labelled `layer`, alone or among the kinds of a shared
        operator's `a+b` label; default: the first one found)."""
        for o in self.ops:
            if o.cost.name == name and (layer is None or o.cost.layer == layer or layer in o.cost.layer.split("+")):
                return o
        raise KeyError(f"no operator {name!r} in this phase (have: {', '.join(o.cost.name for o in self.ops)})")

    def to_frame(self) -> pd.DataFrame:
        """One row per operator: FLOPs, bytes by kind, intensity, each roof's time, the bound."""
        import pandas as pd

        rows = []
        total = self.time_s
        for o in self.ops:
            c = o.cost
            rows.append(dict(
                phase=self.phase, op=c.name, kind=c.kind, scope="layer" if c.per_layer else "model",
                layer=c.layer, layers=float(c.calls) if c.per_layer else 1.0,
                flops=float(c.flops), weight_bytes=float(c.weight_bytes),
                act_bytes=float(c.act_read_bytes + c.act_write_bytes),
                kv_bytes=float(c.kv_read_bytes + c.kv_write_bytes), comm_bytes=float(c.comm_bytes),
                bytes_total=float(c.bytes_total), intensity=float(c.intensity),
                compute_s=float(o.compute_s), memory_s=float(o.memory_s), comm_s=float(o.comm_s),
                time_s=float(o.time_s), bound=o.bound,
                time_share=float(o.time_s) / total if total else 0.0))
        return pd.DataFrame(rows)

    def summary(self) -> dict[str, float | int | str]:
        """The phase's totals as a dict: shape, FLOPs, bytes, intensity, time, bound and fraction of the
        peak."""
        return dict(phase=self.phase, batch=self.batch, q_len=self.q_len, kv_len=self.kv_len,
                    flops=self.flops, bytes_total=self.bytes_total, intensity=self.intensity,
                    time_s=self.time_s, bound=self.bound, peak_fraction=self.peak_fraction)


def estimate_phase(fm: ForwardModel, hardware: HardwareSpec, batch: int, q_len: int, kv_len: int, *,
                   phase: Phase | str, pp: int = 1, compute_dtype: str | None = None,
                   time_model: TimeModel | None = None) -> PhaseEstimate:
    """Cost and time of one forward pass of `fm` at `(batch, q_len, kv_len)` on `hardware`.

    `phase` names what the step is (prefill, decode, mixed, verify): it is stated by the caller,
    never guessed from the shapes (a one-token prefill and a chunked prefill look like other steps)."""
    dtype = compute_dtype or hardware.compute_dtype(fm.precision.activations)
    time_model = phase_time_model(time_model, as_phase(phase).value)
    ops = tuple(op_time(c, hardware, dtype, time_model) for c in fm.forward_ops(batch, q_len, kv_len))
    return PhaseEstimate(phase=as_phase(phase).value, batch=batch, q_len=q_len, kv_len=kv_len, hardware=hardware,
                         compute_dtype=dtype, ops=ops, layers=fm.model.num_layers, pp=pp,
                         pipeline_s=float(pipeline_transfer_s(fm, hardware, batch, q_len, pp, time_model)),
                         step_overhead_s=step_overhead_s(time_model))


def phase_time_s(fm: ForwardModel, hardware: HardwareSpec, batch, q_len, kv_len, *,  # noqa: ANN001
                 pp: int = 1, compute_dtype: str, time_model: TimeModel | None = None) -> np.ndarray:
    """Vectorised phase time for array arguments (the same formulas as the roll-up)."""
    from llmperf.analysis.rollup import phase_arrays
    return phase_arrays(fm, hardware, batch, q_len, kv_len, pp=pp, compute_dtype=compute_dtype,
                        time_model=time_model).time_s
