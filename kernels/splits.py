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
"""

from __future__ import annotations

PROGRAMS_PER_SM = 2
MIN_TOKENS_PER_SPLIT = 256
MAX_SPLITS = 64


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: must be a positive integer, got {value!r}")
    return value


def num_kv_splits(batch: int, num_kv_heads: int, seq_len: int, num_sms: int) -> int:
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
    programs = batch * num_kv_heads
    if programs >= num_sms:
        return 1
    wanted = -(-PROGRAMS_PER_SM * num_sms // programs)
    worthwhile = -(-seq_len // MIN_TOKENS_PER_SPLIT)
    return max(1, min(wanted, worthwhile, MAX_SPLITS))
