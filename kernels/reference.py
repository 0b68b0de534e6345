"""Torch reference attention: the baselines the Triton kernels are checked and timed against.

`naive_*` is the "standard attention" of the FlashAttention paper (Dao et al. 2022, arXiv:2205.14135,
Algorithm 0): S = Q K^T and P = softmax(S) are materialised in memory, then O = P V. Scores and
outputs are in the inputs' dtype; the softmax runs in (at least) fp32 and P is cast back, as Hugging
Face's eager attention does. `sdpa_*` wraps `torch.nn.functional.scaled_dot_product_attention`, which
picks a fused backend where it can. All are pure functions of their tensors, usable as attention backends.

Letters: B batch, H query heads, H_kv key/value heads, G = H / H_kv, T_q / T_kv query / key lengths,
S_max contiguous-cache capacity, D head dim, P block size, N_blk pool blocks, M_blk block-table width.

Layouts (the same as the kernels'):
  prefill: q (B, H, T_q, D); k, v (B, H_kv, T_kv, D) -> (B, H, T_q, D). Causal masks are aligned
           bottom-right: query i sees keys j <= i + T_kv - T_q (needs T_q <= T_kv).
  decode:  q (B, H, D); k_cache, v_cache (B, H_kv, S_max, D); seq_lens (B,) int32 -> (B, H, D).
  paged:   key_blocks, value_blocks (N_blk, P, H_kv, D); block_tables (B, M_blk) int32; token t of
           sequence b is slot t % P of block block_tables[b, t // P].
  latent:  q_latent (B, H, R); q_rope (B, H, Dr); latent_blocks (N_blk, P, R + Dr) -> (B, H, R)
           (`mla_decode_reference`).
Query head h reads KV head h // G (GQA/MQA).

Optional, as in the kernels (`kernels._checks`): a sliding `window` or a `chunk`, and `sinks` (H,),
one logit per query head in the softmax denominator (gpt-oss: Hugging Face's
`models/gpt_oss/modeling_gpt_oss.py` eager attention). SDPA has no sinks, so `sdpa_*` refuse them.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

from kernels._checks import (
    LOCAL_NONE,
    Local,
    check_block_table_values,
    check_decode,
    check_local,
    check_mla,
    check_paged,
    check_prefill,
    check_seq_len_values,
    check_sinks,
)
from kernels._common import check_sm_scale, default_sm_scale


def causal_mask(T_q: int, T_kv: int, device: torch.device | str = "cpu", *, window: int | None = None,
                chunk: int | None = None) -> torch.Tensor:
    """(T_q, T_kv) bool, True where query i may see key j: j <= p = i + T_kv - T_q (bottom-right aligned),
    and with a `window` W also j > p - W, with a `chunk` C also j // C == p // C."""
    local = check_local(window, chunk)
    pos = torch.arange(T_q, device=device)[:, None] + (T_kv - T_q)  # (T_q, 1)
    keys = torch.arange(T_kv, device=device)[None, :]  # (1, T_kv)
    return (keys <= pos) & (keys >= local.first_keys(pos))


def _length_mask(seq_lens: torch.Tensor, S_max: int, local: Local | None = None) -> torch.Tensor:
    """(B, S_max) bool, True at the cached positions each sequence's query (at seq_lens[b] - 1) sees."""
    lens = seq_lens[:, None].long()  # (B, 1)
    keys = torch.arange(S_max, device=seq_lens.device)[None, :]  # (1, S_max)
    return (keys < lens) & (keys >= (local or Local()).first_keys(lens - 1))


def _softmax_with_sinks(s: torch.Tensor, sinks: torch.Tensor | None, G: int, dtype: torch.dtype) -> torch.Tensor:
    """softmax over the last dim of s (B, H_kv, G*T, S) in `dtype` (rows ordered (g, t)), with one sink
    logit per query head h = kv * G + g appended to its rows and dropped again (gpt-oss eager attention)."""
    if sinks is None:
        return torch.softmax(s, dim=-1, dtype=dtype)
    B, H_kv, rows, S = s.shape
    sink = sinks.to(dtype).view(1, H_kv, G, 1, 1).expand(B, H_kv, G, rows // G, 1).reshape(B, H_kv, rows, 1)
    return torch.softmax(torch.cat([s.to(dtype), sink], dim=-1), dim=-1)[..., :S]


def _refuse_sinks(sinks: torch.Tensor | None) -> None:
    if sinks is not None:
        raise ValueError("sinks: torch SDPA has no attention sinks (use the naive reference)")


def _softmax_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for fp16/bf16/fp32 inputs, fp64 for fp64 ones."""
    return torch.promote_types(dtype, torch.float32)


def naive_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True, sm_scale: float | None = None, *,
    window: int | None = None, chunk: int | None = None, sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Standard attention with S and P materialised. q (B, H, T_q, D); k, v (B, H_kv, T_kv, D)."""
    dims = check_prefill(q, k, v, causal)
    check_local(window, chunk, causal)
    check_sinks(sinks, dims.H, q.device)
    B, H, H_kv, T_q, T_kv, D = dims.B, dims.H, dims.H_kv, dims.T_q, dims.T_kv, dims.D
    scale = default_sm_scale(D, sm_scale)
    qg = q.reshape(B, H_kv, dims.G * T_q, D)  # (B, H_kv, G*T_q, D): a group's heads share one K, V
    s = torch.matmul(qg, k.transpose(-1, -2)) * scale  # (B, H_kv, G*T_q, T_kv)
    if causal:
        allowed = causal_mask(T_q, T_kv, q.device, window=window, chunk=chunk)  # (T_q, T_kv)
        s = s.view(B, H_kv, dims.G, T_q, T_kv).masked_fill(~allowed, float("-inf")).view(B, H_kv, -1, T_kv)
    p = _softmax_with_sinks(s, sinks, dims.G, _softmax_dtype(q.dtype)).to(q.dtype)  # (B, H_kv, G*T_q, T_kv)
    o = torch.matmul(p, v)  # (B, H_kv, G*T_q, D)
    return o.view(B, H, T_q, D)


def sdpa_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True, sm_scale: float | None = None, *,
    window: int | None = None, chunk: int | None = None, sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """torch SDPA with the kernels' conventions. q (B, H, T_q, D); k, v (B, H_kv, T_kv, D).

    T_q == T_kv causal uses `is_causal` (SDPA's own mask is top-left aligned, the same thing when the
    lengths match); T_q < T_kv, a window or a chunk pass the bottom-right mask explicitly. No sinks."""
    dims = check_prefill(q, k, v, causal)
    local = check_local(window, chunk, causal)
    check_sinks(sinks, dims.H, q.device)
    _refuse_sinks(sinks)
    scale = default_sm_scale(dims.D, sm_scale)
    mask = None
    if causal and (dims.T_q != dims.T_kv or local.mode != LOCAL_NONE):
        mask = causal_mask(dims.T_q, dims.T_kv, q.device, window=window, chunk=chunk)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=causal and mask is None, scale=scale, enable_gqa=dims.G > 1
    )


def _decode_setup(q, k_cache, v_cache, seq_lens, sm_scale, validate, window, chunk, sinks):  # noqa: ANN001, ANN202
    """Shapes and features checked (and lengths, when `validate`), plus the softmax scale and the
    (window or chunk) `Local`: the decode references' prologue."""
    dims = check_decode(q, k_cache, v_cache, seq_lens)
    local = check_local(window, chunk)
    check_sinks(sinks, dims.H, q.device)
    if validate:
        check_seq_len_values(seq_lens, dims.capacity, "S_max")
    return dims, default_sm_scale(dims.D, sm_scale), local


def naive_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float | None = None,
    *,
    window: int | None = None,
    chunk: int | None = None,
    sinks: torch.Tensor | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Standard attention of one token per sequence over the whole (B, H_kv, S_max, D) cache, masked by
    length (and window or chunk)."""
    dims, scale, local = _decode_setup(q, k_cache, v_cache, seq_lens, sm_scale, validate, window, chunk, sinks)
    B, H_kv, D = dims.B, dims.H_kv, dims.D
    S_max = dims.capacity
    qg = q.reshape(B, H_kv, dims.G, D)  # (B, H_kv, G, D)
    s = torch.matmul(qg, k_cache.transpose(-1, -2)) * scale  # (B, H_kv, G, S_max)
    s = s.masked_fill(~_length_mask(seq_lens, S_max, local)[:, None, None, :], float("-inf"))
    p = _softmax_with_sinks(s, sinks, dims.G, _softmax_dtype(q.dtype)).to(q.dtype)  # (B, H_kv, G, S_max)
    return torch.matmul(p, v_cache).view(B, dims.H, D)  # (B, H, D)


def sdpa_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float | None = None,
    *,
    window: int | None = None,
    chunk: int | None = None,
    sinks: torch.Tensor | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """torch SDPA for one token per sequence, with a (B, 1, 1, S_max) length (and window or chunk) mask."""
    dims, scale, local = _decode_setup(q, k_cache, v_cache, seq_lens, sm_scale, validate, window, chunk, sinks)
    _refuse_sinks(sinks)
    mask = _length_mask(seq_lens, dims.capacity, local)[:, None, None, :]  # (B, 1, 1, S_max)
    o = F.scaled_dot_product_attention(
        q.unsqueeze(2), k_cache, v_cache, attn_mask=mask, scale=scale, enable_gqa=dims.G > 1
    )  # (B, H, 1, D)
    return o.squeeze(2)


def gather_paged_kv(
    key_blocks: torch.Tensor, value_blocks: torch.Tensor, block_tables: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Copy each sequence's blocks into contiguous caches (B, H_kv, M_blk * P, D).

    Table entries outside [0, N_blk) are clamped: they lie past a sequence's length (checked by the
    callers) and are masked out by seq_lens."""
    N_blk, P, H_kv, D = key_blocks.shape
    B, M_blk = block_tables.shape
    ids = block_tables.long().clamp(0, N_blk - 1)  # (B, M_blk)

    def gather(blocks: torch.Tensor) -> torch.Tensor:
        rows = blocks[ids]  # (B, M_blk, P, H_kv, D)
        return rows.reshape(B, M_blk * P, H_kv, D).transpose(1, 2)  # (B, H_kv, M_blk*P, D)

    return gather(key_blocks), gather(value_blocks)


def paged_decode_reference(
    q: torch.Tensor,
    key_blocks: torch.Tensor,
    value_blocks: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float | None = None,
    *,
    impl: Literal["sdpa", "naive"] = "sdpa",
    window: int | None = None,
    chunk: int | None = None,
    sinks: torch.Tensor | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Decode against a paged cache: gather the blocks (`gather_paged_kv`), then `sdpa_decode` or `naive_decode`."""
    dims = check_paged(q, key_blocks, value_blocks, block_tables, seq_lens)
    if impl not in ("sdpa", "naive"):
        raise ValueError(f"impl: must be 'sdpa' or 'naive', got {impl!r}")
    local = check_local(window, chunk)
    if validate:
        check_block_table_values(block_tables, seq_lens, dims, local)
    k_cache, v_cache = gather_paged_kv(key_blocks, value_blocks, block_tables)
    decode = sdpa_decode if impl == "sdpa" else naive_decode
    return decode(q, k_cache, v_cache, seq_lens, sm_scale, window=window, chunk=chunk, sinks=sinks, validate=False)


def gather_paged_latent(latent_blocks: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """Copy each sequence's latent blocks into one contiguous cache (B, M_blk * P, R + Dr).

    Table entries outside [0, N_blk) are clamped, as in `gather_paged_kv`."""
    N_blk, P, W = latent_blocks.shape
    B, M_blk = block_tables.shape
    ids = block_tables.long().clamp(0, N_blk - 1)  # (B, M_blk)
    return latent_blocks[ids].reshape(B, M_blk * P, W)  # (B, M_blk*P, R + Dr)


def mla_decode_reference(
    q_latent: torch.Tensor,
    q_rope: torch.Tensor,
    latent_blocks: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    sm_scale: float,
    validate: bool = True,
) -> torch.Tensor:
    """Multi-head latent attention decode in its absorbed form (DeepSeek-V2, arXiv:2405.04434), in torch.

    The arguments and result of `kernels.mla_decode` (q_latent (B, H, R), q_rope (B, H, Dr), latent_blocks
    (N_blk, P, R + Dr), block_tables (B, M_blk), seq_lens (B,) -> (B, H, R)): the blocks are gathered into
    one (B, M_blk * P, R + Dr) cache and every head attends to it as MQA, scores
    sm_scale * (q_latent c^T + q_rope k_R^T) (B, H, M_blk * P) masked by length, softmax in (at least) fp32,
    then P @ c. Nothing per head is materialised beyond the scores; fp64 inputs give an fp64 result.
    """
    dims = check_mla(q_latent, q_rope, latent_blocks, block_tables, seq_lens)
    scale = check_sm_scale(sm_scale)
    if validate:
        check_block_table_values(block_tables, seq_lens, dims)
    cache = gather_paged_latent(latent_blocks, block_tables)  # (B, S, R + Dr), S = M_blk * P
    c, k_rope = cache[..., : dims.R], cache[..., dims.R :]  # (B, S, R), (B, S, Dr)
    s = (torch.matmul(q_latent, c.transpose(1, 2)) + torch.matmul(q_rope, k_rope.transpose(1, 2))) * scale  # (B, H, S)
    s = s.masked_fill(~_length_mask(seq_lens, dims.capacity)[:, None, :], float("-inf"))
    p = torch.softmax(s, dim=-1, dtype=_softmax_dtype(q_latent.dtype)).to(q_latent.dtype)  # (B, H, S)
    return torch.matmul(p, c)  # (B, H, R)
