"""Argument checks shared by the Triton wrappers and the torch references.

Letters: B batch, H query heads, H_kv key/value heads, G = H / H_kv, T_q / T_kv query / key lengths,
S_max contiguous-cache capacity, D head dim, P block (page) size, N_blk number of physical blocks,
M_blk block-table width (max blocks per sequence); multi-head latent attention: R latent width
(kv_lora_rank), Dr rotary key width (qk_rope_head_dim).

Which keys a query at position p sees (`check_local`): all keys s <= p (causal); with a sliding window W
the last W of them, p - W < s <= p (Mistral, Hugging Face `sliding_window`); with chunked attention of
chunk size C those of its own chunk, s // C == p // C and s <= p (Llama 4 `attention_chunk_size`).
Attention sinks (`check_sinks`, gpt-oss; StreamingLLM, Xiao et al. 2023, arXiv:2309.17453) are one
learned logit per query head that joins the softmax denominator and contributes no value.

Shape checks are free. The value checks of `seq_lens` and `block_tables` read them on the host (a device
sync on CUDA); they return the longest sequence so the caller can size its split-KV launch from it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels._common import (
    MAX_HEAD_DIM,
    REFERENCE_DTYPES,
    check_float,
    check_head_dim,
    check_heads,
    check_index_tensor,
    check_same_device,
    check_tensor,
)

# How far back a query sees (`LOCAL`, a constexpr of the kernels): every earlier key, a sliding window, a chunk.
LOCAL_NONE, LOCAL_WINDOW, LOCAL_CHUNK = 0, 1, 2


@dataclass(frozen=True, kw_only=True)
class Local:
    """Sliding window or chunked attention: `mode` one of LOCAL_*, `span` the window W or chunk C (0 for none)."""

    mode: int = LOCAL_NONE
    span: int = 0

    def first_keys(self, positions: torch.Tensor) -> torch.Tensor:
        """The first key a query at each of `positions` (an integer tensor) sees: it sees first .. position."""
        if self.mode == LOCAL_WINDOW:
            return (positions - self.span + 1).clamp(min=0)
        if self.mode == LOCAL_CHUNK:
            return positions // self.span * self.span
        return torch.zeros_like(positions)

    def longest_visible(self, longest: int) -> int:
        """An upper bound on the keys one decode query sees when the longest sequence holds `longest`."""
        return longest if self.mode == LOCAL_NONE else min(longest, self.span)


@dataclass(frozen=True, kw_only=True)
class PrefillDims:
    B: int
    H: int
    H_kv: int
    T_q: int
    T_kv: int
    D: int

    @property
    def G(self) -> int:
        return self.H // self.H_kv


@dataclass(frozen=True, kw_only=True)
class DecodeDims:
    B: int
    H: int
    H_kv: int
    D: int
    capacity: int  # tokens one sequence can hold: S_max, or M_blk * P for a paged cache
    block_size: int = 0  # P for a paged cache, 0 for a contiguous one
    num_blocks: int = 0  # N_blk for a paged cache

    @property
    def G(self) -> int:
        return self.H // self.H_kv


MAX_LATENT_DIM = 1024  # a (16, R) fp32 accumulator and (BLOCK_N, R) latent tiles still fit one program


@dataclass(frozen=True, kw_only=True)
class LatentDims:
    """Multi-head latent attention decode over a paged latent cache: one latent "head" for all H."""

    B: int
    H: int
    R: int
    Dr: int
    capacity: int  # M_blk * P tokens one sequence can hold
    block_size: int
    num_blocks: int


def check_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> PrefillDims:
    """q (B, H, T_q, D); k, v (B, H_kv, T_kv, D). Causal masks are aligned bottom-right."""
    check_tensor("q", q, 4, "(B, H, T_q, D)")
    check_tensor("k", k, 4, "(B, H_kv, T_kv, D)")
    check_tensor("v", v, 4, "(B, H_kv, T_kv, D)")
    check_float("q", q)
    check_float("k", k, q.dtype)
    check_float("v", v, q.dtype)
    check_same_device([("q", q), ("k", k), ("v", v)])
    B, H, T_q, D = q.shape
    if k.shape[0] != B:
        raise ValueError(f"k: batch {k.shape[0]} differs from q's {B}")
    _, H_kv, T_kv, _ = k.shape
    if v.shape != k.shape:
        raise ValueError(f"v: shape {tuple(v.shape)} differs from k's {tuple(k.shape)}")
    check_head_dim("q", D)
    check_head_dim("k", k.shape[3], D)
    check_heads(H, H_kv, "k")
    if B < 1 or T_q < 1:
        raise ValueError(f"q: needs at least one sequence and one query, got shape {tuple(q.shape)}")
    if T_kv < 1:
        raise ValueError(f"k: needs at least one key, got shape {tuple(k.shape)}")
    if not isinstance(causal, bool):
        raise ValueError(f"causal: must be a bool, got {causal!r}")
    if causal and T_q > T_kv:
        raise ValueError(
            f"q: causal attention aligns the queries to the last keys, so q_len ({T_q}) must be <= kv_len ({T_kv})"
        )
    return PrefillDims(B=B, H=H, H_kv=H_kv, T_q=T_q, T_kv=T_kv, D=D)


def _check_decode_q(q: torch.Tensor) -> tuple[int, int, int]:
    check_tensor("q", q, 3, "(B, H, D)")
    check_float("q", q)
    B, H, D = q.shape
    if B < 1:
        raise ValueError(f"q: needs at least one sequence, got shape {tuple(q.shape)}")
    check_head_dim("q", D)
    return B, H, D


def _check_seq_lens(seq_lens: torch.Tensor, B: int, q_name: str = "q") -> None:
    check_index_tensor("seq_lens", seq_lens, 1, "(B,)")
    if seq_lens.shape[0] != B:
        raise ValueError(f"seq_lens: length {seq_lens.shape[0]} differs from {q_name}'s batch {B}")


def _check_block_table(block_tables: torch.Tensor, B: int, q_name: str = "q") -> None:
    check_index_tensor("block_tables", block_tables, 2, "(B, max_blocks)")
    if block_tables.shape[0] != B:
        raise ValueError(f"block_tables: {block_tables.shape[0]} rows differ from {q_name}'s batch {B}")
    if block_tables.shape[1] < 1:
        raise ValueError(f"block_tables: needs at least one column, got shape {tuple(block_tables.shape)}")


def check_seq_len_values(seq_lens: torch.Tensor, capacity: int, what: str) -> int:
    """Every length in [1, capacity]; returns the longest."""
    lens = seq_lens.cpu()
    for b, n in enumerate(lens.tolist()):
        if n < 1:
            raise ValueError(f"seq_lens: length {n} of sequence {b} must be >= 1 (the new token is in the cache)")
        if n > capacity:
            raise ValueError(f"seq_lens: length {n} exceeds the cache's {what}={capacity} for sequence {b}")
    return int(lens.max())


def check_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seq_lens: torch.Tensor) -> DecodeDims:
    """q (B, H, D); k_cache, v_cache (B, H_kv, S_max, D); seq_lens (B,) int32. Shapes only."""
    B, H, D = _check_decode_q(q)
    check_tensor("k_cache", k_cache, 4, "(B, H_kv, S_max, D)")
    check_tensor("v_cache", v_cache, 4, "(B, H_kv, S_max, D)")
    check_float("k_cache", k_cache, q.dtype)
    check_float("v_cache", v_cache, q.dtype)
    if k_cache.shape[0] != B:
        raise ValueError(f"k_cache: batch {k_cache.shape[0]} differs from q's {B}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache: shape {tuple(v_cache.shape)} differs from k_cache's {tuple(k_cache.shape)}")
    _, H_kv, S_max, _ = k_cache.shape
    check_head_dim("k_cache", k_cache.shape[3], D)
    check_heads(H, H_kv, "k_cache")
    if S_max < 1:
        raise ValueError(f"k_cache: S_max must be >= 1, got shape {tuple(k_cache.shape)}")
    _check_seq_lens(seq_lens, B)
    check_same_device([("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("seq_lens", seq_lens)])
    return DecodeDims(B=B, H=H, H_kv=H_kv, D=D, capacity=S_max)


def check_paged(
    q: torch.Tensor,
    key_blocks: torch.Tensor,
    value_blocks: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
) -> DecodeDims:
    """q (B, H, D); key/value_blocks (N_blk, P, H_kv, D); block_tables (B, M_blk) int32; seq_lens (B,) int32."""
    B, H, D = _check_decode_q(q)
    check_tensor("key_blocks", key_blocks, 4, "(num_blocks, block_size, H_kv, D)")
    check_tensor("value_blocks", value_blocks, 4, "(num_blocks, block_size, H_kv, D)")
    check_float("key_blocks", key_blocks, q.dtype)
    check_float("value_blocks", value_blocks, q.dtype)
    if value_blocks.shape != key_blocks.shape:
        raise ValueError(
            f"value_blocks: shape {tuple(value_blocks.shape)} differs from key_blocks' {tuple(key_blocks.shape)}"
        )
    N_blk, P, H_kv, _ = key_blocks.shape
    check_head_dim("key_blocks", key_blocks.shape[3], D)
    check_heads(H, H_kv, "key_blocks")
    if N_blk < 1 or P < 1:
        raise ValueError(f"key_blocks: needs at least one block of at least one token, got {tuple(key_blocks.shape)}")
    _check_block_table(block_tables, B)
    _check_seq_lens(seq_lens, B)
    check_same_device(
        [("q", q), ("key_blocks", key_blocks), ("value_blocks", value_blocks),
         ("block_tables", block_tables), ("seq_lens", seq_lens)]
    )
    return DecodeDims(B=B, H=H, H_kv=H_kv, D=D, capacity=block_tables.shape[1] * P, block_size=P, num_blocks=N_blk)


def check_mla(
    q_latent: torch.Tensor,
    q_rope: torch.Tensor,
    latent_blocks: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
) -> LatentDims:
    """q_latent (B, H, R); q_rope (B, H, Dr); latent_blocks (N_blk, P, R + Dr); block_tables (B, M_blk)
    int32; seq_lens (B,) int32. Shapes only."""
    check_tensor("q_latent", q_latent, 3, "(B, H, R)")
    check_float("q_latent", q_latent)
    check_tensor("q_rope", q_rope, 3, "(B, H, Dr)")
    check_float("q_rope", q_rope, q_latent.dtype, ref="q_latent")
    B, H, R = q_latent.shape
    if B < 1 or H < 1:
        raise ValueError(f"q_latent: needs at least one sequence and one head, got shape {tuple(q_latent.shape)}")
    if not 1 <= R <= MAX_LATENT_DIM:
        raise ValueError(f"q_latent: latent dim (kv_lora_rank) must be in [1, {MAX_LATENT_DIM}], got {R}")
    if tuple(q_rope.shape[:2]) != (B, H):
        raise ValueError(f"q_rope: batch and heads {tuple(q_rope.shape[:2])} differ from q_latent's {(B, H)}")
    Dr = q_rope.shape[2]
    if not 1 <= Dr <= MAX_HEAD_DIM:
        raise ValueError(f"q_rope: rope dim (qk_rope_head_dim) must be in [1, {MAX_HEAD_DIM}], got {Dr}")
    check_tensor("latent_blocks", latent_blocks, 3, "(num_blocks, block_size, R + Dr)")
    check_float("latent_blocks", latent_blocks, q_latent.dtype, ref="q_latent")
    N_blk, P, W = latent_blocks.shape
    if W != R + Dr:
        raise ValueError(f"latent_blocks: width {W} differs from q_latent's R + q_rope's Dr = {R} + {Dr}")
    if N_blk < 1 or P < 1:
        raise ValueError(
            f"latent_blocks: needs at least one block of at least one token, got {tuple(latent_blocks.shape)}"
        )
    _check_block_table(block_tables, B, "q_latent")
    _check_seq_lens(seq_lens, B, "q_latent")
    check_same_device(
        [("q_latent", q_latent), ("q_rope", q_rope), ("latent_blocks", latent_blocks),
         ("block_tables", block_tables), ("seq_lens", seq_lens)]
    )
    return LatentDims(B=B, H=H, R=R, Dr=Dr, capacity=block_tables.shape[1] * P, block_size=P, num_blocks=N_blk)


def check_block_table_values(
    block_tables: torch.Tensor, seq_lens: torch.Tensor, dims: DecodeDims | LatentDims, local: Local | None = None
) -> int:
    """Lengths in [1, M_blk * P] and every block a sequence uses in [0, N_blk); returns the longest.

    Entries past a sequence's last used block are never read, so they may hold anything (e.g. -1); so
    may those before the first block its query sees through a sliding window or chunk (`local`).
    """
    longest = check_seq_len_values(seq_lens, dims.capacity, "max_blocks*block_size")
    table = block_tables.cpu()
    lens = seq_lens.cpu().long()
    used = (lens + dims.block_size - 1) // dims.block_size  # (B,) blocks each sequence reads
    first = (local or Local()).first_keys(lens - 1) // dims.block_size  # (B,) the first of them
    column = torch.arange(table.shape[1])
    in_use = (column[None, :] < used[:, None]) & (column[None, :] >= first[:, None])  # (B, M_blk)
    bad = in_use & ((table < 0) | (table >= dims.num_blocks))  # (B, M_blk)
    if bool(bad.any()):
        b, j = (int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"block_tables: entry {j} of sequence {b} is block {int(table[b, j])}, "
            f"outside [0, num_blocks={dims.num_blocks})"
        )
    return longest


def _check_span(name: str, value: object, what: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name}: must be a positive integer ({what}) or None, got {value!r}")


def check_local(window: int | None, chunk: int | None, causal: bool = True) -> Local:
    """`window` (keys each query sees, itself included) or `chunk` (chunk size), at most one, causal only."""
    _check_span("window", window, "keys each query sees, itself included")
    _check_span("chunk", chunk, "tokens per attention chunk")
    if window is not None and chunk is not None:
        raise ValueError(f"window, chunk: sliding-window and chunked attention exclude each other, pass one "
                         f"(got window={window}, chunk={chunk})")
    if window is not None:
        if not causal:
            raise ValueError(f"window: sliding-window attention is causal, pass causal=True (got window={window})")
        return Local(mode=LOCAL_WINDOW, span=window)
    if chunk is not None:
        if not causal:
            raise ValueError(f"chunk: chunked attention is causal, pass causal=True (got chunk={chunk})")
        return Local(mode=LOCAL_CHUNK, span=chunk)
    return Local()


def check_sinks(sinks: object, H: int, device: torch.device) -> torch.Tensor | None:
    """None, or a float tensor (H,) on q's device: one sink logit per query head (any float dtype)."""
    if sinks is None:
        return None
    check_tensor("sinks", sinks, 1, "(H,)")
    if sinks.dtype not in REFERENCE_DTYPES:
        raise ValueError(f"sinks: dtype must be float16, bfloat16, float32 or float64, got {sinks.dtype}")
    if sinks.shape[0] != H:
        raise ValueError(f"sinks: expected one logit per query head, shape ({H},), got {tuple(sinks.shape)}")
    if sinks.device != device:
        raise ValueError(f"sinks: on {sinks.device}, but q is on {device}")
    return sinks
