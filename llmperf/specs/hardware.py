"""`HardwareSpec`: a device's dense peaks, memory bandwidth and capacity, interconnect, on-chip memory.

Numbers come from datasheets (each YAML file under `models_spec/hardware/` names its source) and are
dense peaks: the "with sparsity" figures are 2x and are never used as peaks. Units: FLOP/s and
bytes/s are decimal (1 TFLOP/s = 1e12 FLOP/s, 1 GB/s = 1e9 B/s); memory capacity is in GiB, as
`nvidia-smi` shows it. The ridge point `peak / bandwidth` (FLOP/B) separates memory-bound from
compute-bound work: A100-80GB SXM at fp16 is 312e12 / 2039e9 = 153 FLOP/B.

A custom device needs only what the roofline uses: `name`, `peak_tflops` (dense; `fp32`, the vector
peak elementwise operators run at, plus the matrix dtypes you use),
`memory_bandwidth_gbps` and `memory_gib`; every other field is optional. Every number must be finite
and positive (NaN and infinity are refused, naming the field).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from llmperf.errors import SpecError
from llmperf.numeric import check_number
from llmperf.specs.precision import Precision, normalize_dtype

COMPUTE_DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8", "int8", "int4", "fp4")

# Where a device has no units for a format, compute falls back to the next wider one it has
# (fp4 matrix units are Blackwell's: B200 has them, Hopper and older run fp4 work at fp8 or 16 bits).
_FALLBACK = {
    "fp4": ("fp4", "fp8", "fp16"),
    "int4": ("int4", "int8", "fp16"),
    "int8": ("int8", "fp16"),
    "fp8": ("fp8", "fp16"),
    "bf16": ("bf16", "fp16", "fp32"),
    "fp16": ("fp16", "bf16", "fp32"),
    "tf32": ("tf32", "fp32"),
    "fp32": ("fp32",),
}


@dataclass(frozen=True, kw_only=True)
class HardwareSpec:
    """One accelerator. `peak_tflops` maps compute dtype -> dense TFLOP/s (TOP/s for ints)."""

    name: str
    vendor: str = "NVIDIA"
    variant: str = ""
    peak_tflops: Mapping[str, float] = field(hash=False)
    memory_bandwidth_gbps: float  # GB/s, decimal
    memory_gib: float
    interconnect_gbps: float = 0.0  # GPU-to-GPU bandwidth per direction (NVLink / xGMI / PCIe), GB/s
    num_sms: int | None = None  # streaming multiprocessors (NVIDIA) or compute units (AMD); None = unknown
    sram_per_sm_kib: float | None = None  # shared memory + L1 per SM; None = unknown
    l2_cache_mib: float | None = None  # None = unknown
    device_names: tuple[str, ...] = ()  # substrings of torch.cuda.get_device_name() that identify it
    source: str = ""
    # Written by `llmperf calibrate` (see llmperf.analysis.timemodel): the measured time-model terms,
    # and how, when and with what each ceiling was measured. Datasheet specs leave both empty.
    efficiency: Mapping[str, Any] | None = field(default=None, hash=False, compare=False)
    calibration: Mapping[str, Any] | None = field(default=None, hash=False, compare=False)

    def __post_init__(self) -> None:
        from llmperf.specs.names import check_spec_name
        check_spec_name(self.name)
        if not isinstance(self.peak_tflops, Mapping):
            raise SpecError(f"{self.name}: peak_tflops must map dtypes to TFLOP/s, got {self.peak_tflops!r}")
        if not self.peak_tflops:
            raise SpecError(f"{self.name}: peak_tflops must list at least one dtype")
        peaks, given = {}, {}
        for dtype, value in dict(self.peak_tflops).items():
            key = normalize_dtype(dtype, f"{self.name}: peak_tflops") if dtype != "tf32" else "tf32"
            _check_number(self.name, f"peak_tflops.{dtype}", value, scale=1e12)
            if key in peaks:  # dtype names are case-insensitive: fp16 and FP16 are one dtype
                raise SpecError(f"{self.name}: peak_tflops lists {given[key]!r} and {dtype!r}, the same dtype "
                                f"({key}); keep one")
            peaks[key], given[key] = float(value), dtype
        object.__setattr__(self, "peak_tflops", peaks)
        for f, scale in (("memory_bandwidth_gbps", 1e9), ("memory_gib", 2**30), ("sram_per_sm_kib", 1024),
                         ("l2_cache_mib", 2**20)):
            if f in ("memory_bandwidth_gbps", "memory_gib") or getattr(self, f) is not None:
                _check_number(self.name, f, getattr(self, f), scale=scale)
        # every ridge point (peak FLOP/s over bytes/s) must be a number: a bandwidth so small that the
        # ratio overflows (1e-308 GB/s) describes no device and would turn every intensity into infinity
        top = max(peaks.values()) * 1e12
        if not math.isfinite(top / (self.memory_bandwidth_gbps * 1e9)):
            raise SpecError(f"{self.name}: memory_bandwidth_gbps is too small for its peak_tflops "
                            f"(their ratio overflows), got {self.memory_bandwidth_gbps!r}")
        # 0 means "no GPU-to-GPU link" (a single-GPU card): the only spec number allowed to be 0
        _check_number(self.name, "interconnect_gbps", self.interconnect_gbps, zero_ok=True, scale=1e9)
        n = self.num_sms
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n <= 0):
            raise SpecError(f"{self.name}: num_sms must be a positive integer, got {n!r}")
        names = self.device_names
        if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) and n for n in names):
            raise SpecError(f"{self.name}: device_names must be a list of names, got {names!r}")
        object.__setattr__(self, "device_names", tuple(names))
        for f in ("efficiency", "calibration"):
            if getattr(self, f) is not None and not isinstance(getattr(self, f), Mapping):
                raise SpecError(f"{self.name}: {f} must be a mapping, got {type(getattr(self, f)).__name__}")

    @property
    def mem_bandwidth_bytes_per_s(self) -> float:
        return self.memory_bandwidth_gbps * 1e9

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * 2**30

    @property
    def interconnect_bytes_per_s(self) -> float:
        return self.interconnect_gbps * 1e9

    @property
    def on_chip_bytes(self) -> float | None:
        """Shared memory / L1 across all SMs, the space FlashAttention tiles live in (None: unknown)."""
        if self.num_sms is None or self.sram_per_sm_kib is None:
            return None
        return self.num_sms * self.sram_per_sm_kib * 1024

    def compute_dtype(self, dtype: str) -> str:
        """The format matrix work at `dtype` runs in on this device (its own, or the next wider)."""
        key = normalize_dtype(dtype) if dtype != "tf32" else "tf32"
        for candidate in _FALLBACK[key]:
            if candidate in self.peak_tflops:
                return candidate
        raise SpecError(f"{self.name}: no compute peak for dtype {dtype!r} or a wider one")

    def matmul_dtype(self, precision: Precision, module: str | None = None) -> str:
        """The format `module`'s matmul runs in on this device: the one its weights' kernels compute
        in (`Precision.matmul_dtype`: fp4 for mxfp4 / nvfp4, fp8 for fp8-block) where this device has
        units for it, else the activations' format, the weights dequantised on the fly: MXFP4
        experts on an H100 run W4A16 at the bf16 peak (as the engines serve gpt-oss on Hopper;
        aiconfigurator's `w4a16_mxfp4`), not at the fp8 that `compute_dtype("fp4")` falls back to;
        fp8-block weights on an A100 run W8A16.
        Without `module`, or for a module at a plain format: `compute_dtype(activations)`, as before."""
        native = precision.matmul_dtype(module)
        if native != precision.activations and native in self.peak_tflops:
            return native
        return self.compute_dtype(precision.activations)

    def peak_flops_per_s(self, dtype: str = "fp16") -> float:
        """Dense peak FLOP/s for matrix work at `dtype` (falls back to a wider format if absent)."""
        return self.peak_tflops[self.compute_dtype(dtype)] * 1e12

    def ridge_point(self, dtype: str = "fp16") -> float:
        """Arithmetic intensity (FLOP/B) above which work at `dtype` is compute-bound."""
        return self.peak_flops_per_s(dtype) / self.mem_bandwidth_bytes_per_s

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain data (`dataclasses.asdict`)."""
        from dataclasses import asdict
        return asdict(self)


def _check_number(device: str, name: str, value: Any, zero_ok: bool = False, scale: float = 1.0) -> None:
    """A finite real number, > 0 (or >= 0 with `zero_ok`), still finite in base units (`value * scale`,
    e.g. TFLOP/s -> FLOP/s); NaN and infinity are refused (`llmperf.numeric.check_number`)."""
    check_number(f"{device}: {name}", value, zero_ok=zero_ok, scale=scale)
