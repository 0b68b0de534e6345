"""`KVCacheSpec`: the KV bytes formula, hand-computed, and the properties every caller relies on."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmperf.errors import SpecError
from llmperf.specs import KVCacheSpec, ModelSpec, Precision, load_model

TINY = dict(name="t", vocab_size=100, hidden_size=64, num_layers=3, num_heads=4, num_kv_heads=2,
            ffn_size=128, max_positions=1024)


def test_llama2_7b_by_hand():
    """2 (K, V) * 32 layers * 32 heads * 128 dims * 2 bytes = 524,288 B per token."""
    kv = load_model("llama-2-7b").kv_cache("fp16")
    assert kv.bytes_per_token_per_layer == 2 * 32 * 128 * 2 == 16_384
    assert kv.bytes_per_token == 524_288
    assert kv.bytes_per_block(16) == 16 * 524_288
    assert kv.tokens_held(4096) == 4096
    assert kv.bytes_for_context(4096) == 2 * 2**30


def test_tiny_model_every_property_by_hand():
    kv = ModelSpec(**TINY).kv_cache("int4")  # 2 kv heads x head_dim 16, half a byte each
    assert kv.bytes_per_token_per_layer == 2 * 2 * 16 * 0.5 == 32
    assert kv.bytes_per_token == 3 * 32 == 96
    assert kv.bytes_per_block(8) == 768
    assert kv.bytes_for_context(10) == 960


def test_sliding_window_caps_tokens_held():
    """Mistral-7B: 4096-token window. 10,000 tokens of context keep 4096 in the cache:
    2 * 32 layers * 8 heads * 128 * 2 B = 131,072 B per token -> 4096 * 131,072 = 512 MiB."""
    kv = load_model("mistral-7b").kv_cache("fp16")
    assert kv.sliding_window == 4096 and kv.bytes_per_token == 131_072
    assert kv.tokens_held(100) == 100 and kv.tokens_held(4096) == 4096 and kv.tokens_held(10_000) == 4096
    assert kv.bytes_for_context(10_000) == 512 * 2**20
    np.testing.assert_array_equal(kv.tokens_held(np.array([0, 4095, 4097, 10**9])), [0, 4095, 4096, 4096])


def test_element_size_from_name_bytes_or_precision():
    m = ModelSpec(**TINY)
    a = m.kv_cache("fp8")
    assert a == m.kv_cache(1.0) == m.kv_cache(Precision(kv="fp8")) == m.kv_cache(Precision.uniform("int8"))
    assert KVCacheSpec.from_model(m, "fp16").element_bytes == 2
    assert m.kv_bytes_per_token("fp16") == m.kv_cache("fp16").bytes_per_token == 2 * 3 * 2 * 16 * 2 == 384


def test_sharded_by_tp_and_pp():
    kv = load_model("llama-3.1-8b").kv_cache("fp16")  # 32 layers, 8 KV heads
    assert kv.sharded(tp=2).num_kv_heads == 4
    assert kv.sharded(tp=8).num_kv_heads == 1
    # tp beyond the KV heads replicates one head per GPU, never 0 heads
    assert kv.sharded(tp=16).num_kv_heads == 1 and kv.sharded(tp=16).bytes_per_token == 32 * 2 * 128 * 2
    # pp that does not divide the layers: the largest stage holds ceil(32 / 3) = 11 layers
    assert kv.sharded(pp=3).num_layers == 11
    assert kv.sharded(tp=2, pp=4).bytes_per_token == kv.bytes_per_token / 8


@pytest.mark.parametrize("kwargs,needle", [
    (dict(num_layers=0), "num_layers must be a positive integer, got 0"),
    (dict(num_kv_heads=1.5), "num_kv_heads must be a positive integer, got 1.5"),
    (dict(element_bytes=float("nan")), "element_bytes must be a finite positive number, got nan"),
    (dict(element_bytes=float("inf")), "element_bytes must be a finite positive number, got inf"),
    (dict(element_bytes=0), "element_bytes must be a finite positive number, got 0"),
    (dict(sliding_window=0), "sliding_window must be a positive integer or None, got 0"),
])
def test_bad_fields(kwargs, needle):
    base = dict(num_layers=2, num_kv_heads=2, head_dim=8, element_bytes=2.0)
    with pytest.raises(SpecError, match=needle.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        KVCacheSpec(**{**base, **kwargs})


@pytest.mark.parametrize("context", [-1, float("nan"), True, "10", np.array([1, -2])])
def test_bad_context(context):
    kv = ModelSpec(**TINY).kv_cache()
    with pytest.raises(SpecError, match="context: must be a number of tokens >= 0"):
        kv.tokens_held(context)


@pytest.mark.parametrize("block_size", [0, -16, 2.5])
def test_bad_block_size(block_size):
    with pytest.raises(SpecError, match="block_size: must be a positive integer"):
        ModelSpec(**TINY).kv_cache().bytes_per_block(block_size)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 128), st.integers(1, 64), st.sampled_from([64, 80, 128, 256]),
       st.sampled_from([0.5, 1.0, 2.0, 4.0]), st.one_of(st.none(), st.integers(1, 1 << 16)),
       st.integers(0, 1 << 20), st.integers(0, 1 << 20))
def test_properties(layers, heads, head_dim, element, window, c1, c2):
    kv = KVCacheSpec(num_layers=layers, num_kv_heads=heads, head_dim=head_dim, element_bytes=element,
                     sliding_window=window)
    assert kv.bytes_per_token == 2 * layers * heads * head_dim * element
    lo, hi = sorted((c1, c2))
    assert kv.tokens_held(lo) <= kv.tokens_held(hi) <= hi  # monotone, never more than the context
    assert kv.tokens_held(hi) == (hi if window is None else min(hi, window))
    assert kv.bytes_for_context(hi) == kv.tokens_held(hi) * kv.bytes_per_token
    # arrays and scalars agree
    assert kv.bytes_for_context(np.array([lo, hi])).tolist() == [kv.bytes_for_context(lo), kv.bytes_for_context(hi)]
