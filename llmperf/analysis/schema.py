"""The one result schema of `estimate` and `sweep`: one row per configuration, the same columns for
one configuration or ten thousand, as a DataFrame, strict JSON (no NaN or infinity: a missing value
is `null`) or CSV (the same columns, empty for a missing value).

JSON document: `{"schema_version": 1, "configurations": [row, ...]}` plus, with per-operator detail,
`"ops": [{"configuration": index, "phase", "op", ...}, ...]`. `COLUMNS` describes every column
(unit included); the documentation's Output schemas page renders it as it is (docs/schemas.md).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from llmperf.analysis.sweep import SCHEMA_VERSION
from llmperf.outputs import json_text, jsonable

#: column -> description (with its unit), in schema order
COLUMNS: dict[str, str] = {
    "model": "model name", "hardware": "device name",
    "precision": "weights/activations/KV formats (with group size and zero points when quantised)",
    "weights": "weight format", "activations": "activation format (matrix work runs at it)", "kv": "KV cache format",
    "embeddings": "embedding / lm_head format",
    "group_size": "int weights: inputs per scale (null: per channel / none)",
    "tp": "tensor-parallel degree", "pp": "pipeline-parallel degree", "gpus": "GPUs, tp * pp",
    "ep": "expert-parallel degree within the tp group", "dp_attention": "attention data-parallel over the tp group",
    "ep_busiest_rows": "expert parallelism: the busiest GPU's routed rows over uniform routing's mean at a decode "
                       "step (under uniform random routing or expert_load, llmperf.analysis.routing; 1 without ep)",
    "ep_busiest_experts": "expert parallelism: the busiest GPU's experts touched over uniform routing's mean at a "
                          "decode step (1 without ep)",
    "expert_load": "the measured router load that priced the experts, its file (null: uniform random routing)",
    "eplb": "EPLB's redundant experts per MoE layer (null: experts placed contiguously, no balancer)",
    "attention": "fused | naive", "attention_flops": "executed | dense",
    "all_logits": "logits at every prefill position",
    "fused_qkv": "one QKV GEMM", "fused_gate_up": "one gate+up GEMM",
    "mla_mode": "MLA: auto (unabsorbed prefill, absorbed decode) | absorbed | unabsorbed",
    "kv_window": "sliding / chunked layers' KV: capped (their window) | full (full pages)",
    "sliding_window": "attention window, tokens (null: full)", "time_model": "time model that produced the times",
    "engine": "engine profile that priced its host terms (none: the roofline; llmperf: a CPU's own engine)",
    "batch": "sequences", "prompt_len": "prompt tokens", "gen_len": "generated tokens per sequence",
    "params_total": "parameters", "params_active": "parameters one token uses (MoE: routed experts only)",
    "ttft_s": "time to first token (prefill), s", "tpot_s": "mean decode step, s",
    "e2e_s": "TTFT + all decode steps, s",
    "decode_s": "all decode steps, s",
    "ttft_bound_s": "ttft_s under the roofline (the bound), s", "tpot_bound_s": "tpot_s under the roofline, s",
    "e2e_bound_s": "e2e_s under the roofline, s", "tpot_first_s": "first decode step, s",
    "tpot_last_s": "last decode step, s",
    "tokens_per_s": "batch * gen_len / e2e_s", "decode_tokens_per_s": "batch / tpot_s",
    "prefill_flops": "FLOP per tensor-parallel rank, all pipeline stages",
    "prefill_bytes": "bytes per tensor-parallel rank, all pipeline stages",
    "decode_flops": "FLOP per tensor-parallel rank, all stages, all steps",
    "decode_bytes": "bytes per tensor-parallel rank, all stages, all steps",
    "total_flops": "FLOP per tensor-parallel rank, all stages",
    "total_bytes": "bytes per tensor-parallel rank, all stages",
    "peak_fraction": "achieved FLOP/s per GPU / dense peak (total_flops / e2e_s / (pp * peak))",
    "prefill_intensity": "FLOP/B",
    "prefill_bound": "memory | compute | comm (where the largest share of the operators' time is)",
    "decode_intensity": "FLOP/B, first decode step", "decode_bound": "memory | compute | comm, first decode step",
    "compute_dtype": "format the matrix units run",
    "gemm": "linear layers as this device runs them: W8A8 (fp8 GEMMs), W8A16 (fp8 weight-only: no fp8 units), "
            "W4A16, W16A16, ...",
    "ridge_point": "peak / bandwidth, FLOP/B",
    "weights_gib": "weights on the most loaded GPU, GiB", "kv_bytes_per_token": "KV bytes per token per GPU",
    "kv_cache_gib": "paged KV (and linear layers' state) of the batch at the end, GiB",
    "activation_peak_gib": "activation reservation, GiB",
    "total_gib": "weights + KV + activations, GiB", "usable_gib": "mem_util * device, GiB", "device_gib": "GiB",
    "mem_util": "usable fraction of device memory",
    "max_batched_tokens": "per-step token budget (activation reservation)",
    "block_size": "paged KV block, tokens", "max_seq_len": "contiguous KV reservation per sequence, tokens",
    "fits": "batch <= max_batch", "max_batch": "sequences of this context that fit (paged KV)",
    "max_batch_contiguous": "sequences that fit reserving max_seq_len each",
    "kv_util_contiguous": "KV holding tokens / reserved, contiguous", "kv_util_paged": "the same, paged",
    "critical_batch_matmul": "decode batch where the linear layers turn compute-bound (null: none)",
    "critical_batch": "decode batch where the whole step turns compute-bound (null: none)",
    "attention_flops_crossover": "prompt where attention FLOPs = rest of the layer (null: none)",
    "attention_bytes_crossover": "context where attention bytes = rest of the layer (null: none)",
    "attention_critical_context": "decode context from which the step's attention is compute-bound (null: none)",
}


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows of `frame` as plain dicts (JSON-safe values)."""
    cols = list(frame.columns)
    return [{c: jsonable(v) for c, v in zip(cols, row)} for row in frame.itertuples(index=False, name=None)]


def document(frame: pd.DataFrame, ops: pd.DataFrame | None = None) -> dict[str, Any]:
    """The JSON document of a result (one or many configurations, optional per-operator rows)."""
    doc: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "configurations": records(frame)}
    if ops is not None:
        doc["ops"] = records(ops)
    return doc


def to_json(frame: pd.DataFrame, ops: pd.DataFrame | None = None) -> str:
    """Strict JSON (`llmperf.outputs.json_text`): a missing value is null, never bare `NaN`."""
    return json_text(document(frame, ops))


def to_csv(frame: pd.DataFrame) -> str:
    """The same columns as the JSON rows; a missing value is an empty field."""
    return frame.to_csv(index=False)
