"""Attention kernels that llmperf measures, and the torch references they are checked against.

Triton kernels (need `triton`; CUDA tensors, or CPU tensors with TRITON_INTERPRET=1 set before first use):
  flash_attention(q, k, v, causal=True, sm_scale=None, *, window=None, chunk=None, sinks=None, out=None)
                                                                                     prefill, FlashAttention-2
  flash_decoding(q, k_cache, v_cache, seq_lens, num_splits=None, *, sm_scale=None, window=None, chunk=None,
                 sinks=None, out=None, validate=True)                                decode, Flash-Decoding
  paged_attention(q, key_blocks, value_blocks, block_tables, seq_lens, num_splits=None, *, sm_scale=None,
                  window=None, chunk=None, sinks=None, out=None, validate=True)      decode, PagedAttention
  mla_decode(q_latent, q_rope, latent_blocks, block_tables, seq_lens, num_splits=None, *, sm_scale, ...)
                                                                                     decode, MLA (absorbed)
Optional in the first three, each off by default: a sliding `window` W (a query at position p sees keys
p - W < j <= p: Mistral, Hugging Face `sliding_window`), a `chunk` C (keys of its own chunk,
j // C == p // C, j <= p: Llama 4 `attention_chunk_size`), not both; learned attention `sinks` (H,), one
logit per query head in the softmax denominator with no value (gpt-oss; StreamingLLM, arXiv:2309.17453).
The kernels skip the keys a query cannot see rather than mask them; split-KV decode splits only the
visible keys and adds the sink once, in the combine.
Torch references (need only torch): naive_attention, sdpa_attention, naive_decode, sdpa_decode,
paged_decode_reference, gather_paged_kv, mla_decode_reference, gather_paged_latent, causal_mask (the
GQA ones take the same keyword arguments; SDPA has no sinks).
Split heuristics (pure Python): num_kv_splits, num_mla_splits.

The Triton modules are imported on first access, so `import kernels` works without triton, and the
interpreter switch (read by `@triton.jit` at import) can still be set after `import kernels`.
"""

from __future__ import annotations

import importlib
from typing import Any

from kernels.reference import (
    causal_mask,
    gather_paged_kv,
    gather_paged_latent,
    mla_decode_reference,
    naive_attention,
    naive_decode,
    paged_decode_reference,
    sdpa_attention,
    sdpa_decode,
)
from kernels.splits import num_kv_splits, num_mla_splits

_TRITON_EXPORTS = {
    "flash_attention": "kernels.prefill",
    "flash_decoding": "kernels.decode",
    "paged_attention": "kernels.paged",
    "mla_decode": "kernels.mla",
}

__all__ = [
    "flash_attention",
    "flash_decoding",
    "paged_attention",
    "mla_decode",
    "naive_attention",
    "sdpa_attention",
    "naive_decode",
    "sdpa_decode",
    "paged_decode_reference",
    "gather_paged_kv",
    "mla_decode_reference",
    "gather_paged_latent",
    "causal_mask",
    "num_kv_splits",
    "num_mla_splits",
]


def __getattr__(name: str) -> Any:
    module = _TRITON_EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kernels' has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as e:
        if e.name != "triton":
            raise
        raise ImportError(f"kernels.{name} needs triton (pip install 'llmperf-roofline[torch]')") from e
    globals()[name] = value
    return value
