"""`KVCacheSpec` for today's models (issue 22): MLA's latent, groups of full / sliding / chunked
layers, the window switch (capped vs full pages), paging per group, pipeline slices. Golden values
are computed by hand in the comment beside them; the specs are built from the public configs
(`data/hf-configs/`), independent of the YAML catalog."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmperf.errors import SpecError
from llmperf.specs import KVCacheSpec, ModelSpec, Precision
from llmperf.specs.kvcache import pipeline_stages

GIB = 2**30

from todays_specs import DEEPSEEK_V3, GPT_OSS_20B, SCOUT  # noqa: E402  (tests/ is on sys.path)


def test_deepseek_v3_latent_is_576_elements_a_layer_and_never_split_by_tp():
    """61 layers x (512 + 64) x 2 B = 70,272 B a token at bf16 (MHA with 128 heads of 128 would be
    61 x 2 x 128 x 128 x 2 = 3,997,696 B); every TP rank holds the whole latent."""
    m = ModelSpec(**DEEPSEEK_V3)
    kv = m.kv_cache("bf16")
    assert kv.latent and kv.num_kv_heads == 1 and kv.head_dim == 576
    assert kv.bytes_per_token_per_layer == 576 * 2 == m.kv_width_per_token_per_layer * 2
    assert kv.bytes_per_token == 61 * 576 * 2 == 70_272 == m.kv_bytes_per_token("bf16")
    assert 61 * 2 * 128 * 128 * 2 == 3_997_696
    for tp in (1, 2, 8, 16):
        assert kv.sharded(tp=tp).bytes_per_token == 70_272
    assert kv.bytes_for_context(4096) == 4096 * 70_272
    assert m.kv_cache("fp8").bytes_per_token == 61 * 576


def test_gpt_oss_20b_at_8k_x_32_capped_and_full_pages_match_hf_mem():
    """12 sliding (128) + 12 full layers, 2 x 8 x 64 x 2 B = 2048 B a token and layer.
    Per token (no cap reached): 24 x 2048 = 49,152 B. At 8192 tokens x 32 sequences:
    capped 12 x (8192 + 128) x 2048 x 32 = 6,543,114,240 B = 6.09 GiB; full pages
    24 x 8192 x 2048 x 32 = 12 GiB exactly (hf-mem PR #70 quotes 6.09 -> 12.00 GiB)."""
    kv = ModelSpec(**GPT_OSS_20B).kv_cache("bf16")
    assert kv.bytes_per_token_per_layer == 2048 and kv.bytes_per_token == 49_152
    capped = 32 * kv.bytes_for_context(8192)
    full = 32 * kv.with_window("full").bytes_for_context(8192)
    assert capped == 12 * (8192 + 128) * 2048 * 32 == 6_543_114_240
    assert round(capped / GIB, 2) == 6.09 and capped / GIB == 6.09375
    assert full == 24 * 8192 * 2048 * 32 == 12 * GIB
    assert [(g.label, g.num_layers) for g in kv.groups] == [("sliding-128", 12), ("full", 12)]
    assert kv.by_layer_kind(8192) == [("sliding-128", 12, 12 * 128 * 2048), ("full", 12, 12 * 8192 * 2048)]
    assert [label for label, _, _ in kv.with_window("full").by_layer_kind(10)] == ["sliding-128 (full pages)", "full"]
    # the average tokens a layer keeps, so that bytes_for_context = tokens_held x bytes_per_token
    assert kv.tokens_held(8192) == (8192 + 128) / 2 and kv.tokens_held(100) == 100
    # below the window nothing is capped: the two modes agree
    assert kv.bytes_for_context(128) == kv.with_window("full").bytes_for_context(128) == 128 * 49_152


def test_chunked_layers_hold_a_chunk_and_use_the_current_one():
    """Scout at 20,000 tokens: 12 full layers hold 20,000; the 36 chunked (8192) layers must be able
    to hold a whole chunk (the allocation bound, min(c, C) = 8192) and use the current chunk,
    ((20,000 - 1) % 8192) + 1 = 3616 tokens (vLLM frees the earlier chunks)."""
    kv = ModelSpec(**SCOUT).kv_cache("bf16")
    per_layer = 2 * 8 * 128 * 2
    chunked, full = kv.groups
    assert (chunked.label, chunked.num_layers, full.label, full.num_layers) == ("chunked-8192", 36, "full", 12)
    assert chunked.tokens_held(20_000) == 8192 and chunked.tokens_in_use(20_000) == 3616
    assert chunked.tokens_in_use(8192) == 8192 and chunked.tokens_in_use(8193) == 1 and chunked.tokens_in_use(0) == 0
    np.testing.assert_array_equal(chunked.tokens_in_use(np.array([1, 8192, 16384, 16385])), [1, 8192, 8192, 1])
    assert full.tokens_in_use(20_000) == 20_000
    assert kv.bytes_for_context(20_000) == (36 * 8192 + 12 * 20_000) * per_layer
    assert kv.with_window("full").bytes_for_context(20_000) == 48 * 20_000 * per_layer


def test_each_group_pages_separately():
    """gpt-oss-20b at 130 tokens, blocks of 16: the sliding layers keep 128 tokens = 8 blocks, the
    full layers 130 = 9 blocks (144 slots): 12 x (128 + 144) x 2048 B."""
    kv = ModelSpec(**GPT_OSS_20B).kv_cache("bf16")
    assert kv.paged_bytes_for_context(130, 16) == 12 * (128 + 144) * 2048
    assert kv.with_window("full").paged_bytes_for_context(130, 16) == 24 * 144 * 2048
    np.testing.assert_array_equal(kv.paged_bytes_for_context(np.array([0, 1, 130]), 16),
                                  [0, 24 * 16 * 2048, 12 * (128 + 144) * 2048])


def test_a_uniform_model_is_one_group_and_unchanged():
    """Llama-style layers listed one by one (layer_types all full, or all sliding) give the numbers of
    the spec without layer_types; Mistral-7B's window caps as before (512 MiB at 10,000 tokens)."""
    base = dict(name="m", vocab_size=100, hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=2,
                ffn_size=128, max_positions=1 << 20)
    plain = ModelSpec(**base).kv_cache("fp16")
    listed = ModelSpec(**base, layer_types=("full",) * 4).kv_cache("fp16")
    assert plain.uniform and listed.uniform
    for c in (0, 1, 100, 10**6):
        assert listed.bytes_for_context(c) == plain.bytes_for_context(c) == c * 4 * 2 * 2 * 16 * 2
        assert listed.tokens_held(c) == plain.tokens_held(c) == c
    sliding = ModelSpec(**base, sliding_window=64).kv_cache("fp16")
    listed = ModelSpec(**base, sliding_window=64, layer_types=("sliding",) * 4).kv_cache("fp16")
    assert listed.bytes_for_context(1000) == sliding.bytes_for_context(1000) == 64 * sliding.bytes_per_token
    mistral = KVCacheSpec(num_layers=32, num_kv_heads=8, head_dim=128, element_bytes=2, sliding_window=4096)
    assert mistral.bytes_for_context(10_000) == 512 * 2**20
    assert mistral.with_window("full").bytes_for_context(10_000) == 10_000 * 131_072


def test_pipeline_stages_and_slices():
    """vLLM's partition: 32 layers on 3 stages -> 11, 11, 10; gpt-oss's 24 on 5 -> 5, 5, 5, 5, 4. The
    stages' caches sum to the whole; `sharded(pp=)` of a mixed cache is the stage with the most
    full layers (stage 0 of 5: layers 0..4 = 2 full + 3 sliding; stage 1: 5..9 = 3 full)."""
    assert [len(r) for r in pipeline_stages(32, 3)] == [11, 11, 10]
    assert [(r.start, r.stop) for r in pipeline_stages(24, 5)] == [(0, 5), (5, 10), (10, 15), (15, 20), (20, 24)]
    kv = ModelSpec(**GPT_OSS_20B).kv_cache("bf16")
    stages = [kv.stage(i, 5) for i in range(5)]
    assert sum(s.bytes_for_context(5000) for s in stages) == kv.bytes_for_context(5000)
    assert [[g.num_layers for g in s.groups] for s in stages][:2] == [[3, 2], [3, 2]]
    assert [(g.attention, g.num_layers) for g in kv.stage(1, 5).groups] == [("full", 3), ("sliding", 2)]
    assert kv.sharded(pp=5) == kv.stage(1, 5)
    assert kv.sharded(tp=4).num_kv_heads == 2 and kv.sharded(tp=16).num_kv_heads == 1
    with pytest.raises(SpecError, match="pp: 25 exceeds num_layers=24"):
        pipeline_stages(24, 25)
    with pytest.raises(SpecError, match="stage: must be an integer in 0..4"):
        kv.stage(5, 5)


def test_element_size_from_a_precision_and_the_window_from_the_caller():
    m = ModelSpec(**GPT_OSS_20B)
    assert KVCacheSpec.from_model(m, Precision(kv="fp8")).bytes_per_token == 24 * 1024
    assert KVCacheSpec.from_model(m, "bf16", window="full") == m.kv_cache("bf16").with_window("full")


@pytest.mark.parametrize("kwargs,needle", [
    (dict(layer_types=("full",)), "layer_types must list num_layers=2 kinds"),
    (dict(layer_types=("full", "global")), "layer_types holds 'global'"),
    (dict(layer_types=("full", "sliding")), "layer_types has sliding layers but sliding_window is not set"),
    (dict(layer_types=("chunked", "full")), "layer_types has chunked layers but attention_chunk_size is not set"),
    (dict(attention_chunk_size=0), "attention_chunk_size must be a positive integer or None, got 0"),
    (dict(latent=True), "a latent cache \\(MLA\\) has one latent head, got num_kv_heads=2"),
    (dict(latent=1), "latent must be true or false"),
    (dict(window="ideal"), "window must be one of capped, full, got 'ideal'"),
])
def test_bad_fields(kwargs, needle):
    with pytest.raises(SpecError, match=needle):
        KVCacheSpec(**{**dict(num_layers=2, num_kv_heads=2, head_dim=8, element_bytes=2.0), **kwargs})


layer_kinds = st.lists(st.sampled_from(["full", "sliding", "chunked"]), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(layer_kinds, st.integers(1, 8), st.sampled_from([16, 64, 128]), st.sampled_from([0.5, 1.0, 2.0]),
       st.integers(1, 5000), st.integers(1, 5000), st.booleans(), st.integers(0, 1 << 16), st.integers(0, 1 << 16),
       st.sampled_from([1, 16, 32]))
def test_properties(kinds, heads, head_dim, element, window, chunk, latent, c1, c2, block):
    """Non-decreasing in the context, capped <= full pages = context x bytes_per_token, the groups and
    the pipeline stages sum to the whole, paged >= unpaged by less than a block a group, arrays agree
    with scalars."""
    kv = KVCacheSpec(num_layers=len(kinds), num_kv_heads=1 if latent else heads, head_dim=head_dim,
                     element_bytes=element, sliding_window=window, attention_chunk_size=chunk,
                     layer_types=tuple(kinds), latent=latent)
    full = kv.with_window("full")
    lo, hi = sorted((c1, c2))
    assert kv.bytes_for_context(lo) <= kv.bytes_for_context(hi)
    assert kv.bytes_for_context(hi) <= full.bytes_for_context(hi) == hi * kv.bytes_per_token
    assert sum(b for _, _, b in kv.by_layer_kind(hi)) == kv.bytes_for_context(hi)
    assert kv.tokens_held(hi) * kv.bytes_per_token == pytest.approx(kv.bytes_for_context(hi), rel=1e-12)
    pp = min(3, len(kinds))
    assert sum(kv.stage(i, pp).bytes_for_context(hi) for i in range(pp)) == kv.bytes_for_context(hi)
    paged = kv.paged_bytes_for_context(hi, block)
    assert kv.bytes_for_context(hi) <= paged < kv.bytes_for_context(hi) + block * kv.bytes_per_token + 1e-9
    assert kv.bytes_for_context(np.array([lo, hi])).tolist() == [kv.bytes_for_context(lo), kv.bytes_for_context(hi)]
    for g in kv.groups:
        assert g.tokens_in_use(hi) <= g.tokens_held(hi) <= hi
