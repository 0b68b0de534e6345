"""The split-KV heuristics `num_kv_splits` and `num_mla_splits`: their documented rules, as properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernels import num_kv_splits, num_mla_splits
from kernels.splits import (
    MAX_SPLITS,
    MIN_TOKENS_PER_SPLIT,
    MLA_SPLIT_BYTES_RATIO,
    PROGRAMS_PER_SM,
    mla_min_tokens_per_split,
)

sizes = dict(
    batch=st.integers(1, 256), num_kv_heads=st.integers(1, 64), seq_len=st.integers(1, 1 << 20),
    num_sms=st.integers(1, 256),
)


def test_examples():
    assert num_kv_splits(64, 8, 4096, 132) == 1  # 512 programs already fill an H100
    assert num_kv_splits(1, 8, 32768, 132) == 33  # ceil(264 / 8)
    assert num_kv_splits(1, 8, 512, 132) == 2  # 256 tokens per split at least
    assert num_kv_splits(1, 1, 1 << 20, 132) == MAX_SPLITS
    assert num_kv_splits(16, 8, 100, 132) == 1  # 128 programs < 132 SMs, but too short to split


@given(**sizes)
def test_rules(batch, num_kv_heads, seq_len, num_sms):
    s = num_kv_splits(batch, num_kv_heads, seq_len, num_sms)
    programs = batch * num_kv_heads
    assert 1 <= s <= MAX_SPLITS
    if programs >= num_sms:
        assert s == 1  # the unsplit grid already fills the device
    if s > 1:
        assert -(-seq_len // s) >= MIN_TOKENS_PER_SPLIT // 2  # splits stay long enough to pay off
        assert programs * (s - 1) < PROGRAMS_PER_SM * num_sms  # never more programs than needed


@given(**sizes)
def test_monotone_in_batch_and_length(batch, num_kv_heads, seq_len, num_sms):
    s = num_kv_splits(batch, num_kv_heads, seq_len, num_sms)
    assert num_kv_splits(batch + 1, num_kv_heads, seq_len, num_sms) <= s  # more sequences: fewer splits
    assert num_kv_splits(batch, num_kv_heads, seq_len + 1, num_sms) >= s  # longer: never fewer


DEEPSEEK_V3 = dict(latent_dim=512, rope_dim=64, cache_bytes=2)


def test_mla_examples():
    assert mla_min_tokens_per_split(128, 512, 64, 2) == 911  # ceil(2 x 2 x 128 x 512 x 4 / 1152)
    assert mla_min_tokens_per_split(16, 512, 64, 2) == MIN_TOKENS_PER_SPLIT
    assert num_mla_splits(1, 128, 32768, 132, heads_per_program=32, **DEEPSEEK_V3) == 36  # 4 programs, 911 tokens
    assert num_mla_splits(1, 16, 32768, 132, heads_per_program=16, **DEEPSEEK_V3) == 64  # capped at MAX_SPLITS
    assert num_mla_splits(64, 128, 4096, 132, heads_per_program=32, **DEEPSEEK_V3) == 1  # 256 programs
    assert num_mla_splits(1, 128, 900, 132, heads_per_program=32, **DEEPSEEK_V3) == 1  # shorter than one split


@given(batch=st.integers(1, 128), heads=st.integers(1, 128), seq_len=st.integers(1, 1 << 18),
       num_sms=st.integers(1, 256), block_h=st.sampled_from([16, 32]))
def test_mla_rules(batch, heads, seq_len, num_sms, block_h):
    s = num_mla_splits(batch, heads, seq_len, num_sms, heads_per_program=block_h, **DEEPSEEK_V3)
    assert s == num_kv_splits(batch, -(-heads // block_h), seq_len, num_sms,
                              min_tokens_per_split=mla_min_tokens_per_split(heads, 512, 64, 2))
    if s > 1:  # a split reads at least half the floor (s <= ceil(seq_len / floor)), as for num_kv_splits
        floor = mla_min_tokens_per_split(heads, 512, 64, 2)
        assert floor * 576 * 2 >= MLA_SPLIT_BYTES_RATIO * 2 * heads * 512 * 4  # the floor pays for the partials
        assert -(-seq_len // s) >= floor // 2


@pytest.mark.parametrize("arg", ["num_heads", "latent_dim", "rope_dim"])
def test_mla_min_tokens_bad(arg):
    good = dict(num_heads=128, latent_dim=512, rope_dim=64, cache_bytes=2)
    with pytest.raises(ValueError, match=f"^{arg}: must be a positive integer"):
        mla_min_tokens_per_split(**dict(good, **{arg: 0}))
    with pytest.raises(ValueError, match="^cache_bytes: must be a positive number"):
        mla_min_tokens_per_split(**dict(good, cache_bytes=0))
    with pytest.raises(ValueError, match="^heads_per_program: must be a positive integer"):
        num_mla_splits(1, 128, 4096, 132, heads_per_program=0, **DEEPSEEK_V3)
