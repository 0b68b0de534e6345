"""Numeric formats and their sizes in bytes; a `Precision` picks weights, activations and KV cache apart.

Bytes are floats because int4 packs two values in a byte (0.5 B). Compute runs at the activation
precision unless the device has a faster path (see `HardwareSpec.compute_dtype`).
"""

from __future__ import annotations

from dataclasses import dataclass

from llmperf.errors import SpecError

#: bytes per element of each storage format
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "tf32": 4.0,  # stored as fp32; tf32 is a compute mode of fp32 matrix units
    "fp16": 2.0,
    "bf16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
}

#: storage formats a user may choose for weights, activations or the KV cache
STORAGE_DTYPES = ("fp32", "fp16", "bf16", "fp8", "int8", "int4")

_ALIASES = {
    "float32": "fp32", "float": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16",
    "float8": "fp8", "float8_e4m3fn": "fp8", "e4m3": "fp8",
}


def normalize_dtype(name: str, field: str = "dtype") -> str:
    """Canonical short name (`fp16`, `bf16`, ...) of a dtype spelled any common way."""
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    if key not in DTYPE_BYTES:
        raise SpecError(f"{field}: unknown dtype {name!r} (choose from {', '.join(STORAGE_DTYPES)})")
    return key


def dtype_bytes(name: str) -> float:
    """Bytes per element of `name` (int4 -> 0.5)."""
    return DTYPE_BYTES[normalize_dtype(name)]


@dataclass(frozen=True, kw_only=True)
class Precision:
    """Storage formats of the three kinds of tensors an inference pass moves."""

    weights: str = "fp16"
    activations: str = "fp16"
    kv: str = "fp16"

    def __post_init__(self) -> None:
        for field in ("weights", "activations", "kv"):
            value = normalize_dtype(getattr(self, field), field=f"precision.{field}")
            object.__setattr__(self, field, value)

    @classmethod
    def uniform(cls, dtype: str) -> Precision:
        return cls(weights=dtype, activations=dtype, kv=dtype)

    @property
    def weight_bytes(self) -> float:
        return DTYPE_BYTES[self.weights]

    @property
    def act_bytes(self) -> float:
        return DTYPE_BYTES[self.activations]

    @property
    def kv_bytes(self) -> float:
        return DTYPE_BYTES[self.kv]

    def __str__(self) -> str:
        if self.weights == self.activations == self.kv:
            return self.weights
        return f"w:{self.weights}/a:{self.activations}/kv:{self.kv}"
