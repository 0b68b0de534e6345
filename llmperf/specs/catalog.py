"""The built-in models and devices as rows of exact numbers (for `llmperf models` / `llmperf hardware`).

Each row is a flat dict of plain values (ints, floats, strings, None), the same columns for JSON and
CSV. Counts are exact (parameters, bytes); capacities are GiB, bandwidths GB/s, peaks dense TFLOP/s.
"""

from __future__ import annotations

from typing import Any

from llmperf.specs.hardware import HardwareSpec
from llmperf.specs.loader import list_hardware, list_models, load_hardware, load_model
from llmperf.specs.model import ModelSpec

#: the dtypes whose dense peak each hardware row shows (None where the device has no units for it)
PEAK_DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8", "int8", "int4")


def model_row(m: ModelSpec) -> dict[str, Any]:
    q = m.quantization
    return dict(
        name=m.name, family=m.family, params=m.param_count, active_params=m.active_param_count,
        layers=m.num_layers, hidden=m.hidden_size, heads=m.num_heads, kv_heads=m.num_kv_heads,
        head_dim=m.head_dim, ffn=m.ffn_size, ffn_kind=m.ffn_kind, experts=m.num_experts,
        experts_per_token=m.experts_per_token, max_positions=m.max_positions, sliding_window=m.sliding_window,
        tied_embeddings=m.tied_embeddings, dtype=m.dtype,
        quantization=None if q is None else f"{q.method} int{q.bits} g{q.group_size or 'channel'}",
        kv_bytes_per_token_fp16=int(m.kv_bytes_per_token("fp16")), source=m.source)


def hardware_row(h: HardwareSpec) -> dict[str, Any]:
    row: dict[str, Any] = dict(name=h.name, vendor=h.vendor, variant=h.variant)
    for dtype in PEAK_DTYPES:
        row[f"{dtype}_tflops"] = h.peak_tflops.get(dtype)
    row.update(bandwidth_gbps=h.memory_bandwidth_gbps, memory_gib=h.memory_gib,
               ridge_fp16=h.ridge_point("fp16"), interconnect_gbps=h.interconnect_gbps, num_sms=h.num_sms,
               l2_cache_mib=h.l2_cache_mib, source=h.source)
    return row


def model_rows() -> list[dict[str, Any]]:
    """One row per built-in model, in name order."""
    return [model_row(load_model(name)) for name in list_models()]


def hardware_rows() -> list[dict[str, Any]]:
    """One row per built-in device, in name order."""
    return [hardware_row(load_hardware(name)) for name in list_hardware()]
