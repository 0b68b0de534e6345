"""The built-in models and devices as rows of exact numbers (for `llmperf models` / `llmperf hardware`).

Each row is a flat dict of plain values (ints, floats, strings, None), the same columns for JSON and
CSV. Counts are exact (parameters, bytes); capacities are GiB, bandwidths GB/s, peaks dense TFLOP/s.
"""

from __future__ import annotations

import math
from typing import Any

from llmperf.specs.hardware import HardwareSpec
from llmperf.specs.loader import list_hardware, list_models, load_hardware, load_model
from llmperf.specs.model import ModelSpec

#: the dtypes whose dense peak each hardware row shows (None where the device has no units for it)
PEAK_DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8", "fp4", "int8", "int4")


def attention_label(m: ModelSpec) -> str:
    """The attention and what it caches: `MLA 512+64` (latent + rotary key), `GQA 8x128` (KV heads x
    head_dim), `MHA 32x128`, `MQA 1x128`."""
    if m.is_mla:
        return f"MLA {m.kv_lora_rank}+{m.qk_rope_head_dim}"
    kind = "MHA" if m.num_kv_heads == m.num_heads else "MQA" if m.num_kv_heads == 1 else "GQA"
    return f"{kind} {m.num_kv_heads}x{m.head_dim}"


def local_label(m: ModelSpec) -> str:
    """Which layers see only part of the context: `sliding 1:1` (sliding : full layers, reduced), `chunked
    3:1`, `sliding all`; `-` when every layer attends to everything."""
    counts: dict[str, int] = {}
    for kind in m.layer_kinds():
        counts[kind.attention] = counts.get(kind.attention, 0) + 1
    local = [k for k in ("sliding", "chunked") if counts.get(k)]
    if not local:
        return "-"
    kind = local[0]
    n, full = counts[kind], m.num_layers - counts[kind]
    if not full:
        return f"{kind} all"
    g = math.gcd(n, full)
    return f"{kind} {n // g}:{full // g}"


def model_row(m: ModelSpec) -> dict[str, Any]:
    q = m.quantization
    kinds = m.layer_kinds()
    return dict(
        name=m.name, family=m.family, params=m.param_count, active_params=m.active_param_count,
        layers=m.num_layers, hidden=m.hidden_size, heads=m.num_heads, kv_heads=m.num_kv_heads,
        head_dim=m.head_dim, ffn=m.ffn_size, ffn_kind=m.ffn_kind, experts=m.num_experts,
        experts_per_token=m.experts_per_token, expert_ffn=m.expert_ffn_size if m.is_moe else None,
        shared_experts=m.shared_experts, moe_layers=m.num_moe_layers, max_positions=m.max_positions,
        sliding_window=m.sliding_window, attention=attention_label(m), local_attention=local_label(m),
        sliding_layers=sum(k.attention == "sliding" for k in kinds),
        chunked_layers=sum(k.attention == "chunked" for k in kinds), attention_chunk_size=m.attention_chunk_size,
        nope_layers=len(m.nope_layers), kv_lora_rank=m.kv_lora_rank, mtp_layers=m.mtp_layers,
        tied_embeddings=m.tied_embeddings, dtype=m.dtype,
        quantization=None if q is None else q.label,
        kv_elements_per_token_per_layer=m.kv_width_per_token_per_layer,
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
