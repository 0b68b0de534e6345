"""`HardwareSpec`: a device's dense peaks, memory bandwidth and capacity, interconnect, on-chip memory.

Numbers come from datasheets (each YAML file under `models_spec/hardware/` names its source) and are
dense peaks: the "with sparsity" figures are 2x and are never used as peaks. Units: FLOP/s and
bytes/s are decimal (1 TFLOP/s = 1e12 FLOP/s, 1 GB/s = 1e9 B/s); memory capacity is in GiB, as
`nvidia-smi` shows it. The ridge point `peak / bandwidth` (FLOP/B) separates memory-bound from
compute-bound work: A100-80GB SXM at fp16 is 312e12 / 2039e9 = 153 FLOP/B.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from llmperf.errors import SpecError
from llmperf.specs.precision import normalize_dtype

COMPUTE_DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8", "int8", "int4")

# Where a device has no units for a format, compute falls back to the next wider one it has.
_FALLBACK = {
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
    num_sms: int  # streaming multiprocessors (NVIDIA) or compute units (AMD)
    sram_per_sm_kib: float  # shared memory + L1 per SM
    l2_cache_mib: float
    device_names: tuple[str, ...] = ()  # substrings of torch.cuda.get_device_name() that identify it
    source: str = ""
    # Written by `llmperf calibrate` (see llmperf.analysis.timemodel): the measured time-model terms,
    # and how, when and with what each ceiling was measured. Datasheet specs leave both empty.
    efficiency: Mapping[str, Any] | None = field(default=None, hash=False, compare=False)
    calibration: Mapping[str, Any] | None = field(default=None, hash=False, compare=False)

    def __post_init__(self) -> None:
        if not self.peak_tflops:
            raise SpecError(f"{self.name}: peak_tflops must list at least one dtype")
        peaks = {}
        for dtype, value in dict(self.peak_tflops).items():
            key = normalize_dtype(dtype, f"{self.name}: peak_tflops") if dtype != "tf32" else "tf32"
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise SpecError(f"{self.name}: peak_tflops.{dtype} must be a positive number, got {value!r}")
            peaks[key] = float(value)
        object.__setattr__(self, "peak_tflops", peaks)
        for f in ("memory_bandwidth_gbps", "memory_gib", "sram_per_sm_kib", "l2_cache_mib"):
            value = getattr(self, f)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise SpecError(f"{self.name}: {f} must be a positive number, got {value!r}")
        ic = self.interconnect_gbps
        if isinstance(ic, bool) or not isinstance(ic, (int, float)) or ic < 0:
            raise SpecError(f"{self.name}: interconnect_gbps must be >= 0, got {self.interconnect_gbps!r}")
        if isinstance(self.num_sms, bool) or not isinstance(self.num_sms, int) or self.num_sms <= 0:
            raise SpecError(f"{self.name}: num_sms must be a positive integer, got {self.num_sms!r}")
        object.__setattr__(self, "device_names", tuple(self.device_names))
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
    def on_chip_bytes(self) -> float:
        """Shared memory / L1 across all SMs, the space FlashAttention tiles live in."""
        return self.num_sms * self.sram_per_sm_kib * 1024

    def compute_dtype(self, dtype: str) -> str:
        """The format matrix work at `dtype` runs in on this device (its own, or the next wider)."""
        key = normalize_dtype(dtype) if dtype != "tf32" else "tf32"
        for candidate in _FALLBACK[key]:
            if candidate in self.peak_tflops:
                return candidate
        raise SpecError(f"{self.name}: no compute peak for dtype {dtype!r} or a wider one")

    def peak_flops_per_s(self, dtype: str = "fp16") -> float:
        """Dense peak FLOP/s for matrix work at `dtype` (falls back to a wider format if absent)."""
        return self.peak_tflops[self.compute_dtype(dtype)] * 1e12

    def ridge_point(self, dtype: str = "fp16") -> float:
        """Arithmetic intensity (FLOP/B) above which work at `dtype` is compute-bound."""
        return self.peak_flops_per_s(dtype) / self.mem_bandwidth_bytes_per_s

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict
        return asdict(self)
