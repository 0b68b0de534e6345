"""Split-KV decode attention against a contiguous KV cache: Flash-Decoding in Triton.

Paper: Flash-Decoding for long-context inference (Dao, Haziza, Massa, Sizov, 2023,
https://crfm.stanford.edu/2023/10/12/flashdecoding.html), built on the online softmax of FlashAttention
(Dao et al. 2022, arXiv:2205.14135). One query token per sequence leaves a grid of B * H_kv programs,
too few to fill a GPU at small batch, so the keys are split along the sequence:
  stage 1: program (b, kv head, split) attends its group's query heads to its chunk of keys and writes a
           normalised partial output O_s and its log-sum-exp LSE_s (base 2);
  stage 2: per (b, query head), O = sum_s 2^(LSE_s - M) O_s / sum_s 2^(LSE_s - M), M = max_s LSE_s.
With one split, stage 1 writes the output directly and stage 2 is skipped. `kernels.splits` picks the
number of splits. With a sliding window or chunk (`kernels._masks`) only the keys the query sees are
split and read; attention sinks join stage 2's maximum and denominator (once, not per split), or stage
1's softmax state when it writes the output itself.

Letters: B batch, H query heads, H_kv key/value heads, G = H / H_kv query heads per KV head, S_max cache
capacity, D head dim, S number of splits.

Layouts: q (B, H, D); k_cache, v_cache (B, H_kv, S_max, D); seq_lens (B,) int32 with 1 <= seq_lens[b] <=
S_max (positions >= seq_lens[b] are never read); output (B, H, D) in q's dtype. Query head h reads KV
head h // G. The G query heads of a group are rows of one tile padded to BLOCK_G >= 16 rows, so each K/V
tile is loaded once per group and used in one `tl.dot` (GQA costs no extra K/V traffic).
Partial buffers (fp32): O_part (B, H, S, D), LSE (B, H, S).

Numerics: fp32 scores, softmax state and partials; exp2 with log2(e) folded into the scale; fp32 inputs
use IEEE fp32 products.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
import triton
import triton.language as tl

from kernels._checks import (
    DecodeDims,
    Local,
    check_decode,
    check_local,
    check_seq_len_values,
    check_sinks,
)
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
from kernels.splits import num_kv_splits

LOG2E = math.log2(math.e)
MAX_GRID_SPLITS = 65535  # grid axis 1 limit
INTERPRETER_NUM_SMS = 4  # what the split heuristic assumes for CPU tensors under the interpreter


@triton.jit
def _split_range(start, seq_len, split, num_splits, BLOCK_N: tl.constexpr):
    """Keys [lo, hi) of this split of the visible keys [start, seq_len); [lo, hi_full) is whole BLOCK_N
    tiles, [hi_full, hi) at most one partial tile.

    Tiles are counted from `start`, so every split but the last of a sequence covers whole tiles (a split
    never straddles a tile), and a window or chunk is split over the keys it keeps, not the whole cache."""
    per_split = tl.cdiv(tl.cdiv(seq_len - start, num_splits), BLOCK_N) * BLOCK_N
    lo = start + split * per_split
    hi = tl.maximum(tl.minimum(lo + per_split, seq_len), lo)
    hi_full = lo + ((hi - lo) // BLOCK_N) * BLOCK_N
    return lo, hi_full, hi


@triton.jit
def _decode_update(acc, l_i, m_i, q, kT, v, cols, hi, qk_scale, MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Online-softmax update of a group of query rows with one K/V tile.

    q (BLOCK_G, D_pad), kT (D_pad, BLOCK_N), v (BLOCK_N, D_pad); cols (BLOCK_N,) key positions, masked
    from `hi` on when MASKED. A masked tile always holds at least one valid key, so the max is finite."""
    qk = tl.dot(q, kT, input_precision=DOT_PRECISION)  # (BLOCK_G, BLOCK_N) fp32
    return _softmax_step(acc, l_i, m_i, qk, v, cols, hi, qk_scale, MASKED, DOT_PRECISION)


@triton.jit
def _softmax_step(acc, l_i, m_i, qk, v, cols, hi, qk_scale, MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """The online-softmax step every decode kernel shares, given one tile's raw scores `qk (rows,
    BLOCK_N)` fp32: mask from `hi` on when MASKED, rescale the running max, sum and output, add the
    tile's `p @ v`. A masked tile always holds at least one valid key, so the max is finite."""
    if MASKED:
        qk = tl.where(cols[None, :] < hi, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)  # log2 domain; qk_scale > 0 commutes with max
    p = tl.exp2(qk * qk_scale - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return acc, l_i, m_new


@triton.jit
def _store_split(O, Lse, acc, l_i, m_i, off_b, heads, split,
                 stride_ob, stride_oh, stride_os, stride_od, stride_lb, stride_lh, stride_ls,
                 g_ok, d_ok, HEAD_DIM_PAD: tl.constexpr, WRITE_LSE: tl.constexpr):
    """Write the normalised partial (zeros with LSE = -inf for an empty split, which stage 2 then ignores)."""
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    o_ptrs = O + off_b * stride_ob + heads[:, None] * stride_oh + split * stride_os + offs_d[None, :] * stride_od
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=g_ok[:, None] & d_ok[None, :])
    if WRITE_LSE:
        l_ok = l_i > 0.0
        lse = tl.where(l_ok, m_i + tl.log2(tl.where(l_ok, l_i, 1.0)), float("-inf"))
        tl.store(Lse + off_b * stride_lb + heads * stride_lh + split * stride_ls, lse, mask=g_ok)


@triton.jit
def _init_state(Sinks, heads, stride_sink, g_ok, BLOCK_G: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
                HAS_SINKS: tl.constexpr):
    """Softmax state (m, l, acc) before the first key: empty, or the sink logit alone (m = sink, l = 1)."""
    acc = tl.zeros([BLOCK_G, HEAD_DIM_PAD], dtype=tl.float32)
    if HAS_SINKS:
        l_i = tl.full([BLOCK_G], 1.0, dtype=tl.float32)
        m_i = _load_sinks(Sinks, heads, stride_sink, g_ok)
    else:
        l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
        m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    return acc, l_i, m_i


@triton.jit
def _flash_decoding_kernel(
    Q, K, V, SeqLens, O, Lse, Sinks, qk_scale, num_splits, span,
    stride_qb, stride_qh, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_os, stride_od,
    stride_lb, stride_lh, stride_ls, stride_sink,
    H_kv,
    SEQ_BUCKET, BATCH_BUCKET,  # next powers of two of the longest visible range and of B: autotuning keys only
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, LOCAL: tl.constexpr, HAS_SINKS: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr, WRITE_LSE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Stage 1. Grid (B * H_kv, S): one program per (sequence, KV head, split).

    The query sits at position seq_len - 1 and sees keys [_first_key(seq_len - 1), seq_len): only those
    are split and read. HAS_SINKS (only when stage 1 writes the output itself, one split) starts the
    softmax state from the sink; split launches add the sink once, in the combine."""
    tl.static_assert(BLOCK_G >= 16, "BLOCK_G: tl.dot needs >= 16 rows; pad the query group")
    tl.static_assert(BLOCK_G >= GROUP, "BLOCK_G must hold the whole query group")
    tl.static_assert(BLOCK_N % 16 == 0, "BLOCK_N must be a multiple of 16 (tl.dot columns)")
    tl.static_assert(HEAD_DIM_PAD >= 16, "HEAD_DIM_PAD must be >= 16 (tl.dot reduction)")
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
    heads = off_hkv * GROUP + offs_g  # (BLOCK_G,) the query heads served by this KV head
    q_ptrs = Q + off_b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=g_ok[:, None] & d_ok[None, :], other=0.0)  # (BLOCK_G, HEAD_DIM_PAD)

    seq_len = tl.load(SeqLens + off_b)
    start = _first_key(seq_len - 1, span, LOCAL)
    lo, hi_full, hi = _split_range(start, seq_len, split, num_splits, BLOCK_N)
    k_base = K + off_b * stride_kb + off_hkv * stride_kh
    v_base = V + off_b * stride_vb + off_hkv * stride_vh

    acc, l_i, m_i = _init_state(Sinks, heads, stride_sink, g_ok, BLOCK_G, HEAD_DIM_PAD, HAS_SINKS)
    for start_n in range(lo, hi_full, BLOCK_N):
        if LOCAL == 0:  # tiles are counted from key 0; a window or chunk starts anywhere
            start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        kT_ptrs = k_base + offs_d[:, None] * stride_kd + cols[None, :] * stride_kn  # (HEAD_DIM_PAD, BLOCK_N)
        v_ptrs = v_base + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd  # (BLOCK_N, HEAD_DIM_PAD)
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
        kT_ptrs = k_base + offs_d[:, None] * stride_kd + cols[None, :] * stride_kn
        v_ptrs = v_base + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd
        kT = tl.load(kT_ptrs, mask=d_ok[:, None] & n_ok[None, :], other=0.0)
        v = tl.load(v_ptrs, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        acc, l_i, m_i = _decode_update(acc, l_i, m_i, q, kT, v, cols, hi, qk_scale, True, DOT_PRECISION)

    _store_split(O, Lse, acc, l_i, m_i, off_b, heads, split,
                 stride_ob, stride_oh, stride_os, stride_od, stride_lb, stride_lh, stride_ls,
                 g_ok, d_ok, HEAD_DIM_PAD, WRITE_LSE)


@triton.jit
def _combine_splits_kernel(
    OPart, Lse, Out, Sinks, num_splits,
    stride_pb, stride_ph, stride_ps, stride_pd,
    stride_lb, stride_lh, stride_ls,
    stride_ob, stride_oh, stride_od, stride_sink,
    H,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, BLOCK_S: tl.constexpr, HAS_SINKS: tl.constexpr,
):
    """Stage 2. Grid (B * H,): merge the S partials of one (sequence, query head) through their LSEs.

    Two passes over the splits, BLOCK_S at a time: the global max M, then the weighted sum. Only the
    `num_splits` written slots are read; empty splits have LSE = -inf and weigh 0. A sink joins the
    maximum and the denominator here, once: O = sum_s w_s O_s / (2^(sink - M) + sum_s w_s)."""
    pid = tl.program_id(0)
    off_b = (pid // H).to(tl.int64)
    off_h = (pid % H).to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = offs_d < HEAD_DIM
    lse_base = Lse + off_b * stride_lb + off_h * stride_lh
    o_base = OPart + off_b * stride_pb + off_h * stride_ph

    m_vec = tl.full([BLOCK_S], float("-inf"), dtype=tl.float32)
    for s0 in range(0, num_splits, BLOCK_S):
        s = s0 + offs_s
        lse = tl.load(lse_base + s * stride_ls, mask=s < num_splits, other=float("-inf"))
        m_vec = tl.maximum(m_vec, lse)
    m = tl.max(m_vec, 0)  # finite: split 0 of every sequence holds at least one key
    if HAS_SINKS:
        sink = _load_sinks(Sinks, off_h, stride_sink, True)
        m = tl.maximum(m, sink)

    l_vec = tl.zeros([BLOCK_S], dtype=tl.float32)
    acc = tl.zeros([HEAD_DIM_PAD], dtype=tl.float32)
    for s0 in range(0, num_splits, BLOCK_S):
        s = s0 + offs_s
        s_ok = s < num_splits
        lse = tl.load(lse_base + s * stride_ls, mask=s_ok, other=float("-inf"))
        w = tl.exp2(lse - m)  # (BLOCK_S,)
        o = tl.load(o_base + s[:, None] * stride_ps + offs_d[None, :] * stride_pd,
                    mask=s_ok[:, None] & d_ok[None, :], other=0.0)  # (BLOCK_S, HEAD_DIM_PAD)
        acc += tl.sum(w[:, None] * o, 0)
        l_vec += w
    denom = tl.sum(l_vec, 0)
    if HAS_SINKS:
        denom += tl.exp2(sink - m)
    out = acc / denom
    tl.store(Out + off_b * stride_ob + off_h * stride_oh + offs_d * stride_od, out.to(Out.dtype.element_ty), mask=d_ok)


# Autotuning space for stage 1 on CUDA (BLOCK_N, num_warps, num_stages): decode streams K/V once, so
# the configs trade tile size against pipeline depth (bytes in flight per SM). Checked with ptxas for
# sm_80 and sm_90 (`tests/kernels/aot_compile.py --all-configs`): in fp16/bf16 every config fits both
# devices, without spills at D=128; in fp32 the wide ones exceed shared memory and the autotuner skips them.
CUDA_CONFIGS = [
    (64, 4, 3),
    (64, 4, 4),
    (128, 4, 3),
    (128, 8, 3),
    (32, 4, 4),
    (256, 8, 2),
]
FALLBACK = 4  # (32, 4, 4): fits shared memory in every dtype (LLMPERF_TRITON_AUTOTUNE=0)
TUNING_KEY = ["num_splits", "SEQ_BUCKET", "BATCH_BUCKET", "GROUP", "LOCAL", "HEAD_DIM_PAD"]  # plus dtypes
INTERPRETER_CONFIG = dict(BLOCK_N=16, num_warps=4, num_stages=1)
COMBINE_NUM_WARPS = 4


def autotuned(kernel: triton.JITFunction, key: list[str]):
    """Wrap a stage-1 kernel in `triton.autotune` over CUDA_CONFIGS, or None under the interpreter."""
    if interpreting():
        return None
    configs = [triton.Config({"BLOCK_N": n}, num_warps=w, num_stages=s)
               for n, w, s in tuning_configs(CUDA_CONFIGS, FALLBACK)]
    return triton.autotune(configs=configs, key=key)(kernel)


_flash_decoding_tuned = autotuned(_flash_decoding_kernel, TUNING_KEY)


@functools.lru_cache(maxsize=None)
def _device_num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def device_num_sms(device: torch.device) -> int:
    """Multiprocessors of `device`; INTERPRETER_NUM_SMS for CPU tensors under the interpreter."""
    if device.type != "cuda":
        return INTERPRETER_NUM_SMS
    return _device_num_sms(device.index if device.index is not None else torch.cuda.current_device())


def check_num_splits(num_splits: object) -> int:
    """A caller's split count: an integer in [1, MAX_GRID_SPLITS]."""
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or not 1 <= num_splits <= MAX_GRID_SPLITS:
        raise ValueError(f"num_splits: must be an integer in [1, {MAX_GRID_SPLITS}], got {num_splits!r}")
    return num_splits


def choose_splits(num_splits: int | None, dims: DecodeDims, longest: int, device: torch.device) -> int:
    """`num_splits` if given (checked), else the `num_kv_splits` heuristic."""
    if num_splits is None:
        return num_kv_splits(dims.B, dims.H_kv, longest, device_num_sms(device))
    return check_num_splits(num_splits)


def _alloc_partials(B: int, H: int, S: int, D: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Split partials: O_part (B, H, S, D) and LSE (B, H, S), fp32. Stage 1 writes every slot it owns."""
    return (
        torch.empty(B, H, S, D, dtype=torch.float32, device=device),
        torch.empty(B, H, S, dtype=torch.float32, device=device),
    )


StageOne = Callable[[torch.Tensor, torch.Tensor, tuple[int, ...], tuple[int, ...], bool], None]


def sink_args(sinks: torch.Tensor | None, q: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The (pointer, stride) a kernel takes for `sinks`; without sinks q stands in (never read)."""
    return (q, 0) if sinks is None else (sinks, sinks.stride(0))


def run_split_kv(stage_one: StageOne, q: torch.Tensor, out: torch.Tensor, num_splits: int,
                 sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Launch stage 1 (through `stage_one(o, lse, o_strides, lse_strides, write_lse)`) and, if split, stage 2.

    With one split stage 1 writes `out` (B, H, D) directly, as a (B, H, 1, D) view with a zero split stride
    (and adds the `sinks` itself: `stage_one` passes HAS_SINKS when not write_lse); split, the combine adds them."""
    B, H, D = q.shape
    with on_device(q.device):
        if num_splits == 1:
            o_strides = (out.stride(0), out.stride(1), 0, out.stride(2))
            stage_one(out, out, o_strides, (0, 0, 0), False)  # Lse is never written: any pointer will do
            return out
        o_part, lse = _alloc_partials(B, H, num_splits, D, q.device)
        stage_one(o_part, lse, o_part.stride(), lse.stride(), True)
        sink_ptr, stride_sink = sink_args(sinks, q)
        _combine_splits_kernel[(B * H,)](
            o_part, lse, out, sink_ptr, num_splits,
            *o_part.stride(), *lse.stride(), *out.stride(), stride_sink,
            H,
            HEAD_DIM=D, HEAD_DIM_PAD=padded_head_dim(D), BLOCK_S=min(16, triton.next_power_of_2(num_splits)),
            HAS_SINKS=sinks is not None, num_warps=COMBINE_NUM_WARPS,
        )
    return out


def decode_meta(q: torch.Tensor, dims: DecodeDims, local: Local) -> dict[str, object]:
    """Constexprs shared by the contiguous and paged stage-1 kernels."""
    return dict(
        GROUP=dims.G, BLOCK_G=max(16, triton.next_power_of_2(dims.G)), LOCAL=local.mode,
        HEAD_DIM=dims.D, HEAD_DIM_PAD=padded_head_dim(dims.D), DOT_PRECISION=dot_precision(q.dtype),
    )


def launch_stage_one(kernel, tuned, grid_rows: int, num_splits: int, args: tuple, meta: dict) -> None:
    """Launch a stage-1 kernel on grid (grid_rows, num_splits): autotuned on CUDA, fixed in the interpreter."""
    if tuned is None:
        kernel[(grid_rows, num_splits)](*args, **meta, **INTERPRETER_CONFIG)
    else:
        tuned[(grid_rows, num_splits)](*args, **meta)


def flash_decoding(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
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
    """Attention of one new query token per sequence against a contiguous KV cache, split along the keys.

    q (B, H, D); k_cache, v_cache (B, H_kv, S_max, D) with H % H_kv == 0; seq_lens (B,) int32, each in
    [1, S_max]. Returns (B, H, D) in q's dtype (written into `out` when given). The query sits at
    position p = seq_lens[b] - 1; `window` W keeps keys p - W < j <= p, `chunk` C keys with
    j // C == p // C (not both): only those keys are read and split. `sinks` (H,) (any float dtype, used in
    fp32) adds exp(sinks[h] - m) to the softmax denominator, once, in the combine of a split launch.
    `num_splits` overrides the `num_kv_splits` heuristic (which sees the visible keys, at most W or C).
    `validate` reads seq_lens on the host to check their range (a device sync); with validate=False only
    shapes are checked and the heuristic assumes S_max-long sequences.
    Raises ValueError naming the argument for bad input.
    """
    dims = check_decode(q, k_cache, v_cache, seq_lens)
    local = check_local(window, chunk)
    sinks = check_sinks(sinks, dims.H, q.device)
    check_kernel_inputs(q)
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_inner_contiguous(name, t)
    out = check_out(out, q)
    longest = check_seq_len_values(seq_lens, dims.capacity, "S_max") if validate else dims.capacity
    longest = local.longest_visible(longest)
    splits = choose_splits(num_splits, dims, longest, q.device)
    qk_scale = default_sm_scale(dims.D, sm_scale) * LOG2E
    meta = decode_meta(q, dims, local)
    buckets = (triton.next_power_of_2(longest), triton.next_power_of_2(dims.B))
    sink_ptr, stride_sink = sink_args(sinks, q)

    def stage_one(o, lse, o_strides, lse_strides, write_lse):
        args = (
            q, k_cache, v_cache, seq_lens, o, lse, sink_ptr, qk_scale, splits, local.span,
            *q.stride(), *k_cache.stride(), *v_cache.stride(), *o_strides, *lse_strides, stride_sink,
            dims.H_kv, *buckets,
        )
        launch_stage_one(_flash_decoding_kernel, _flash_decoding_tuned, dims.B * dims.H_kv, splits, args,
                         dict(meta, WRITE_LSE=write_lse, HAS_SINKS=sinks is not None and not write_lse))

    return run_split_kv(stage_one, q, out, splits, sinks)
