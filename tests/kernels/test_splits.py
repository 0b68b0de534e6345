"""The split-KV heuristic `num_kv_splits`: its documented rules, as properties."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kernels import num_kv_splits
from kernels.splits import MAX_SPLITS, MIN_TOKENS_PER_SPLIT, PROGRAMS_PER_SM

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
