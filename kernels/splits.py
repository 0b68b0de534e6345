"""How many KV splits a split-KV decode launch uses (Flash-Decoding, Dao, Haziza, Massa, Sizov 2023).

One decode program handles one (sequence, KV head) pair: it loads each K/V tile once and serves the G
query heads of that group with it. With B * H_kv programs the grid is often far smaller than the
device (B=1, H_kv=8 on a 132-SM H100 occupies 8 SMs), so the sequence is cut into `num_splits` chunks,
each handled by its own program, and a second small kernel merges the partial outputs through their
log-sum-exps. Splitting costs extra traffic (one fp32 partial of D floats plus its LSE per split and
query head, read back by the merge) and a second launch, so the heuristic splits only as far as needed.

The heuristic, in order:
1. `batch * num_kv_heads >= num_sms`: the unsplit grid already puts a program on every SM: 1 split.
2. Otherwise aim for `PROGRAMS_PER_SM * num_sms` programs (two resident programs per SM keep enough
   loads in flight to approach copy bandwidth): `ceil(target / (batch * num_kv_heads))` splits,
3. but never so many that a split reads fewer than `MIN_TOKENS_PER_SPLIT` tokens (below that the fixed
   cost of a split is no longer small next to its K/V reads), and never more than `MAX_SPLITS`.

Multi-head latent attention decode (`num_mla_splits`; DeepSeek-V2, arXiv:2405.04434; FlashMLA) runs one
program per (sequence, tile of `heads_per_program` query heads), all reading the sequence's one latent
cache, so the tiles play the part of the KV heads in rule 1 and 2. Its partials are wide (one fp32 row
of R per query head, all H heads of a sequence: 128 x 512 x 4 B = 256 KiB per split for DeepSeek-V3,
written by stage 1 and read back by the merge) next to what a split reads ((R + Dr) x 2 B = 1152 B per
token in bf16), so rule 3's floor rises until every split reads at least `MLA_SPLIT_BYTES_RATIO` times
the bytes of the partials it adds.
"""

from __future__ import annotations

import math

PROGRAMS_PER_SM = 2
MIN_TOKENS_PER_SPLIT = 256
MAX_SPLITS = 64
MLA_SPLIT_BYTES_RATIO = 2
PARTIAL_BYTES = 4  # fp32 partial outputs


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: must be a positive integer, got {value!r}")
    return value


def num_kv_splits(batch: int, num_kv_heads: int, seq_len: int, num_sms: int, *,
                  min_tokens_per_split: int = MIN_TOKENS_PER_SPLIT) -> int:
    """Number of KV splits for a decode launch over `batch` sequences of up to `seq_len` tokens.

    >>> num_kv_splits(64, 8, 4096, 132)   # 512 programs already fill an H100
    1
    >>> num_kv_splits(1, 8, 32768, 132)   # 8 programs: split to ~264
    33
    >>> num_kv_splits(1, 8, 512, 132)     # short: at least 256 tokens per split
    2
    """
    batch = _positive_int("batch", batch)
    num_kv_heads = _positive_int("num_kv_heads", num_kv_heads)
    seq_len = _positive_int("seq_len", seq_len)
    num_sms = _positive_int("num_sms", num_sms)
    min_tokens_per_split = _positive_int("min_tokens_per_split", min_tokens_per_split)
    programs = batch * num_kv_heads
    if programs >= num_sms:
        return 1
    wanted = -(-PROGRAMS_PER_SM * num_sms // programs)
    worthwhile = -(-seq_len // min_tokens_per_split)
    return max(1, min(wanted, worthwhile, MAX_SPLITS))


def mla_min_tokens_per_split(num_heads: int, latent_dim: int, rope_dim: int, cache_bytes: float) -> int:
    """Fewest tokens an MLA decode split reads: `MIN_TOKENS_PER_SPLIT`, or more where the split's latent
    reads would otherwise fall below `MLA_SPLIT_BYTES_RATIO` times its partials' traffic (each of the
    `num_heads` heads writes R fp32 values that the merge reads back).

    >>> mla_min_tokens_per_split(128, 512, 64, 2)   # DeepSeek-V3 on one GPU, bf16 cache
    911
    >>> mla_min_tokens_per_split(16, 512, 64, 2)    # its 16 heads per GPU at tensor parallelism 8
    256
    """
    num_heads = _positive_int("num_heads", num_heads)
    latent_dim = _positive_int("latent_dim", latent_dim)
    rope_dim = _positive_int("rope_dim", rope_dim)
    if isinstance(cache_bytes, bool) or not isinstance(cache_bytes, (int, float)) or not cache_bytes > 0:
        raise ValueError(f"cache_bytes: must be a positive number, got {cache_bytes!r}")
    partial_bytes = 2 * num_heads * latent_dim * PARTIAL_BYTES  # written by stage 1, read by the merge
    token_bytes = (latent_dim + rope_dim) * cache_bytes
    return max(MIN_TOKENS_PER_SPLIT, math.ceil(MLA_SPLIT_BYTES_RATIO * partial_bytes / token_bytes))


def num_mla_splits(batch: int, num_heads: int, seq_len: int, num_sms: int, *, heads_per_program: int,
                   latent_dim: int, rope_dim: int, cache_bytes: float) -> int:
    """Number of KV splits for an MLA decode launch: `num_kv_splits` with ceil(H / heads_per_program)
    programs per sequence and `mla_min_tokens_per_split` tokens per split at least. DeepSeek-V3 (128
    heads, R=512, Dr=64, bf16) on a 132-SM H100 with 32 heads per program: one 32k-token sequence would
    want ~66 splits but gets 36 (at least 911 tokens each), a 2k one 3, and 64 sequences fill the device:

    >>> num_mla_splits(1, 128, 32768, 132, heads_per_program=32, latent_dim=512, rope_dim=64, cache_bytes=2)
    36
    >>> num_mla_splits(1, 128, 2048, 132, heads_per_program=32, latent_dim=512, rope_dim=64, cache_bytes=2)
    3
    >>> num_mla_splits(64, 128, 4096, 132, heads_per_program=32, latent_dim=512, rope_dim=64, cache_bytes=2)
    1
    """
    heads_per_program = _positive_int("heads_per_program", heads_per_program)
    programs_per_seq = -(-_positive_int("num_heads", num_heads) // heads_per_program)
    return num_kv_splits(batch, programs_per_seq, seq_len, num_sms,
                         min_tokens_per_split=mla_min_tokens_per_split(num_heads, latent_dim, rope_dim, cache_bytes))
