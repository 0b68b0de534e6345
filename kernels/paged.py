"""Split-KV decode attention against a paged KV cache: PagedAttention in Triton.

Paper: Efficient Memory Management for Large Language Model Serving with PagedAttention (Kwon et al.,
SOSP 2023, arXiv:2309.06180): the cache is a pool of fixed-size blocks and each sequence lists its
blocks in a block table, so memory is allocated block by block and blocks can be shared between
sequences (a common prefix, beam search). The kernel is `kernels.decode`'s split-KV algorithm
(Flash-Decoding, Dao et al. 2023) with the K/V addresses going through the block table.

Letters: B batch, H query heads, H_kv key/value heads, G = H / H_kv, D head dim, P block size (tokens
per block), N_blk blocks in the pool, M_blk block-table width, S number of splits.

Layouts: q (B, H, D); key_blocks, value_blocks (N_blk, P, H_kv, D); block_tables (B, M_blk) int32, token
t of sequence b lives at slot t % P of block block_tables[b, t // P]; seq_lens (B,) int32 in
[1, M_blk * P]. Table entries past a sequence's last block are never read. Output (B, H, D) in q's
dtype. For each K/V tile the kernel loads the tile's block ids once (one per token row) and then the
rows of D contiguous elements; a tile may span several blocks, or part of one when P > BLOCK_N.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels._checks import check_block_table_values, check_local, check_paged, check_sinks
from kernels._common import check_inner_contiguous, check_kernel_inputs, check_out, default_sm_scale
from kernels._masks import _first_key
from kernels.decode import (
    TUNING_KEY,
    _decode_update,
    _init_state,
    _split_range,
    _store_split,
    autotuned,
    choose_splits,
    decode_meta,
    launch_stage_one,
    run_split_kv,
    sink_args,
)

LOG2E = math.log2(math.e)


@triton.jit
def _paged_attention_kernel(
    Q, KBlocks, VBlocks, BlockTables, SeqLens, O, Lse, Sinks, qk_scale, num_splits, span,
    stride_qb, stride_qh, stride_qd,
    stride_kblk, stride_kp, stride_kh, stride_kd,
    stride_vblk, stride_vp, stride_vh, stride_vd,
    stride_tb, stride_tm,
    stride_ob, stride_oh, stride_os, stride_od,
    stride_lb, stride_lh, stride_ls, stride_sink,
    H_kv,
    SEQ_BUCKET, BATCH_BUCKET,  # autotuning keys only
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, LOCAL: tl.constexpr, HAS_SINKS: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr, WRITE_LSE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Stage 1. Grid (B * H_kv, S): one program per (sequence, KV head, split), as `_flash_decoding_kernel`:
    only the visible keys (window or chunk) are split and read, so only their blocks' table entries."""
    tl.static_assert(BLOCK_G >= 16, "BLOCK_G: tl.dot needs >= 16 rows; pad the query group")
    tl.static_assert(BLOCK_G >= GROUP, "BLOCK_G must hold the whole query group")
    tl.static_assert(BLOCK_N % 16 == 0, "BLOCK_N must be a multiple of 16 (tl.dot columns)")
    tl.static_assert(HEAD_DIM_PAD >= 16, "HEAD_DIM_PAD must be >= 16 (tl.dot reduction)")
    tl.static_assert(PAGE_SIZE >= 1, "PAGE_SIZE must be >= 1")
    EVEN_D: tl.constexpr = HEAD_DIM == HEAD_DIM_PAD
    pid_bh = tl.program_id(0)
    split = tl.program_id(1)
    off_b = (pid_bh // H_kv).to(tl.int64)
    off_hkv = (pid_bh % H_kv).to(tl.int64)

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    offs_n = tl.arange(0, BLOCK_N)
    g_ok = offs_g < GROUP
    d_ok = offs_d < HEAD_DIM
    heads = off_hkv * GROUP + offs_g  # (BLOCK_G,)
    q_ptrs = Q + off_b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=g_ok[:, None] & d_ok[None, :], other=0.0)  # (BLOCK_G, HEAD_DIM_PAD)

    seq_len = tl.load(SeqLens + off_b)
    start = _first_key(seq_len - 1, span, LOCAL)
    lo, hi_full, hi = _split_range(start, seq_len, split, num_splits, BLOCK_N)
    table = BlockTables + off_b * stride_tb
    k_head = KBlocks + off_hkv * stride_kh
    v_head = VBlocks + off_hkv * stride_vh

    acc, l_i, m_i = _init_state(Sinks, heads, stride_sink, g_ok, BLOCK_G, HEAD_DIM_PAD, HAS_SINKS)
    for start_n in range(lo, hi_full, BLOCK_N):
        if LOCAL == 0:  # tiles are counted from key 0; a window or chunk starts anywhere
            start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n  # (BLOCK_N,) token positions
        blk = tl.load(table + (cols // PAGE_SIZE) * stride_tm).to(tl.int64)  # (BLOCK_N,) physical block ids
        k_rows = k_head + blk * stride_kblk + (cols % PAGE_SIZE) * stride_kp  # (BLOCK_N,) row starts
        v_rows = v_head + blk * stride_vblk + (cols % PAGE_SIZE) * stride_vp
        kT_ptrs = k_rows[None, :] + offs_d[:, None] * stride_kd  # (HEAD_DIM_PAD, BLOCK_N)
        v_ptrs = v_rows[:, None] + offs_d[None, :] * stride_vd  # (BLOCK_N, HEAD_DIM_PAD)
        if EVEN_D:
            kT = tl.load(kT_ptrs)
            v = tl.load(v_ptrs)
        else:
            kT = tl.load(kT_ptrs, mask=d_ok[:, None], other=0.0)
            v = tl.load(v_ptrs, mask=d_ok[None, :], other=0.0)
        acc, l_i, m_i = _decode_update(acc, l_i, m_i, q, kT, v, cols, hi, qk_scale, False, DOT_PRECISION)
    for start_n in range(hi_full, hi, BLOCK_N):  # the partial last tile, if any
        cols = start_n + offs_n
        n_ok = cols < hi
        # Table entries past the sequence's last block may be garbage: never load them.
        blk = tl.load(table + (cols // PAGE_SIZE) * stride_tm, mask=n_ok, other=0).to(tl.int64)
        k_rows = k_head + blk * stride_kblk + (cols % PAGE_SIZE) * stride_kp
        v_rows = v_head + blk * stride_vblk + (cols % PAGE_SIZE) * stride_vp
        kT = tl.load(k_rows[None, :] + offs_d[:, None] * stride_kd, mask=d_ok[:, None] & n_ok[None, :], other=0.0)
        v = tl.load(v_rows[:, None] + offs_d[None, :] * stride_vd, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        acc, l_i, m_i = _decode_update(acc, l_i, m_i, q, kT, v, cols, hi, qk_scale, True, DOT_PRECISION)

    _store_split(O, Lse, acc, l_i, m_i, off_b, heads, split,
                 stride_ob, stride_oh, stride_os, stride_od, stride_lb, stride_lh, stride_ls,
                 g_ok, d_ok, HEAD_DIM_PAD, WRITE_LSE)


_paged_attention_tuned = autotuned(_paged_attention_kernel, TUNING_KEY + ["PAGE_SIZE"])


def paged_attention(
    q: torch.Tensor,
    key_blocks: torch.Tensor,
    value_blocks: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    num_splits: int | None = None,
    *,
    sm_scale: float | None = None,
    window: int | None = None,
    chunk: int | None = None,
    sinks: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Attention of one new query token per sequence against a paged KV cache, split along the keys.

    q (B, H, D); key_blocks, value_blocks (N_blk, P, H_kv, D) with H % H_kv == 0; block_tables (B, M_blk)
    int32; seq_lens (B,) int32, each in [1, M_blk * P]. Returns (B, H, D) in q's dtype (written into
    `out` when given). `window`, `chunk` and `sinks` as in `flash_decoding`: only the visible keys' blocks
    are read. `num_splits` overrides the `num_kv_splits` heuristic. `validate` reads seq_lens and
    block_tables on the host to check lengths and that every block a sequence uses is in [0, N_blk) (a
    device sync); with validate=False only shapes are checked and the heuristic assumes full tables.
    Raises ValueError naming the argument for bad input.
    """
    dims = check_paged(q, key_blocks, value_blocks, block_tables, seq_lens)
    local = check_local(window, chunk)
    sinks = check_sinks(sinks, dims.H, q.device)
    check_kernel_inputs(q)
    for name, t in (("q", q), ("key_blocks", key_blocks), ("value_blocks", value_blocks)):
        check_inner_contiguous(name, t)
    out = check_out(out, q)
    longest = check_block_table_values(block_tables, seq_lens, dims, local) if validate else dims.capacity
    longest = local.longest_visible(longest)
    splits = choose_splits(num_splits, dims, longest, q.device)
    qk_scale = default_sm_scale(dims.D, sm_scale) * LOG2E
    meta = dict(decode_meta(q, dims, local), PAGE_SIZE=dims.block_size)
    buckets = (triton.next_power_of_2(longest), triton.next_power_of_2(dims.B))
    sink_ptr, stride_sink = sink_args(sinks, q)

    def stage_one(o, lse, o_strides, lse_strides, write_lse):
        args = (
            q, key_blocks, value_blocks, block_tables, seq_lens, o, lse, sink_ptr, qk_scale, splits, local.span,
            *q.stride(), *key_blocks.stride(), *value_blocks.stride(), *block_tables.stride(),
            *o_strides, *lse_strides, stride_sink,
            dims.H_kv, *buckets,
        )
        launch_stage_one(_paged_attention_kernel, _paged_attention_tuned, dims.B * dims.H_kv, splits, args,
                         dict(meta, WRITE_LSE=write_lse, HAS_SINKS=sinks is not None and not write_lse))

    return run_split_kv(stage_one, q, out, splits, sinks)
