"""Attention backends: one function each over the step's metadata (`llmperf.engine.step.StepMeta`).

Letters: B sequences in the step, T new tokens per sequence (the step's `q_len`), H query heads,
H_kv key/value heads, G = H / H_kv, D head dim, S keys attended (the longest context in the step).

A step feeds T new tokens of each of B sequences; sequence b already holds `starts[b]` tokens, so its
queries sit at positions `starts[b] .. starts[b] + T - 1` and attend causally to keys `0 .. starts[b]
+ T - 1`. A fresh step (every start 0) attends to its own K and V without reading the cache back; a
decode step (T == 1) reads its cached keys; an extend step masks by position (`meta.mask`).

Backends (`get_backend(name)`: `(layer, q, k, v, meta, rec) -> out`, q `(B, T, H, D)`, k/v
`(B, T, H_kv, D)` already written to the cache, out `(B, T, H * D)`):

- `sdpa`: `torch.nn.functional.scaled_dot_product_attention`, decode with the G query heads of a KV
  head folded into the query length (as Flash-Decoding groups them, Dao et al. 2023); on a CPU with
  llmperf's kernels, their decode attention (`sdpa_decode`);
- `naive`: S = QK^T / sqrt(D) and P = softmax(S) materialised, softmax in fp32 as Hugging Face's
  eager attention does (`transformers/models/llama/modeling_llama.py`, `eager_attention_forward`);
- `triton`: the `kernels` package: FlashAttention (Dao, arXiv:2307.08691) prefill, PagedAttention
  (Kwon et al., arXiv:2309.06180) when the step carries block tables, Flash-Decoding when it carries
  cache rows; soft-capped scores are refused.

Each backend's attention over K and V at hand is a function of its own (`sdpa_core`, `naive_core`,
`flash_core`), which multi-head latent attention (`llmperf.engine.mla`) runs its two forms through.
How each backend handles windows, sinks and soft-caps: docs/engine.md, "Attention backends".
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F

from llmperf.engine.cpu import kernels as cpu_kernels
from llmperf.engine.step import LayerAttn, StepMeta

BACKENDS = ("sdpa", "naive", "triton")
INTERPRETER_NUM_SMS = 4


def _keys(layer: int, k: torch.Tensor, v: torch.Tensor, meta: StepMeta) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V `(B, H_kv, S, D)` this step attends to: the fresh ones, or the cache's."""
    if meta.fresh:
        return k.transpose(1, 2), v.transpose(1, 2)
    if meta.store is None:
        raise ValueError("meta: a step that continues cached sequences needs a cache")
    return meta.store.gather(layer, meta)


def sdpa_attention(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: StepMeta,
                   rec: Any) -> torch.Tensor:
    B, T, H, D = q.shape
    p = meta.attn(layer, D)
    eager = p.sinks is not None or p.softcap is not None  # SDPA has neither: the same math, eagerly
    with rec.op("attention", layer):
        if not eager and T == 1 and meta.paged and p.chunk is None and cpu_kernels.use_attention_for(q):
            pool_k, pool_v = meta.store.pools(layer)  # blocks read in place
            return cpu_kernels.decode_attention(q[:, 0], pool_k, pool_v, meta.seq_lens_tensor(), p.scale, p.window,
                                                meta.block_tables_for(layer)).view(B, 1, H * D)
        K, V = _keys(layer, k, v, meta)  # (B, H_kv, S, D)
        if T == 1 and not eager:
            return sdpa_decode(q[:, 0], K, V, meta, p.scale, p).view(B, 1, H * D)
        return sdpa_core(q, K, V, meta, p)


def sdpa_core(q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, meta: StepMeta, p: LayerAttn) -> torch.Tensor:
    """`q (B, T, H, D)` over `K (B, H_kv, S, D)`, `V (B, H_kv, S, Dv)` (any value width Dv) through
    SDPA -> `(B, T, H * Dv)`: causal from the step's positions, the layer's window or chunk (sinks and
    soft-caps eagerly, `_eager`). One query per sequence folds the G query heads of each KV head
    into the query axis, so the keys are read once per KV head with no copy. Multi-head latent
    attention runs both its forms through here (`llmperf.engine.mla`)."""
    B, T, H, _ = q.shape
    H_kv, S, Dv = K.shape[1], K.shape[2], V.shape[-1]
    if p.sinks is not None and p.softcap is None and _LSE_SDPA is not None and q.is_cpu:
        return _sdpa_sinks(q, K, V, meta, p).reshape(B, T, H * Dv)
    if p.sinks is not None or p.softcap is not None:
        return _eager(q, K, V, meta, p).reshape(B, T, H * Dv)
    if T == 1:
        return _sdpa_folded(q[:, 0], K, V, meta.mask(S, p), p.scale).view(B, 1, H * Dv)
    qt = q.transpose(1, 2)  # (B, H, T, D)
    if meta.fresh and meta.uniform and not meta.limited(p):
        o = F.scaled_dot_product_attention(qt, K, V, is_causal=True, enable_gqa=H_kv < H, scale=p.scale)
    elif _windowed(meta, p, T, S):  # a sliding layer's long prompt: each block of queries over its keys only
        o = torch.cat([F.scaled_dot_product_attention(qt[:, :, q0:q1], K[:, :, k0:q1], V[:, :, k0:q1], attn_mask=m,
                                                      enable_gqa=H_kv < H, scale=p.scale)
                       for q0, q1, k0, m in _window_blocks(T, p.window, q.device)], dim=2)
    else:
        o = F.scaled_dot_product_attention(qt, K, V, attn_mask=meta.mask(S, p), enable_gqa=H_kv < H, scale=p.scale)
    return o.transpose(1, 2).reshape(B, T, H * Dv)  # (B, T, H*Dv)


def _windowed(meta: StepMeta, p: LayerAttn, T: int, S: int) -> bool:
    """A fresh prefill of equal prompts past twice its layer's sliding window (and no chunk): one masked
    square over every key would compute T x T scores of which each query keeps W, so it runs in blocks
    of W queries, each over the W - 1 keys before it and its own (`_window_blocks`)."""
    return (p.window is not None and p.chunk is None and meta.fresh and meta.uniform and T == S
            and T > 2 * p.window)


def _window_blocks(T: int, W: int, device: torch.device) -> list[tuple[int, int, int, torch.Tensor]]:
    """(first query, end, first key, mask (1, 1, queries, keys) bool) of each block of W queries of a fresh
    prompt of T tokens under a sliding window W: query i sees keys i - W < j <= i."""
    out = []
    for q0 in range(0, T, W):
        q1, k0 = min(T, q0 + W), max(0, q0 - W + 1)
        i = torch.arange(q0, q1, device=device)[:, None]
        j = torch.arange(k0, q1, device=device)[None, :]
        out.append((q0, q1, k0, ((j <= i) & (j > i - W))[None, None]))  # (1, 1, queries, keys)
    return out


#: torch's CPU flash attention, which also returns each row's log-sum-exp (None where torch lacks it)
_LSE_SDPA = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _sdpa_sinks(q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, meta: StepMeta, p: LayerAttn) -> torch.Tensor:
    """Attention with learned sinks in one fused call: a sink joins the softmax's denominator and adds
    no value, so the output is SDPA's times exp(lse) / (exp(lse) + exp(sink)) = sigmoid(lse - sink),
    lse the log-sum-exp of the row's scaled scores (torch's CPU flash attention returns it; GQA native).
    `q (B, T, H, D)` over `K`, `V (B, H_kv, S, Dv)` -> `(B, T, H, Dv)`; equal to `_eager` to rounding."""
    qt = q.transpose(1, 2)  # (B, H, T, D)
    T, S = q.shape[1], K.shape[2]
    if _windowed(meta, p, T, S):  # a sliding layer's long prompt: each block of queries over its keys only
        return torch.cat([_sinks_call(qt[:, :, q0:q1], K[:, :, k0:q1], V[:, :, k0:q1], m, False, p)
                          for q0, q1, k0, m in _window_blocks(T, p.window, q.device)], dim=1)
    causal = meta.fresh and meta.uniform and not meta.limited(p)
    return _sinks_call(qt, K, V, None if causal else meta.mask(S, p), causal, p)


def _sinks_call(qt: torch.Tensor, K: torch.Tensor, V: torch.Tensor, mask: torch.Tensor | None, causal: bool,
                p: LayerAttn) -> torch.Tensor:
    """`_sdpa_sinks`' fused call: `qt (B, H, T, D)` over `K`, `V`, a bool mask (or None: every key, or
    causal) -> `(B, T, H, Dv)`."""
    bias = None if mask is None else torch.zeros(mask.shape, dtype=qt.dtype, device=qt.device).masked_fill(
        ~mask, -math.inf)  # the op takes an additive mask of the query's dtype
    o, lse = _LSE_SDPA(qt, K, V, 0.0, causal, attn_mask=bias, scale=p.scale)  # (B, H, T, Dv), (B, H, T) fp32
    keep = torch.sigmoid(lse - p.sinks.float()[None, :, None])  # the share of the row's mass not on the sink
    return (o.float() * keep[..., None]).to(qt.dtype).transpose(1, 2)


def _sdpa_folded(q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, mask: torch.Tensor | None,
                 scale: float) -> torch.Tensor:
    """SDPA of one query per sequence and head `q (B, H, D)` with the G query heads of each KV head
    as its query axis `(B, H_kv, G, D)` -> `(B, H, Dv)`."""
    B, H, D = q.shape
    qg = q.reshape(B, K.shape[1], H // K.shape[1], D)
    o = F.scaled_dot_product_attention(qg, K, V, attn_mask=mask, scale=scale)  # (B, H_kv, G, Dv)
    return o.reshape(B, H, V.shape[-1])


def sdpa_decode(q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, meta: StepMeta, scale: float,
                p: LayerAttn | None = None) -> torch.Tensor:
    """The `sdpa` backend's decode attention, `q (B, H, D)` over `K`, `V (B, H_kv, S, D)` -> `(B, H*D)`
    (`calibrate` and `profile` time it through here too). On a CPU with llmperf's kernels, their decode
    attention (`cpu.kernels.decode_attention`, the mask from the step's lengths and window): one call
    where SDPA's takes 60-65 us in a decode step after the weights flushed the caches, against ~20 hot.
    Elsewhere SDPA, the G query heads of each KV head folded into the query axis `(B, H_kv, G, D)`,
    so the cache is read once per KV head with no copy. `p`: the layer's window or chunk (default:
    the step's window)."""
    window = meta.window if p is None else p.window
    if (p is None or p.chunk is None) and cpu_kernels.use_attention_for(q):
        return cpu_kernels.decode_attention(q, K, V, meta.seq_lens_tensor(), scale, window)
    B, H, D = q.shape
    return _sdpa_folded(q, K, V, meta.mask(K.shape[2], p), scale).reshape(B, H * D)


def _probs(scores: torch.Tensor, mask: torch.Tensor | None, p: LayerAttn, dtype: torch.dtype) -> torch.Tensor:
    """softmax over `scores (B, H_kv, G, T, S)` in fp32 with the layer's soft-cap (before the mask, as
    Gemma 2) and sinks (an extra logit per head in the denominator, as gpt-oss), cast to `dtype`."""
    s = scores.float()
    if p.softcap is not None:
        s = torch.tanh(s / p.softcap) * p.softcap
    if mask is not None:
        s = s.masked_fill(~mask[:, :, None], -math.inf)  # mask (B, 1, T, S) -> (B, 1, 1, T, S)
    if p.sinks is None:
        return torch.softmax(s, dim=-1).to(dtype)
    B, H_kv, G, T, _ = s.shape
    sink = p.sinks.float().view(1, H_kv, G, 1, 1).expand(B, H_kv, G, T, 1)
    both = torch.cat((s, sink), dim=-1)
    return torch.softmax(both - both.amax(dim=-1, keepdim=True), dim=-1)[..., :-1].to(dtype)


def _eager(q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, meta: StepMeta, p: LayerAttn) -> torch.Tensor:
    """Attention with the scores materialised, `q (B, T, H, D)` over `K (B, H_kv, S, D)`, `V (B, H_kv,
    S, Dv)` -> `(B, T, H, Dv)`: the math every fused kernel must equal (soft-caps and sinks included)."""
    B, T, H, D = q.shape
    H_kv, S = K.shape[1], K.shape[2]
    G = H // H_kv
    qg = q.transpose(1, 2).reshape(B, H_kv, G, T, D)
    scores = torch.matmul(qg, K[:, :, None].transpose(-1, -2)) * p.scale  # (B, H_kv, G, T, S)
    probs = _probs(scores, meta.mask(S, p), p, q.dtype)
    o = torch.matmul(probs, V[:, :, None])  # (B, H_kv, G, T, Dv)
    return o.reshape(B, H, T, V.shape[-1]).transpose(1, 2)


def naive_attention(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: StepMeta,
                    rec: Any) -> torch.Tensor:
    K, V = _keys(layer, k, v, meta)  # (B, H_kv, S, D)
    return naive_core(layer, q, K, V, meta, meta.attn(layer, q.shape[-1]), rec)


def naive_core(layer: int, q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, meta: StepMeta, p: LayerAttn,
               rec: Any) -> torch.Tensor:
    """The `naive` backend's attention, `q (B, T, H, D)` over `K (B, H_kv, S, D)`, `V (B, H_kv, S, Dv)`
    (any value width Dv) -> `(B, T, H * Dv)`: scores, softmax and the value product materialised,
    each recorded as its own operator."""
    B, T, H, D = q.shape
    H_kv, S, Dv = K.shape[1], K.shape[2], V.shape[-1]
    G = H // H_kv
    qg = q.transpose(1, 2).reshape(B, H_kv, G, T, D)
    with rec.op("attn_score", layer):
        scores = torch.matmul(qg, K[:, :, None].transpose(-1, -2)) * p.scale  # (B, H_kv, G, T, S)
    if p.softcap is not None:
        with rec.op("attn_softcap", layer):
            scores = torch.tanh(scores.float() / p.softcap) * p.softcap
    with rec.op("attn_softmax", layer):
        probs = _probs(scores, meta.mask(S, p), replace(p, softcap=None), q.dtype)  # (B, H_kv, G, T, S)
    with rec.op("attn_value", layer):
        o = torch.matmul(probs, V[:, :, None])  # (B, H_kv, G, T, Dv)
    return o.reshape(B, H, T, Dv).transpose(1, 2).reshape(B, T, H * Dv)


def _kernels() -> Any:
    try:
        import kernels
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError(f"attention='triton' needs the `kernels` package and triton ({exc})") from None
    return kernels


def _decode_splits(kernels: Any, meta: StepMeta, num_kv_heads: int, device: torch.device, p: LayerAttn) -> int:
    """The kernels' split heuristic from the lengths the host already knows: passing it (with
    validate=False) spares the kernels a device-to-host read of seq_lens in every layer. A sliding or
    chunked layer's query sees at most its window or chunk, so that is what is split."""
    span = p.window if p.window is not None else p.chunk
    keys = meta.max_seq_len if span is None else min(meta.max_seq_len, span)
    memo = ("splits", keys)
    if memo not in meta._memo:
        meta._memo[memo] = kernels.num_kv_splits(meta.batch, num_kv_heads, keys, _num_sms(device))
    return meta._memo[memo]


@functools.lru_cache(maxsize=None)
def _cuda_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _num_sms(device: torch.device) -> int:
    """Multiprocessors of a CUDA device; on CPU (the Triton interpreter) a small number, so that
    longer sequences still take the split path."""
    if device.type != "cuda":
        return INTERPRETER_NUM_SMS
    return _cuda_sms(device.index if device.index is not None else torch.cuda.current_device())


def triton_attention(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: StepMeta,
                     rec: Any) -> torch.Tensor:
    """The `kernels` package. The layer's sliding window, chunk and sinks go to the kernels (which
    skip the keys a query cannot see); soft-capped scores have no kernel and are refused by name."""
    kernels = _kernels()
    B, T, H, D = q.shape
    H_kv = k.shape[2]
    p = meta.attn(layer, D)
    if p.softcap is not None:
        raise ValueError(f"attn_softcap: the triton backend has no soft-capping kernels (layer {layer} caps its "
                         f"scores at {p.softcap}; use attention='sdpa' or 'naive')")
    features = dict(sm_scale=p.scale, window=p.window, chunk=p.chunk, sinks=p.sinks)
    with rec.op("attention", layer):
        if meta.fresh:
            return flash_core(kernels, q, k.transpose(1, 2), v.transpose(1, 2), meta, **features)
        if T == 1 and meta.paged:
            k_pool, v_pool = meta.store.pools(layer)  # (num_blocks, block_size, H_kv, D) each
            o = kernels.paged_attention(q.reshape(B, H, D), k_pool, v_pool, meta.block_tables_for(layer),
                                        meta.seq_lens_tensor(), _decode_splits(kernels, meta, H_kv, q.device, p),
                                        validate=False, **features)
            return o.reshape(B, 1, H * D)
        if T == 1 and meta.contiguous:
            k_rows, v_rows = meta.store.rows_of(layer, meta)  # (B, H_kv, S_max, D) each
            o = kernels.flash_decoding(q.reshape(B, H, D), k_rows, v_rows, meta.seq_lens_tensor(),
                                       _decode_splits(kernels, meta, H_kv, q.device, p), validate=False, **features)
            return o.reshape(B, 1, H * D)
        K, V = _keys(layer, k, v, meta)  # (B, H_kv, S, D)
        return flash_core(kernels, q, K, V, meta, **features)


def flash_core(kernels: Any, q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, meta: StepMeta,
               **features: Any) -> torch.Tensor:
    """`kernels.flash_attention` of `q (B, T, H, D)` over `K`, `V (B, H_kv, S, D)`, causal aligned
    bottom-right (the queries are the last T of each sequence's keys) -> `(B, T, H * D)`: one launch
    when every sequence has the same context, else one per sequence over exactly its own keys.
    `features`: the kernel's `sm_scale`, `window`, `chunk`, `sinks`."""
    B, T, H, D = q.shape
    qt = q.transpose(1, 2)  # (B, H, T, D)
    if meta.uniform:
        o = kernels.flash_attention(qt, K, V, causal=True, **features)
        return o.transpose(1, 2).reshape(B, T, H * D)
    outs = [kernels.flash_attention(qt[b:b + 1], K[b:b + 1, :, :n], V[b:b + 1, :, :n], causal=True, **features)
            for b, n in enumerate(meta.seq_lens)]  # each (1, H, T, D)
    return torch.cat(outs).transpose(1, 2).reshape(B, T, H * D)


AttentionFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, StepMeta, Any], torch.Tensor]

_BACKENDS: dict[str, AttentionFn] = {"sdpa": sdpa_attention, "naive": naive_attention, "triton": triton_attention}


def get_backend(name: str) -> AttentionFn:
    """The attention function called `name` (one of `BACKENDS`)."""
    if name not in _BACKENDS:
        raise ValueError(f"attention: must be one of {', '.join(BACKENDS)}, got {name!r}")
    if name == "triton":
        _kernels()
    return _BACKENDS[name]


def fused_op_names(backend: str) -> Sequence[str]:
    """The operator names the backend records for attention (`attention`, or the naive parts; a
    soft-capped layer's naive attention also records `attn_softcap`)."""
    return ("attn_score", "attn_softmax", "attn_value") if backend == "naive" else ("attention",)
