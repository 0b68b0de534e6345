"""The roofline: an operator's cost (FLOPs, bytes) and its time on a device.

`time = max(flops / peak_flops, bytes / bandwidth)` (Williams, Waterman & Patterson, "Roofline: an
insightful visual performance model", CACM 2009; NVIDIA's "GPU Performance Background User's Guide").
An operator whose arithmetic intensity `flops / bytes` is below the device's ridge point
`peak / bandwidth` is memory-bound: A100-80GB SXM at fp16 has 312e12 / 2039e9 = 153 FLOP/B.

Conventions: 1 FLOP is one multiply or one add (a multiply-accumulate is 2 FLOPs, `A(m,k) @ B(k,n)`
is `2*m*k*n`); bytes are decimal. Every field may be a numpy array, so one code path serves a single
estimate and a 10,000-point sweep.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

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
    per_layer: bool = True

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

    def scaled(self, factor: Number) -> OpCost:
        """Every count multiplied by `factor` (e.g. the number of layers)."""
        return OpCost(name=self.name, kind=self.kind, per_layer=self.per_layer, **{
            f: getattr(self, f) * factor for f in _COUNT_FIELDS})


_COUNT_FIELDS = ("flops", "weight_bytes", "act_read_bytes", "act_write_bytes", "kv_read_bytes",
                 "kv_write_bytes", "comm_bytes")


def peak_for(kind: str, hardware: HardwareSpec, compute_dtype: str) -> float:
    """FLOP/s available to an operator: matrix units at the compute dtype for matmuls and attention,
    the vector (fp32 CUDA-core) peak for elementwise work."""
    if kind in MATRIX_KINDS:
        return hardware.peak_flops_per_s(compute_dtype)
    return hardware.peak_flops_per_s("fp32")


@dataclass(frozen=True, kw_only=True)
class OpTime:
    """An `OpCost` on a device: the time of each roof and the bound that wins."""

    cost: OpCost
    compute_s: Number
    memory_s: Number
    comm_s: Number

    @property
    def time_s(self) -> Number:
        return np.maximum(np.maximum(self.compute_s, self.memory_s), self.comm_s)

    @property
    def bound(self) -> Any:
        """'compute', 'memory' or 'comm' (an array of them for array inputs)."""
        labels = np.array(["compute", "memory", "comm"])
        idx = np.argmax(np.stack(np.broadcast_arrays(self.compute_s, self.memory_s, self.comm_s)), axis=0)
        out = labels[idx]
        return str(out) if np.ndim(out) == 0 else out


def op_time(cost: OpCost, hardware: HardwareSpec, compute_dtype: str = "fp16") -> OpTime:
    """Time of `cost` on `hardware`: each roof separately (compute, memory, interconnect)."""
    compute = cost.flops / peak_for(cost.kind, hardware, compute_dtype)
    memory = cost.bytes_total / hardware.mem_bandwidth_bytes_per_s
    if np.any(np.asarray(cost.comm_bytes) > 0) and hardware.interconnect_bytes_per_s <= 0:
        raise ValueError(f"hardware {hardware.name}: interconnect_gbps is 0, cannot time {cost.name}")
    comm = (cost.comm_bytes / hardware.interconnect_bytes_per_s) if hardware.interconnect_bytes_per_s else 0.0
    return OpTime(cost=cost, compute_s=compute, memory_s=memory, comm_s=comm)


def roofline_time_s(cost: OpCost, hardware: HardwareSpec, compute_dtype: str = "fp16") -> Number:
    """`max(flops / peak, bytes / bandwidth)` for one operator (the kernel benchmarks' prediction)."""
    return op_time(cost, hardware, compute_dtype).time_s
