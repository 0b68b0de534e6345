"""Fused attention forward for prefill: FlashAttention in Triton.

Papers: FlashAttention (Dao, Fu, Ermon, Rudra, Re 2022, arXiv:2205.14135) — tile Q, K, V so the score
matrix S = Q K^T and the probabilities P = softmax(S) never leave the chip, with an online softmax that
rescales the running output when the row maximum grows; FlashAttention-2 (Dao 2023, arXiv:2307.08691) —
parallelise over query tiles, keep the output unnormalised until the end, skip fully masked tiles.
The loop structure follows the Triton fused-attention tutorial.

Letters: B batch, H query heads, H_kv key/value heads, G = H / H_kv query heads per KV head (GQA; G = H
is MQA), T_q query length, T_kv key length, D head dim.

Layouts (as torch SDPA): q (B, H, T_q, D); k, v (B, H_kv, T_kv, D); output (B, H, T_q, D) in q's dtype.
Query head h reads KV head h // G. Any strides are accepted except along D, which must be 1.

Causal masking is aligned bottom-right: the T_q queries are the last T_q positions of the T_kv keys, so
query i sees keys j <= i + (T_kv - T_q). With T_q == T_kv this is ordinary causal prefill; with
T_q < T_kv it is a chunk of new queries against a longer cache (chunked prefill). A sliding window or
attention chunk (`kernels._masks`) also hides the keys before a query's first visible one: a query tile
loops only over the key tiles some row sees, unmasked where every row sees the whole tile, masked at
the window's (or chunk's) edge and on the diagonal. Attention sinks (gpt-oss) start each row's online
softmax from the sink logit, so it joins the denominator once and adds no value.

Numerics: scores and the softmax state are fp32; exponentials use exp2 with log2(e) folded into the
scale; P is cast to V's dtype for the second product (as FlashAttention does); fp32 inputs use IEEE
fp32 products (not TF32).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels._checks import check_local, check_prefill, check_sinks
from kernels._common import (
    check_inner_contiguous,
    check_kernel_inputs,
    check_out,
    default_sm_scale,
    dot_precision,
    interpreting,
    on_device,
    padded_head_dim,
    tuning_configs,
)
from kernels._masks import _first_key, _load_sinks

LOG2E = math.log2(math.e)


@triton.jit
def _attn_fwd_inner(
    acc, l_i, m_i, q,
    k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
    q_pos, span, key_lo, lo, hi, T_kv, qk_scale,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, LOCAL: tl.constexpr, EVEN_D: tl.constexpr,
    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Online-softmax update over key tiles [lo, hi).

    MASKED tiles check bounds, the causal diagonal and (with LOCAL) each row's first visible key; they
    load only keys in [key_lo, T_kv), key_lo being the first key any row sees."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = offs_d < HEAD_DIM
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n  # (BLOCK_N,) key positions
        kT_ptrs = k_base + offs_d[:, None] * stride_kd + cols[None, :] * stride_kn  # (HEAD_DIM_PAD, BLOCK_N)
        v_ptrs = v_base + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd  # (BLOCK_N, HEAD_DIM_PAD)
        if MASKED:
            col_ok = cols < T_kv
            if LOCAL != 0:
                col_ok = col_ok & (cols >= key_lo)
            kT = tl.load(kT_ptrs, mask=d_ok[:, None] & col_ok[None, :], other=0.0)
        elif EVEN_D:
            kT = tl.load(kT_ptrs)
        else:
            kT = tl.load(kT_ptrs, mask=d_ok[:, None], other=0.0)
        qk = tl.dot(q, kT, input_precision=DOT_PRECISION)  # (BLOCK_M, BLOCK_N) fp32
        # m is kept in the scaled (log2) domain; qk_scale > 0 commutes with max, so only the row max is
        # scaled here and the per-element scale folds into the subtraction (one FMA per score).
        if MASKED:
            keep = col_ok[None, :]
            if CAUSAL:
                keep = keep & (cols[None, :] <= q_pos[:, None])
            if LOCAL != 0:  # recomputed per masked tile rather than held across the loops (fewer live registers)
                keep = keep & (cols[None, :] >= _first_key(q_pos, span, LOCAL)[:, None])
            qk = tl.where(keep, qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            # A row that has seen no key yet keeps m = -inf; subtracting 0 instead avoids -inf - -inf = NaN.
            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            m_sub = m_new
        p = tl.exp2(qk * qk_scale - m_sub[:, None])  # (BLOCK_M, BLOCK_N)
        alpha = tl.exp2(m_i - m_sub)  # (BLOCK_M,) rescales what was accumulated under the old maximum
        l_i = l_i * alpha + tl.sum(p, 1)
        if MASKED:
            v = tl.load(v_ptrs, mask=d_ok[None, :] & col_ok[:, None], other=0.0)
        elif EVEN_D:
            v = tl.load(v_ptrs)
        else:
            v = tl.load(v_ptrs, mask=d_ok[None, :], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _flash_attention_kernel(
    Q, K, V, Out, Sinks, qk_scale, span,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od, stride_sink,
    H, T_q, T_kv,
    Q_BUCKET, KV_BUCKET,  # next powers of two of T_q and T_kv: autotuning keys only
    GROUP: tl.constexpr, CAUSAL: tl.constexpr, LOCAL: tl.constexpr, HAS_SINKS: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """One program: BLOCK_M queries of one (sequence, query head), looping over that head's KV tiles.

    Grid (B * H, cdiv(T_q, BLOCK_M)). Heads vary fastest, and with CAUSAL the query tiles run from the
    last (the most keys) to the first, so the longest programs start first and the tail wave is short.
    `span` is the window or chunk size when LOCAL (`kernels._masks`); with HAS_SINKS the softmax state
    starts from the head's sink logit (m = sink, l = exp(sink - m) = 1, no value), so the sink is in the
    denominator once and every real row's l is > 0.
    """
    tl.static_assert(BLOCK_M % 16 == 0, "BLOCK_M must be a multiple of 16 (tl.dot rows)")
    tl.static_assert(BLOCK_N % 16 == 0, "BLOCK_N must be a multiple of 16 (tl.dot columns)")
    tl.static_assert(HEAD_DIM_PAD >= 16, "HEAD_DIM_PAD must be >= 16 (tl.dot reduction)")
    tl.static_assert(HEAD_DIM <= HEAD_DIM_PAD, "HEAD_DIM is padded up to HEAD_DIM_PAD")
    EVEN_D: tl.constexpr = HEAD_DIM == HEAD_DIM_PAD

    pid_bh = tl.program_id(0)
    if CAUSAL:
        pid_m = tl.num_programs(1) - 1 - tl.program_id(1)
    else:
        pid_m = tl.program_id(1)
    off_b = (pid_bh // H).to(tl.int64)
    off_h = (pid_bh % H).to(tl.int64)
    off_hkv = off_h // GROUP

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) query rows
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    row_ok = offs_m < T_q
    d_ok = offs_d < HEAD_DIM
    q_ptrs = Q + off_b * stride_qb + off_h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # (BLOCK_M, HEAD_DIM_PAD)
    k_base = K + off_b * stride_kb + off_hkv * stride_kh
    v_base = V + off_b * stride_vb + off_hkv * stride_vh

    if HAS_SINKS:
        m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + _load_sinks(Sinks, off_h, stride_sink, True)
        l_i = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # running row max of the scaled scores
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running row sum of exp2(score - m_i)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], dtype=tl.float32)  # unnormalised output

    shift = T_kv - T_q  # bottom-right alignment: query row i sits at key position i + shift
    q_pos = offs_m + shift
    if CAUSAL:
        # The tile's rows see keys [key_lo, last_pos]; every row sees [first_key(last_pos), first_pos].
        # Tiles: [n_lo, n_full_lo) masked on the left edge, [n_full_lo, n_full_hi) whole, then masked up
        # to the diagonal; keys before n_lo (outside the window or chunk) are never read.
        first_pos = pid_m * BLOCK_M + shift
        last_pos = tl.minimum(pid_m * BLOCK_M + BLOCK_M, T_q) - 1 + shift  # the last real row's
        key_lo = _first_key(first_pos, span, LOCAL)
        n_lo = (key_lo // BLOCK_N) * BLOCK_N
        n_full_lo = tl.cdiv(_first_key(last_pos, span, LOCAL), BLOCK_N) * BLOCK_N
        n_full_hi = tl.maximum((tl.minimum(first_pos + 1, T_kv) // BLOCK_N) * BLOCK_N, n_full_lo)
        n_end = tl.minimum(last_pos + 1, T_kv)
    else:
        key_lo = 0
        n_lo = 0
        n_full_lo = 0
        n_full_hi = (T_kv // BLOCK_N) * BLOCK_N
        n_end = T_kv
    if LOCAL != 0:
        acc, l_i, m_i = _attn_fwd_inner(
            acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
            q_pos, span, key_lo, n_lo, tl.minimum(n_full_lo, n_end), T_kv, qk_scale,
            True, CAUSAL, LOCAL, EVEN_D, BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, DOT_PRECISION,
        )
    acc, l_i, m_i = _attn_fwd_inner(
        acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
        q_pos, span, key_lo, n_full_lo, n_full_hi, T_kv, qk_scale,
        False, CAUSAL, LOCAL, EVEN_D, BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, DOT_PRECISION,
    )
    acc, l_i, m_i = _attn_fwd_inner(
        acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
        q_pos, span, key_lo, n_full_hi, n_end, T_kv, qk_scale,
        True, CAUSAL, LOCAL, EVEN_D, BLOCK_N, HEAD_DIM, HEAD_DIM_PAD, DOT_PRECISION,
    )
    # Every real row sees at least one key, so l_i > 0 there; padding rows (not stored) may divide 0 by 0.
    out = acc / l_i[:, None]
    o_ptrs = Out + off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


# Autotuning space on CUDA (BLOCK_M, BLOCK_N, num_warps, num_stages), chosen by compiling for sm_80 and
# sm_90 and reading ptxas' register / spill / shared-memory report (`tests/kernels/aot_compile.py
# --all-configs`). In fp16/bf16 at D=128 the 128-row configs with BLOCK_N <= 64 use no spill on either
# arch; 128x128 is the H100 candidate (224 KiB of shared memory, 16 B of spill on sm_90, 56 B on sm_80);
# the 64-row configs serve short query chunks and (64, 32, 8, 2) serves D=256 and fp32 (the only one that
# does not spill in fp32). A config the device cannot hold fails to launch and the autotuner skips it.
# The window + sinks path (bf16, D=64) spills in no config on either arch; the chunk path (fp16, D=128,
# an integer division per masked tile) spills 64 B at 128x64 on sm_80 (up to 16 B on sm_90), none at 128x32.
CUDA_CONFIGS = [
    (128, 128, 8, 3),
    (128, 64, 8, 3),
    (128, 64, 8, 4),
    (128, 32, 8, 4),
    (64, 64, 4, 3),
    (64, 32, 4, 3),
    (64, 32, 8, 2),
]
FALLBACK = 6  # (64, 32, 8, 2): the one config that serves D=256 and fp32 (LLMPERF_TRITON_AUTOTUNE=0)
TUNING_KEY = ["Q_BUCKET", "KV_BUCKET", "GROUP", "CAUSAL", "LOCAL", "HEAD_DIM_PAD"]  # triton adds the tensors' dtypes
# The interpreter runs each program with numpy: one small fixed config, with BLOCK_M > BLOCK_N so the
# causal diagonal spans several masked tiles.
INTERPRETER_CONFIG = dict(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=1)


def _autotuned():
    configs = [
        triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)
        for m, n, w, s in tuning_configs(CUDA_CONFIGS, FALLBACK)
    ]
    return triton.autotune(configs=configs, key=TUNING_KEY)(_flash_attention_kernel)


_flash_attention_tuned = None if interpreting() else _autotuned()


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = True,
    sm_scale: float | None = None,
    *,
    window: int | None = None,
    chunk: int | None = None,
    sinks: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(q k^T * sm_scale [+ causal mask]) v, fused.

    q (B, H, T_q, D); k, v (B, H_kv, T_kv, D) with H % H_kv == 0; returns (B, H, T_q, D) in q's dtype
    (written into `out` when given). `sm_scale` defaults to 1/sqrt(D). With `causal`, the diagonal is
    aligned bottom-right (query i sits at position p = i + T_kv - T_q and sees keys j <= p), which needs
    T_q <= T_kv. Causal only: `window` W keeps the keys p - W < j <= p (sliding window, the query
    included); `chunk` C keeps those with j // C == p // C (chunked attention); not both. Key tiles
    outside every query's range are skipped, not masked. `sinks` (H,) (any float dtype, used in fp32)
    adds exp(sinks[h] - m) to each row's softmax denominator (gpt-oss attention sinks).
    Head dims that are not a power of two (or below 16) are padded on chip, any D in [1, 256] works.
    Raises ValueError naming the argument for bad shapes, dtypes, devices or values.
    """
    dims = check_prefill(q, k, v, causal)
    local = check_local(window, chunk, causal)
    sinks = check_sinks(sinks, dims.H, q.device)
    check_kernel_inputs(q)
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_inner_contiguous(name, t)
    out = check_out(out, q)
    check_inner_contiguous("out", out)
    qk_scale = default_sm_scale(dims.D, sm_scale) * LOG2E
    sink_ptr, stride_sink = (q, 0) if sinks is None else (sinks, sinks.stride(0))  # q: never read
    args = (
        q, k, v, out, sink_ptr, qk_scale, local.span,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(), stride_sink,
        dims.H, dims.T_q, dims.T_kv, triton.next_power_of_2(dims.T_q), triton.next_power_of_2(dims.T_kv),
    )
    meta = dict(
        GROUP=dims.G, CAUSAL=causal, LOCAL=local.mode, HAS_SINKS=sinks is not None,
        HEAD_DIM=dims.D, HEAD_DIM_PAD=padded_head_dim(dims.D), DOT_PRECISION=dot_precision(q.dtype),
    )

    def grid(cfg):
        return (dims.B * dims.H, triton.cdiv(dims.T_q, cfg["BLOCK_M"]))

    with on_device(q.device):
        if _flash_attention_tuned is None:
            _flash_attention_kernel[grid(INTERPRETER_CONFIG)](*args, **meta, **INTERPRETER_CONFIG)
        else:
            _flash_attention_tuned[grid](*args, **meta)
    return out
