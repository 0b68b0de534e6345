"""Specs of models, devices and precisions (no torch). See `ModelSpec`, `HardwareSpec`, `Precision`."""

from llmperf.specs.hardware import HardwareSpec
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

__all__ = [
    "DEFAULT_HARDWARE", "DEFAULT_MODEL", "DTYPE_BYTES", "STORAGE_DTYPES", "HardwareSpec", "ModelSpec",
    "Precision", "dtype_bytes", "list_hardware", "list_models", "load_hardware", "load_model",
    "match_hardware", "normalize_dtype",
]
