"""Specs of models, devices and precisions (no torch). See `ModelSpec`, `HardwareSpec`, `Precision`,
`KVCacheSpec` (the KV bytes formula, once) and `QuantizationSpec` (AWQ / GPTQ checkpoints)."""

from llmperf.specs.families import FAMILIES, Family
from llmperf.specs.hardware import HardwareSpec
from llmperf.specs.kvcache import KVCacheSpec
from llmperf.specs.loader import (
    DEFAULT_HARDWARE,
    DEFAULT_MODEL,
    list_hardware,
    list_models,
    load_hardware,
    load_model,
    match_hardware,
)
from llmperf.specs.model import ModelSpec
from llmperf.specs.precision import DTYPE_BYTES, STORAGE_DTYPES, Precision, dtype_bytes, normalize_dtype
from llmperf.specs.quantization import QuantizationSpec

__all__ = [
    "DEFAULT_HARDWARE", "DEFAULT_MODEL", "DTYPE_BYTES", "FAMILIES", "STORAGE_DTYPES", "Family", "HardwareSpec",
    "KVCacheSpec", "ModelSpec", "Precision", "QuantizationSpec", "dtype_bytes", "list_hardware", "list_models", "load_hardware", "load_model",
    "match_hardware", "normalize_dtype",
]
