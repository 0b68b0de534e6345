"""Multi-head latent attention (MLA) decode over a paged latent cache, in its absorbed form, in Triton
(`mla_decode`).

Paper: DeepSeek-V2 (DeepSeek-AI 2024, arXiv:2405.04434, section 2.1): each token caches one compressed
latent c (R = kv_lora_rank wide, after its norm) and one rotary key k_R (Dr = qk_rope_head_dim wide),
shared by all H query heads. Head h's key is [W_UK_h c, k_R] and its value W_UV_h c; folding W_UK_h into
the query ("absorbed": q_latent_h = q_nope_h W_UK_h, done by the caller) gives

    score_hj = sm_scale * (q_latent_h . c_j + q_rope_h . kR_j),   out_h = softmax_j(score_h) @ c,

MQA with the value inside the key, and the caller applies W_UV_h to out_h. FlashMLA (DeepSeek-AI 2025,
https://github.com/deepseek-ai/FlashMLA, `flash_mla_with_kvcache`) runs this form on the same paged
layout. Algorithm: `kernels.paged`'s split-KV PagedAttention with one KV head, each latent tile loaded
once for a tile of up to `MAX_BLOCK_H` query heads (`heads_per_program`), stage 2 `kernels.decode`'s
LSE merge over R-wide partials; why the head tile is 32: docs/kernels.md.

Letters: B batch, H query heads, R latent width (kv_lora_rank), Dr rotary width (qk_rope_head_dim),
P block size (tokens per block), N_blk blocks in the pool, M_blk block-table width, S number of splits.

Layouts: q_latent (B, H, R); q_rope (B, H, Dr); latent_blocks (N_blk, P, R + Dr), token t of sequence b at
slot t % P of block block_tables[b, t // P], [c | k_R] along the last dim; block_tables (B, M_blk) int32;
seq_lens (B,) int32 in [1, M_blk * P]. Output (B, H, R) in q_latent's dtype. A contiguous cache
(B, S_max, R + Dr) is the special case P = S_max with block_tables[b] = [b].

Numerics: fp32 scores, softmax state and partials; exp2, log2(e) folded into the scale; fp32 inputs: IEEE products.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels._checks import check_block_table_values, check_mla
from kernels._common import (
    check_inner_contiguous,
    check_kernel_inputs,
    check_out,
    check_sm_scale,
    dot_precision,
    interpreting,
    padded_head_dim,
    tuning_configs,
)
from kernels.decode import (
    INTERPRETER_CONFIG,
    _softmax_step,
    _split_range,
    _store_split,
    check_num_splits,
    device_num_sms,
    run_split_kv,
)
from kernels.splits import num_mla_splits

LOG2E = math.log2(math.e)
MAX_BLOCK_H = 32  # heads per program: a (32, 512) fp32 accumulator fits the registers; 64-head tiles spill


@triton.jit
def _mla_update(acc, l_i, m_i, q_lat, q_rope, c, k_rope, cols, hi, qk_scale,
                MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Online-softmax update of a head tile with one latent tile.

    q_lat (BLOCK_H, R_pad), q_rope (BLOCK_H, Dr_pad); c (BLOCK_N, R_pad) the latents, which are both the
    keys' first R elements and the values; k_rope (BLOCK_N, Dr_pad). Masked from `hi` on when MASKED (a
    masked tile holds at least one valid token, so the row max is finite)."""
    qk = tl.dot(q_lat, tl.trans(c), input_precision=DOT_PRECISION)  # (BLOCK_H, BLOCK_N) fp32
    qk = tl.dot(q_rope, tl.trans(k_rope), acc=qk, input_precision=DOT_PRECISION)
    return _softmax_step(acc, l_i, m_i, qk, c, cols, hi, qk_scale, MASKED, DOT_PRECISION)


@triton.jit
def _mla_decode_kernel(
    QLatent, QRope, Latent, BlockTables, SeqLens, O, Lse, qk_scale, num_splits,
    stride_qb, stride_qh, stride_qr,
    stride_rb, stride_rh, stride_rd,
    stride_cblk, stride_cp, stride_cw,
    stride_tb, stride_tm,
    stride_ob, stride_oh, stride_os, stride_or,
    stride_lb, stride_lh, stride_ls,
    H,
    SEQ_BUCKET, BATCH_BUCKET,  # autotuning keys only
    BLOCK_H: tl.constexpr,
    LATENT_DIM: tl.constexpr, LATENT_PAD: tl.constexpr, ROPE_DIM: tl.constexpr, ROPE_PAD: tl.constexpr,
    PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, WRITE_LSE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Stage 1. Grid (B * ceil(H / BLOCK_H), S): one program per (sequence, head tile, split)."""
    tl.static_assert(BLOCK_H >= 16, "BLOCK_H: tl.dot needs >= 16 rows; pad the head tile")
    tl.static_assert(BLOCK_N % 16 == 0, "BLOCK_N must be a multiple of 16 (tl.dot columns)")
    tl.static_assert(LATENT_PAD >= 16, "LATENT_PAD must be >= 16 (tl.dot reduction)")
    tl.static_assert(ROPE_PAD >= 16, "ROPE_PAD must be >= 16 (tl.dot reduction)")
    tl.static_assert(PAGE_SIZE >= 1, "PAGE_SIZE must be >= 1")
    EVEN_R: tl.constexpr = LATENT_DIM == LATENT_PAD
    EVEN_DR: tl.constexpr = ROPE_DIM == ROPE_PAD
    head_tiles = tl.cdiv(H, BLOCK_H)
    pid = tl.program_id(0)
    split = tl.program_id(1)
    off_b = (pid // head_tiles).to(tl.int64)
    heads = (pid % head_tiles) * BLOCK_H + tl.arange(0, BLOCK_H)  # (BLOCK_H,)
    offs_r = tl.arange(0, LATENT_PAD)
    offs_e = tl.arange(0, ROPE_PAD)
    offs_n = tl.arange(0, BLOCK_N)
    h_ok = heads < H
    r_ok = offs_r < LATENT_DIM
    e_ok = offs_e < ROPE_DIM
    heads = heads.to(tl.int64)
    q_lat = tl.load(QLatent + off_b * stride_qb + heads[:, None] * stride_qh + offs_r[None, :] * stride_qr,
                    mask=h_ok[:, None] & r_ok[None, :], other=0.0)  # (BLOCK_H, LATENT_PAD)
    q_rope = tl.load(QRope + off_b * stride_rb + heads[:, None] * stride_rh + offs_e[None, :] * stride_rd,
                     mask=h_ok[:, None] & e_ok[None, :], other=0.0)  # (BLOCK_H, ROPE_PAD)

    seq_len = tl.load(SeqLens + off_b)
    lo, hi_full, hi = _split_range(0, seq_len, split, num_splits, BLOCK_N)
    table = BlockTables + off_b * stride_tb

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, LATENT_PAD], dtype=tl.float32)
    for start_n in range(lo, hi_full, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n  # (BLOCK_N,) token positions
        blk = tl.load(table + (cols // PAGE_SIZE) * stride_tm).to(tl.int64)  # (BLOCK_N,) physical block ids
        rows = Latent + blk * stride_cblk + (cols % PAGE_SIZE) * stride_cp  # (BLOCK_N,) token row starts
        c_ptrs = rows[:, None] + offs_r[None, :] * stride_cw  # (BLOCK_N, LATENT_PAD)
        kr_ptrs = rows[:, None] + (LATENT_DIM + offs_e)[None, :] * stride_cw  # (BLOCK_N, ROPE_PAD)
        if EVEN_R:
            c = tl.load(c_ptrs)
        else:
            c = tl.load(c_ptrs, mask=r_ok[None, :], other=0.0)
        if EVEN_DR:
            k_rope = tl.load(kr_ptrs)
        else:
            k_rope = tl.load(kr_ptrs, mask=e_ok[None, :], other=0.0)
        acc, l_i, m_i = _mla_update(acc, l_i, m_i, q_lat, q_rope, c, k_rope, cols, hi, qk_scale,
                                    False, DOT_PRECISION)
    for start_n in range(hi_full, hi, BLOCK_N):  # the partial last tile, if any
        cols = start_n + offs_n
        n_ok = cols < hi
        # Table entries past the sequence's last block may be garbage: never load them.
        blk = tl.load(table + (cols // PAGE_SIZE) * stride_tm, mask=n_ok, other=0).to(tl.int64)
        rows = Latent + blk * stride_cblk + (cols % PAGE_SIZE) * stride_cp
        c = tl.load(rows[:, None] + offs_r[None, :] * stride_cw, mask=n_ok[:, None] & r_ok[None, :], other=0.0)
        k_rope = tl.load(rows[:, None] + (LATENT_DIM + offs_e)[None, :] * stride_cw,
                         mask=n_ok[:, None] & e_ok[None, :], other=0.0)
        acc, l_i, m_i = _mla_update(acc, l_i, m_i, q_lat, q_rope, c, k_rope, cols, hi, qk_scale,
                                    True, DOT_PRECISION)

    _store_split(O, Lse, acc, l_i, m_i, off_b, heads, split,
                 stride_ob, stride_oh, stride_os, stride_or, stride_lb, stride_lh, stride_ls,
                 h_ok, r_ok, LATENT_PAD, WRITE_LSE)


# Autotuning space for stage 1 on CUDA (BLOCK_N, num_warps, num_stages). Checked with ptxas for sm_80 and
# sm_90 at R=512, Dr=64 (`tests/kernels/aot_compile.py --all-configs --only=_mla_decode_kernel`): in
# bf16/fp16 every config fits both devices' shared memory without spills for 16- and 32-head tiles (a
# 32-head tile needs 8 warps from BLOCK_N=32 on: with 4 it spills); in fp32 BLOCK_N=64 exceeds an A100's
# shared memory and the autotuner skips it.
CUDA_CONFIGS = [
    (32, 8, 2),
    (64, 8, 2),
    (16, 4, 3),
    (16, 8, 3),
    (32, 8, 3),
    (16, 4, 2),
]
FALLBACK = 3  # (16, 8, 3): fits shared memory in every dtype (LLMPERF_TRITON_AUTOTUNE=0)
TUNING_KEY = ["num_splits", "SEQ_BUCKET", "BATCH_BUCKET", "H", "BLOCK_H", "LATENT_PAD", "ROPE_PAD", "PAGE_SIZE"]


def _autotuned():
    if interpreting():
        return None
    configs = [triton.Config({"BLOCK_N": n}, num_warps=w, num_stages=s)
               for n, w, s in tuning_configs(CUDA_CONFIGS, FALLBACK)]
    return triton.autotune(configs=configs, key=TUNING_KEY)(_mla_decode_kernel)


_mla_decode_tuned = _autotuned()


def heads_per_program(H: int) -> int:
    """BLOCK_H: the whole of a small head count (padded to the 16 rows `tl.dot` needs), else MAX_BLOCK_H."""
    return min(MAX_BLOCK_H, max(16, triton.next_power_of_2(H)))


def mla_decode(
    q_latent: torch.Tensor,
    q_rope: torch.Tensor,
    latent_blocks: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    num_splits: int | None = None,
    *,
    sm_scale: float,
    out: torch.Tensor | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Absorbed multi-head latent attention of one new query token per sequence over a paged latent cache.

    q_latent (B, H, R): the non-rotary query already multiplied by each head's W_UK; q_rope (B, H, Dr): the
    rotated query part; latent_blocks (N_blk, P, R + Dr): per token the normalised latent c then the shared
    rotated key k_R; block_tables (B, M_blk) int32; seq_lens (B,) int32, each in [1, M_blk * P]. sm_scale
    is the model's softmax scale (DeepSeek-V3: (qk_nope_head_dim + qk_rope_head_dim)^-0.5, times the YaRN
    mscale^2 when scaled), required because R + Dr is not the width it refers to. Returns
    softmax(scores) @ c, (B, H, R) in q_latent's dtype (written into `out` when given); the caller
    applies W_UV. `num_splits` overrides the `num_mla_splits` heuristic. `validate` reads seq_lens and
    block_tables on the host to check lengths and that every block a sequence uses is in [0, N_blk) (a
    device sync); with validate=False only shapes are checked and the heuristic assumes full tables.
    Raises ValueError naming the argument for bad input.
    """
    dims = check_mla(q_latent, q_rope, latent_blocks, block_tables, seq_lens)
    check_kernel_inputs(q_latent, "q_latent")
    for name, t in (("q_latent", q_latent), ("q_rope", q_rope), ("latent_blocks", latent_blocks)):
        check_inner_contiguous(name, t)
    qk_scale = check_sm_scale(sm_scale) * LOG2E
    out = check_out(out, q_latent, "q_latent")
    longest = check_block_table_values(block_tables, seq_lens, dims) if validate else dims.capacity
    block_h = heads_per_program(dims.H)
    if num_splits is None:
        splits = num_mla_splits(dims.B, dims.H, longest, device_num_sms(q_latent.device), heads_per_program=block_h,
                                latent_dim=dims.R, rope_dim=dims.Dr, cache_bytes=latent_blocks.element_size())
    else:
        splits = check_num_splits(num_splits)
    rows = dims.B * triton.cdiv(dims.H, block_h)
    meta = dict(
        BLOCK_H=block_h, LATENT_DIM=dims.R, LATENT_PAD=padded_head_dim(dims.R), ROPE_DIM=dims.Dr,
        ROPE_PAD=padded_head_dim(dims.Dr), PAGE_SIZE=dims.block_size, DOT_PRECISION=dot_precision(q_latent.dtype),
    )
    buckets = (triton.next_power_of_2(longest), triton.next_power_of_2(dims.B))

    def stage_one(o, lse, o_strides, lse_strides, write_lse):
        args = (
            q_latent, q_rope, latent_blocks, block_tables, seq_lens, o, lse, qk_scale, splits,
            *q_latent.stride(), *q_rope.stride(), *latent_blocks.stride(), *block_tables.stride(),
            *o_strides, *lse_strides,
            dims.H, *buckets,
        )
        if _mla_decode_tuned is None:
            _mla_decode_kernel[(rows, splits)](*args, **meta, WRITE_LSE=write_lse, **INTERPRETER_CONFIG)
        else:
            _mla_decode_tuned[(rows, splits)](*args, **meta, WRITE_LSE=write_lse)

    return run_split_kv(stage_one, q_latent, out, splits)
