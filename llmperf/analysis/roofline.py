"""The roofline: an operator's cost (FLOPs, bytes) and its time on a device (`OpCost`, `op_time`).

`time = max(flops / peak_flops, bytes / bandwidth)` (Williams, Waterman & Patterson, "Roofline: an
insightful visual performance model", CACM 2009; NVIDIA's "GPU Performance Background User's Guide").
An operator whose arithmetic intensity `flops / bytes` is below the device's ridge point
`peak / bandwidth` is memory-bound: A100-80GB SXM at fp16 has 312e12 / 2039e9 = 153 FLOP/B.

Conventions: 1 FLOP is one multiply or one add (a multiply-accumulate is 2 FLOPs, `A(m,k) @ B(k,n)`
is `2*m*k*n`); bytes are decimal. Every field may be a numpy array, so one code path serves a single
estimate and a 10,000-point sweep.

The time model hook: every operator time in llmperf goes through `op_time`, which asks a `TimeModel`
for the efficiencies of the operator at hand (an `Efficiency`):

    time = max(flops / (peak * e_compute), bytes / (bandwidth * e_memory),
               comm_latency_s + comm / (link * e_comm)) + overhead_s

`ROOFLINE` (e = 1, overhead = 0) is the pure roofline; the typical and calibrated models
(`llmperf.analysis.timemodel`) implement the same protocol. A time model may look at the operator's
kind, name, rows, GEMM shape (`OpCost.gemm`) and fused attention shape (`OpCost.attn`), never at the
context length, so the sum over a generation keeps its closed form (`sum_max_lines`); see
docs/time-models.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol, runtime_checkable

import numpy as np

from llmperf.analysis.attention_eff import AttnShape
from llmperf.analysis.gemm import GemmShape
from llmperf.errors import SpecError
from llmperf.specs import HardwareSpec

#: operator kinds that run on the matrix units (tensor cores); the rest run on the vector units
MATRIX_KINDS = ("matmul", "attention")
KINDS = ("matmul", "attention", "elementwise", "norm", "embedding", "comm")

Number = Any  # float or numpy array


@dataclass(frozen=True, kw_only=True)
class OpCost:
    """FLOPs and bytes of one operator, for one forward pass of one layer (or of the model, for
    embed/final_norm/lm_head). Bytes are split by what they hold so memory traffic can be explained."""

    name: str
    kind: str
    flops: Number = 0.0
    weight_bytes: Number = 0.0  # weights (and biases) read
    act_read_bytes: Number = 0.0  # activations read
    act_write_bytes: Number = 0.0  # activations written
    kv_read_bytes: Number = 0.0  # KV cache read
    kv_write_bytes: Number = 0.0  # KV cache written
    comm_bytes: Number = 0.0  # bytes each GPU sends over the interconnect (collectives)
    comm_gpus: int = 0  # GPUs in the collective (TP or EP degree); what a time model prices its latency by
    per_layer: bool = True
    rows: Number = 0.0  # tokens through the operator (batch * q_len); what a time model may key on
    calls: Number = 1.0  # launches the counts cover: `scaled(L)` is L layers' calls, each paying the overhead
    layer: str = ""  # the layer kind of a per-layer operator (`LayerKind.label`: full, sliding-4096, ...;
    # kinds joined by `+` where the operator is the same in them: full+full/moe)
    compute_dtype: str | None = None  # its matrix work's format (per-module precision); None: the phase's
    # a weight GEMM's per-GPU shape (`llmperf.analysis.gemm`: N, K, groups, M per row), which a time model
    # may price it by; None for every other operator. Per call: `scaled` keeps it as it is
    gemm: GemmShape | None = None
    attn: AttnShape | None = None  # a fused attention call's shape (per GPU), for a time model that prices by it
    # a MoE layer's routed operator (the experts' GEMMs and activation, `moe_sum`): the experts its rows
    # spread over on this GPU (the expectation), which an engine running each expert apart calls it once
    # for (`EfficiencyTimeModel.launches`); None for every other operator. Per call, as `gemm`
    experts: Number | None = None

    @property
    def bytes_read(self) -> Number:
        return self.weight_bytes + self.act_read_bytes + self.kv_read_bytes

    @property
    def bytes_written(self) -> Number:
        return self.act_write_bytes + self.kv_write_bytes

    @property
    def bytes_total(self) -> Number:
        """Bytes moved to and from device memory (not over the interconnect)."""
        return self.bytes_read + self.bytes_written

    @property
    def intensity(self) -> Number:
        """Arithmetic intensity, FLOP per byte of memory traffic."""
        flops = np.asarray(self.flops, dtype=float)
        nbytes = np.asarray(self.bytes_total, dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.where(nbytes > 0, flops / np.where(nbytes > 0, nbytes, 1.0), 0.0)
        return float(out) if out.ndim == 0 else out

    def scaled(self, factor: Number, layer: str | None = None) -> OpCost:
        """Every count multiplied by `factor` (e.g. the number of layers), and the launches with them:
        a time model's per-launch overhead is paid `calls` times. `layer`: a new layer label."""
        new = object.__new__(OpCost)  # a frozen dataclass's __init__ costs more than its counts
        d = new.__dict__
        d.update(self.__dict__)
        for f in _COUNT_FIELDS:
            d[f] = d[f] * factor
        d["calls"] = d["calls"] * factor
        if layer is not None:
            d["layer"] = layer
        return new


_COUNT_FIELDS = ("flops", "weight_bytes", "act_read_bytes", "act_write_bytes", "kv_read_bytes",
                 "kv_write_bytes", "comm_bytes")


def peak_for(kind: str, hardware: HardwareSpec, compute_dtype: str) -> float:
    """FLOP/s available to an operator: matrix units at the compute dtype for matmuls and attention,
    the vector (fp32 CUDA-core) peak for elementwise work."""
    if kind in MATRIX_KINDS:
        return hardware.peak_flops_per_s(compute_dtype)
    if "fp32" not in hardware.peak_tflops:
        raise SpecError(f"{hardware.name}: peak_tflops has no fp32 entry, got {dict(hardware.peak_tflops)!r} "
                        "(norms, activations and softmax run at the fp32 vector peak: add peak_tflops.fp32)")
    return hardware.peak_flops_per_s("fp32")


@dataclass(frozen=True, kw_only=True)
class Efficiency:
    """Fractions of the roofs an operator reaches, and a fixed cost per launch (seconds).

    Each field may be a numpy array (one value per configuration of a sweep)."""

    e_compute: Number = 1.0
    e_memory: Number = 1.0
    overhead_s: Number = 0.0
    e_comm: Number = 1.0
    host_s: Number = 0.0  # host dispatch that overlaps the device work (asynchronous launches): a floor
    comm_latency_s: Number = 0.0  # a collective's latency per call, added to its interconnect time
    floor_s: Number = 0.0  # a kernel's minimum device time (not the host's launch): a floor, per launch
    latency_s: Number = 0.0  # a kernel's fixed device time added to its compute and memory roofs, per launch


@runtime_checkable
class TimeModel(Protocol):
    """What `op_time` asks to turn an `OpCost` into seconds.

    `name` is reported with every result (`time_model` in summaries, JSON and CSV).
    `efficiency(cost, hardware)` returns an `Efficiency` (or a tuple `(e_compute, e_memory,
    overhead_s)`): it may depend on `cost.kind`, `cost.name`, `cost.rows` (= batch * q_len), a fused
    attention's `cost.attn` (all but its context) and the device, but NOT on the context length
    (kv_len), so decode sums stay in closed form.
    Efficiencies must be in (0, 1] (a measured ceiling above the datasheet is a calibration error)
    and the overhead >= 0. An optional attribute `step_overhead_s` (seconds) is a fixed cost per
    forward pass outside the operators (the host's sampling and bookkeeping); every roll-up adds it
    once per step (`step_overhead_s(time_model)`).
    """

    name: str

    def efficiency(self, cost: OpCost, hardware: HardwareSpec) -> Efficiency | tuple[Number, Number, Number]:
        """The efficiencies and overhead `cost` runs at on `hardware`: an `Efficiency`, or an `(e_compute,
        e_memory, overhead_s)` tuple."""
        ...


@dataclass(frozen=True)
class RooflineTimeModel:
    """The pure roofline: every roof reached, no overhead."""

    name: str = "roofline"

    def efficiency(self, cost: OpCost, hardware: HardwareSpec) -> Efficiency:
        """Every roof reached in full, no overhead (e = 1), whatever the operator."""
        return _UNIT


_UNIT = Efficiency()
ROOFLINE = RooflineTimeModel()


def step_overhead_s(time_model: TimeModel | None) -> float:
    """The per-step fixed cost a time model declares (0 for the roofline or when absent)."""
    return float(getattr(time_model, "step_overhead_s", 0.0) or 0.0)


def engine_label(time_model: object) -> str:
    """The engine profile a time model names: its `engine`, "llmperf" for a CPU's calibration (llmperf's
    own engine measured), "none" for the roofline (the bound: no engine)."""
    engine = getattr(time_model, "engine", "")
    if engine:
        return engine
    return "none" if getattr(time_model, "name", "roofline") == "roofline" else "llmperf"


def phase_time_model(time_model: TimeModel | None, phase: str) -> TimeModel | None:
    """The time model for a step of `phase` (decode, prefill, mixed, verify): an engine may price a
    prefill differently from a decode step (a CUDA graph replays only the decode step); a time model
    without `for_phase` prices every step alike."""
    for_phase = getattr(time_model, "for_phase", None)
    return for_phase(phase) if for_phase is not None else time_model


def model_time_model(time_model: TimeModel | None, spec: Any) -> TimeModel | None:
    """The time model for the model `spec` as its engine runs it (a CPU calibration prices a model
    whose decode step runs in one call apart from one whose operators run one by one: `for_model`);
    a time model without `for_model` prices every model alike."""
    for_model = getattr(time_model, "for_model", None)
    return for_model(spec) if for_model is not None else time_model


def resolve_time_model(time_model: TimeModel | None, hardware: HardwareSpec | None = None,
                       compute_dtype: str | None = None) -> TimeModel:
    """`None` -> the pure roofline; a `TimeModel` as it is; a factory `f(hardware, compute_dtype)`
    (e.g. `functools.partial(timemodel.time_model_for, efficiency="typical")` reordered) is called
    for the device and dtype at hand, so one sweep over several devices gets each its own model."""
    if time_model is None:
        return ROOFLINE
    if not _is_time_model(time_model) and callable(time_model) and hardware is not None:
        time_model = time_model(hardware, compute_dtype)
    if not _is_time_model(time_model):
        raise TypeError(f"time_model: expected an object with .name and .efficiency(cost, hardware), "
                        f"got {type(time_model).__name__}")
    return time_model


def _is_time_model(obj: object) -> bool:
    """`isinstance(obj, TimeModel)`, without the runtime-checkable protocol's generic attribute walk
    (a tenth of a sweep's time): the protocol's members are `name` (data) and `efficiency` (a method:
    present and not None), which is what `typing`'s check asks of an object that does not subclass it."""
    return obj is ROOFLINE or (hasattr(obj, "name") and getattr(obj, "efficiency", None) is not None)


def _as_efficiency(value: Efficiency | tuple) -> Efficiency:  # noqa: ANN001
    if isinstance(value, Efficiency):
        return value
    e_c, e_m, overhead = value
    return Efficiency(e_compute=e_c, e_memory=e_m, overhead_s=overhead)


@dataclass(frozen=True, kw_only=True)
class OpTime:
    """An `OpCost` on a device: the time of each roof (already divided by the time model's
    efficiencies), the fixed overhead, and the bound that wins."""

    cost: OpCost
    compute_s: Number
    memory_s: Number
    comm_s: Number
    overhead_s: Number = 0.0
    host_s: Number = 0.0
    floor_s: Number = 0.0  # the kernels' minimum device time (`Efficiency.floor_s` per launch)

    @cached_property  # frozen: computed once (a per-op table asks every row's time several times)
    def time_s(self) -> Number:
        """`max(compute, memory, comm, host, floor) + overhead`: a serial overhead (a synchronous CPU's
        dispatch) adds; an overlapped host dispatch (a GPU's asynchronous launch) is only a floor, as
        is a kernel's minimum device time."""
        return np.maximum(np.maximum(np.maximum(np.maximum(self.compute_s, self.memory_s), self.comm_s),
                                     self.host_s), self.floor_s) + self.overhead_s

    @cached_property
    def bound(self) -> Any:
        """'compute', 'memory' or 'comm' (an array of them for array inputs).

        Ties go to memory: an operator is compute-bound only when its compute time strictly exceeds
        its memory time (intensity strictly above the ridge point), comm-bound only when the
        interconnect strictly exceeds both. The same rule everywhere (`bound_label`)."""
        return bound_label(self.compute_s, self.memory_s, self.comm_s)


def bound_label(compute_s: Number, memory_s: Number, comm_s: Number = 0.0) -> Any:
    """The one bound rule: 'comm' if the interconnect time strictly exceeds both others, else
    'compute' if compute strictly exceeds memory, else 'memory' (ties go to memory)."""
    c, m, k = np.broadcast_arrays(np.asarray(compute_s, dtype=float), np.asarray(memory_s, dtype=float),
                                  np.asarray(comm_s, dtype=float))
    out = np.where(k > np.maximum(c, m), "comm", np.where(c > m, "compute", "memory"))
    return str(out) if out.ndim == 0 else out


def memory_bound(compute_s: Number, memory_s: Number, comm_s: Number = 0.0) -> Any:
    """`bound_label(...) == "memory"` without the label strings (the roll-up's memory-bound time)."""
    c, m, k = np.asarray(compute_s, dtype=float), np.asarray(memory_s, dtype=float), np.asarray(comm_s, dtype=float)
    return ~(k > np.maximum(c, m)) & ~(c > m)


def _check_efficiency(eff: Efficiency, tm: TimeModel, cost: OpCost) -> None:
    """Efficiencies in (0, 1] and a non-negative overhead, or an error naming the model and operator.
    A plain float is checked as a float (the simulator's cost model times operators one by one)."""
    for field in ("e_compute", "e_memory", "e_comm"):
        value = getattr(eff, field)
        if type(value) is float and 0 < value <= 1:
            continue
        value = np.asarray(value, dtype=float)
        if not np.all((value > 0) & (value <= 1)):
            raise ValueError(f"time model {tm.name!r}: {field} for {cost.name} must be in (0, 1], got "
                             f"{float(value.ravel()[~((value > 0) & (value <= 1)).ravel()][0])!r}")
    for field in ("overhead_s", "host_s", "comm_latency_s", "floor_s", "latency_s"):
        value = getattr(eff, field)
        if type(value) is float and 0 <= value < math.inf:
            continue
        value = np.asarray(value, dtype=float)
        if not np.all(np.isfinite(value) & (value >= 0)):
            raise ValueError(f"time model {tm.name!r}: {field} for {cost.name} must be >= 0, got "
                             f"{getattr(eff, field)!r}")


def op_time(cost: OpCost, hardware: HardwareSpec, compute_dtype: str = "fp16",
            time_model: TimeModel | None = None) -> OpTime:
    """Time of `cost` on `hardware`: each roof separately (compute, memory, interconnect), divided by
    the efficiencies `time_model` gives (default: the pure roofline), plus its overhead.
    Every operator time in llmperf is computed here."""
    tm = resolve_time_model(time_model)
    eff = _as_efficiency(tm.efficiency(cost, hardware))
    if tm is not ROOFLINE:
        _check_efficiency(eff, tm, cost)
    # a module whose weights have their own matmul format (fp8-block: fp8; mxfp4 / nvfp4: fp4) runs
    # at it where the device has units for it, else at the phase's format, the weights dequantised
    # on the fly (W4A16 MXFP4 on an H100: the bf16 peak; `HardwareSpec.matmul_dtype`)
    dtype = compute_dtype
    if cost.compute_dtype is not None and cost.kind in MATRIX_KINDS and cost.compute_dtype in hardware.peak_tflops:
        dtype = cost.compute_dtype
    compute = cost.flops / (peak_for(cost.kind, hardware, dtype) * eff.e_compute)
    memory = cost.bytes_total / (hardware.mem_bandwidth_bytes_per_s * eff.e_memory)
    if type(eff.latency_s) is not float or eff.latency_s:  # a fused attention launch's fixed device time:
        lat = eff.latency_s * cost.calls  # both roofs shift, so max(a + b ctx, c + d ctx) keeps its form
        compute, memory = compute + lat, memory + lat
    cb = cost.comm_bytes
    if (cb > 0 if type(cb) is float else np.any(np.asarray(cb) > 0)) and hardware.interconnect_bytes_per_s <= 0:
        raise ValueError(f"hardware {hardware.name}: interconnect_gbps is 0, cannot time {cost.name}")
    comm = (cost.comm_bytes / (hardware.interconnect_bytes_per_s * eff.e_comm)
            if hardware.interconnect_bytes_per_s else 0.0 * cost.comm_bytes)
    lat = eff.comm_latency_s
    if type(lat) is not float or lat:  # a collective's latency, per call, where it moves any bytes
        comm = comm + (lat * cost.calls * (cb > 0) if type(cb) is float
                       else np.where(np.asarray(cb) > 0, lat * cost.calls, 0.0))
    # the overhead is per launch: an operator scaled to L layers pays it L times (L max(dev, host) =
    # max(L dev, L host) for an overlapped one)
    return OpTime(cost=cost, compute_s=compute, memory_s=memory, comm_s=comm, overhead_s=eff.overhead_s * cost.calls,
                  host_s=eff.host_s * cost.calls, floor_s=eff.floor_s * cost.calls)


def roofline_time_s(cost: OpCost, hardware: HardwareSpec, compute_dtype: str = "fp16",
                    time_model: TimeModel | None = None) -> Number:
    """`max(flops / peak, bytes / bandwidth)` for one operator (the kernel benchmarks' prediction);
    with a `time_model`, its efficiencies and overhead applied."""
    return op_time(cost, hardware, compute_dtype, time_model).time_s


def peak_in_use_flops_per_s(hardware: HardwareSpec, compute_dtype: str, precision: object | None = None) -> float:
    """The fastest dense peak a pass's matrix work runs at on `hardware`: the compute dtype's, or a
    module's own format (`Precision.modules`: fp8-block, mxfp4 / nvfp4) where the device has units for
    it (`HardwareSpec.matmul_dtype`). Achieved FLOP/s over it stays at most 1 under the roofline."""
    dtypes = {compute_dtype}
    for module, _ in getattr(precision, "modules", ()) or ():
        dtypes.add(hardware.matmul_dtype(precision, module))
    return max(hardware.peak_flops_per_s(d) for d in dtypes)
