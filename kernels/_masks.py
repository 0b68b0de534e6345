"""Triton helpers shared by the kernels: which keys a query sees, and the attention-sink logits.

A query at position p sees keys first_key(p) .. p, where first_key depends on the constexpr `LOCAL`
(`kernels._checks.LOCAL_*`): 0 for every earlier key; p - W + 1 (at least 0) for a sliding window of
W keys (Mistral, arXiv:2310.06825; Longformer, arXiv:2004.05150); p - p mod C for chunked attention
with chunks of C tokens (Llama 4 `attention_chunk_size`). `span` is W or C. first_key never
decreases with p, so a tile of consecutive queries sees keys first_key(first) .. last, and every one
of its queries sees first_key(last) .. first: the kernels skip the tiles outside the first range and
mask only the ones that straddle its edges (FlashAttention-2's skipping of fully masked tiles).

Sinks (gpt-oss; StreamingLLM, Xiao et al. 2023, arXiv:2309.17453): one logit per query head that joins
the softmax denominator, exp(sink - m), and contributes no value. The kernels keep their softmax state
in the log2 domain, so the logit is loaded as fp32 and multiplied by log2(e).
"""

from __future__ import annotations

import math

import triton
import triton.language as tl

from kernels._checks import LOCAL_CHUNK, LOCAL_WINDOW

assert (LOCAL_WINDOW, LOCAL_CHUNK) == (1, 2), "_first_key tests LOCAL against these values"
LOG2E = tl.constexpr(math.log2(math.e))


@triton.jit
def _first_key(pos, span, LOCAL: tl.constexpr):
    """The first key a query at position `pos` (a scalar or a tensor of positions) sees."""
    if LOCAL == 1:  # sliding window of `span` keys, the query itself included
        return tl.maximum(pos - span + 1, 0)
    elif LOCAL == 2:  # chunks of `span` tokens
        return (pos // span) * span
    else:
        return pos * 0


@triton.jit
def _load_sinks(Sinks, heads, stride_sink, mask):
    """The sink logits of query heads `heads`, in the log2 domain of the softmax state (fp32)."""
    return tl.load(Sinks + heads * stride_sink, mask=mask, other=0.0).to(tl.float32) * LOG2E
