"""A hybrid model's paged cache (sliding or chunked layers beside full ones) holds only what each layer
can still read: exact block tables as the window slides, copy-on-write and reference counts of forks
in a window group, prefix sharing of window blocks, the per-group addressing the attention reads
through, and the engine's bytes equal to the analytical model (`KVCacheSpec.paged_reserved_bytes`,
`paged_used_bytes`) at every step of a few hundred tokens, for gpt-oss-, Gemma-3- and Llama-4-like
layer patterns."""

from __future__ import annotations

import pytest
import torch

from llmperf.engine import Engine, PagedKVCache, SamplingParams, build_model
from llmperf.specs.kvcache import KVCacheSpec

from engine_testing import check_paged_usage, tiny

#: today's layer patterns on tiny dense models (the KV cache only sees each layer's attention kind)
HYBRID = {
    # gpt-oss: sliding and full layers alternate (window 128 there)
    "gpt-oss-like": lambda: tiny("llama-3.1-8b", num_layers=4, layer_types=("sliding", "full") * 2,
                                 sliding_window=8),
    # Gemma 3: 5 sliding : 1 full (its own pattern, first 6 layers); a window that straddles blocks
    "gemma-3-like": lambda: tiny("gemma-3-27b", num_layers=6, sliding_window=10),
    # Llama 4: 3 chunked : 1 full; a chunk that ends inside a block
    "llama-4-like": lambda: tiny("llama-3.1-8b", num_layers=4, layer_types=("chunked",) * 3 + ("full",),
                                 attention_chunk_size=14),
}


def gpt_oss_cache(num_blocks: int = 32) -> PagedKVCache:
    return PagedKVCache(HYBRID["gpt-oss-like"](), num_blocks=num_blocks, block_size=4)


def test_layout_pages_each_kind_apart():
    gemma = PagedKVCache(HYBRID["gemma-3-like"](), num_blocks=8, block_size=4)
    spec = gemma.spec
    assert gemma.layout.full == (5,) and gemma.layout.members == ((0, 1, 2, 3, 4),)
    assert gemma.kv.shape == (1, 2, 8, 4, spec.num_kv_heads, spec.head_dim)  # a pool block: the 1 full layer
    assert [gemma.layout.address(i) for i in range(6)] == [(1, 0), (2, 0), (3, 0), (4, 0), (5, 0), (0, 0)]
    assert gemma.pages_per_block == 6
    oss = gpt_oss_cache()
    assert oss.kv.shape[0] == 2 and [oss.layout.address(i) for i in range(4)] == [(1, 0), (0, 0), (1, 1), (0, 1)]
    # "full" pages, or a model with one kind of layer: one table over every layer, as before
    full = PagedKVCache(HYBRID["gpt-oss-like"](), num_blocks=8, block_size=4, kv_window="full")
    assert full.layout is None and full.kv.shape[0] == 4
    with pytest.raises(ValueError, match="kv_window: must be one of capped, full, got 'half'"):
        PagedKVCache(HYBRID["gpt-oss-like"](), num_blocks=8, block_size=4, kv_window="half")


def test_sliding_blocks_go_back_as_the_window_passes():
    cache = gpt_oss_cache()
    m = cache.manager
    assert cache.allocate(0, 10)  # 3 full blocks, and the prompt's 3 in the sliding layers
    assert (m.block_table(0), m.window_table(0, 0), cache.num_free_blocks) == ([0, 1, 2], [(3,), (4,), (5,)], 26)
    assert cache.reserve(0, 1)  # position 10 reads keys 3..10: block 0 still
    assert m.window_table(0, 0) == [(3,), (4,), (5,)]
    assert cache.reserve(0, 1)  # position 11 reads keys 4..11: block 0 (positions 0..3) goes back
    assert (m.window_table(0, 0), cache.num_free_blocks) == ([None, (4,), (5,)], 27)
    assert cache.reserve(0, 1)  # position 12 opens a block in both groups
    assert (m.block_table(0), m.window_table(0, 0), cache.num_free_blocks) == (
        [0, 1, 2, 6], [None, (4,), (5,), (7,)], 25)
    for _ in range(3):
        assert cache.reserve(0, 1)
    assert m.window_table(0, 0) == [None, None, (5,), (7,)]  # position 15 reads from 8
    # the step's addressing: the full layers read the full table, the sliding ones theirs, block 0 as null
    meta = cache.prepare([0], 1)
    assert meta.block_tables.tolist() == [[0, 1, 2, 6]] and meta.group_tables[0].tolist() == [[0, 0, 5, 7]]
    assert meta.layer_tables == (1, 0, 1, 0)
    assert meta.slot_mapping_for(0).tolist() == [7 * 4 + 3] and meta.slot_mapping_for(1).tolist() == [6 * 4 + 3]
    assert meta.block_tables_for(1) is meta.block_tables and meta.block_tables_for(2) is meta.group_tables[0]
    cache.check_invariants()
    cache.free(0)
    assert cache.num_free_blocks == 32


def test_chunked_blocks_before_the_chunk_go_back():
    cache = PagedKVCache(HYBRID["llama-4-like"](), num_blocks=64, block_size=4)
    m = cache.manager
    assert cache.allocate(0, 13)  # chunk 0 is positions 0..13
    assert m.window_table(0, 0) == [(4, 5, 6), (7, 8, 9), (10, 11, 12), (13, 14, 15)]  # 3 chunked layers: 3 pages
    assert cache.reserve(0, 1)  # position 13: still chunk 0
    assert len([e for e in m.window_table(0, 0) if e]) == 4
    assert cache.reserve(0, 1)  # position 14 starts chunk 1 (14..27): blocks 0..2 go back, block 3 (12..15) stays
    assert m.window_table(0, 0) == [None, None, None, (13, 14, 15)]
    assert cache.num_free_blocks == 64 - 4 - 3
    cache.check_invariants()


def test_fork_shares_window_blocks_and_copies_on_write():
    cache = gpt_oss_cache()
    m = cache.manager
    assert cache.allocate(0, 6)
    meta = cache.prepare([0], 6)
    g = torch.Generator().manual_seed(0)
    shape = (1, 6, cache.num_kv_heads, cache.head_dim)
    kv = {layer: (torch.randn(shape, generator=g), torch.randn(shape, generator=g)) for layer in range(4)}
    for layer, (k, v) in kv.items():
        cache.write(layer, k, v, meta)
    assert cache.fork(0, 1)
    assert [m.pool.refcount(b) for b in (0, 1, 2, 3)] == [2, 2, 2, 2]  # full 0, 1; sliding 2, 3
    assert cache.reserve(1, 1)  # the child writes position 6 into shared blocks: each group copies its block
    assert (m.block_table(1), m.window_table(1, 0)) == ([0, 4], [(2,), (5,)])
    assert (m.block_table(0), m.window_table(0, 0)) == ([0, 1], [(2,), (3,)])
    for layer in range(4):  # the child's copies hold the parent's two tokens of the block, in every layer
        pool_k = cache.pools(layer)[0]
        src, dst = (1, 4) if layer % 2 else (3, 5)
        torch.testing.assert_close(pool_k[dst, :2], pool_k[src, :2], rtol=0, atol=0)
        torch.testing.assert_close(pool_k[src, :2], kv[layer][0][0, 4:6], rtol=0, atol=0)
    for _ in range(6):  # the child's window leaves block 0 (a block it shares with its parent)
        assert cache.reserve(1, 1)
    assert m.window_table(1, 0)[0] is None and m.pool.refcount(2) == 1  # the parent still holds it
    assert m.window_table(0, 0) == [(2,), (3,)]
    cache.check_invariants()
    cache.free(0)
    cache.free(1)
    assert cache.num_free_blocks == 32


def test_prefix_sharing_takes_the_window_blocks_the_first_step_reads():
    cache = gpt_oss_cache()
    m = cache.manager
    prompt = list(range(13))
    assert cache.allocate(0, 13)
    cache.publish(0, prompt, 13)
    # the next request with this prompt computes from token 12: the full layers share blocks 0..2, the
    # sliding layers the blocks its first query (12, reading 5..12) needs: 1 and 2
    assert cache.cached_prefix(prompt, 12) == 12
    assert cache.allocate(1, 13, prefix=prompt)
    assert m.block_table(1)[:3] == m.block_table(0)[:3]
    assert m.window_table(1, 0)[:3] == [None] + m.window_table(0, 0)[1:3]
    assert m.window_table(1, 0)[3] != m.window_table(0, 0)[3]
    cache.check_invariants()
    # once the publisher's window left blocks 1 and 2, no prefix of it can be taken (every h needs them)
    for _ in range(8):
        assert cache.reserve(0, 1)
    cache.free(1)
    assert m.window_table(0, 0)[:3] == [None, None, None]
    assert cache.cached_prefix(prompt, 12) == 0
    cache.check_invariants()


@pytest.mark.parametrize("name", list(HYBRID))
@pytest.mark.parametrize("engine", [dict(), dict(chunked_prefill=True, max_batched_tokens=5)],
                         ids=["paged", "chunked"])
def test_usage_equals_the_analytical_model_at_every_step(name, engine):
    """Reserved bytes are the pool blocks held (a padded sub-group whole), used bytes the slots holding
    a token in the layers that exist; `KVCacheSpec` predicts both for every step from the context and
    the step's first position."""
    spec = HYBRID[name]()
    kv = KVCacheSpec.from_model(spec, 4)  # fp32
    assert kv.pages_apart
    eng = Engine(build_model(spec, seed=0), cache="paged", block_size=4, **engine)
    out = eng.generate([list(range(1, 31))], SamplingParams(max_new_tokens=200, eos_token_id=None))
    assert len(out[0].completions[0].tokens) == 200
    checked, finished = check_paged_usage(eng.last_steps, kv, 4)
    assert all(usage == (0, 0) for usage in finished)  # the sequence was freed after the step
    assert checked == len(eng.last_steps) - 1 >= 199
    if name == "gpt-oss-like":  # at 228 tokens: 57 blocks in the full layers, 3 in the sliding ones
        # the last step (position 227) reads keys 220..227: blocks 55 and 56 of the sliding layers
        assert kv.paged_blocks(228, 4) == (2, 57)  # groups in order of first appearance: sliding, full
        assert kv.paged_reserved_bytes(228, 4) == (57 + 2) * 4 * 2 * kv.bytes_per_token_per_layer


def test_freeing_leaves_room_and_preemption_recomputes_the_same_tokens():
    """The same bytes hold four long gpt-oss-like sequences when the sliding layers give their old
    blocks back, and not with full pages (preemptions); a smaller capped pool preempts too. The tokens
    are the same in all three."""
    spec = HYBRID["gpt-oss-like"]()
    model = build_model(spec, seed=0)
    prompts = [list(range(1 + i, 21 + i)) for i in range(4)]
    params = SamplingParams(max_new_tokens=60, eos_token_id=None)
    runs = {}
    # a capped pool block holds the 2 full layers, a "full" one all 4: 120 and 60 blocks are the same bytes
    for window, num_blocks in (("capped", 120), ("full", 60), ("capped", 72)):
        eng = Engine(model, cache="paged", block_size=4, num_blocks=num_blocks, kv_window=window,
                     chunked_prefill=True, max_batched_tokens=20)
        outs = eng.generate(prompts, params)
        runs[window, num_blocks] = (eng.cache.capacity_bytes, sum(o.metrics.num_preemptions for o in outs),
                                    [o.completions[0].tokens for o in outs])
    assert runs["capped", 120][0] == runs["full", 60][0]
    assert runs["capped", 120][1] == 0 and runs["full", 60][1] > 0 and runs["capped", 72][1] > 0
    assert runs["capped", 120][2] == runs["full", 60][2] == runs["capped", 72][2]


def test_the_contiguous_cache_keeps_whole_rows():
    """The naive server's cache: a hybrid model's sliding layers keep their whole row too (nothing is
    reclaimed while a sequence lives), the tokens those of the paged cache that gives blocks back."""
    spec = HYBRID["gemma-3-like"]()
    model = build_model(spec, seed=0)
    params = SamplingParams(max_new_tokens=40, eos_token_id=None)
    contiguous = Engine(model, cache="contiguous", max_batch=1, max_seq_len=80)
    paged = Engine(model, cache="paged", block_size=4)
    tokens = [e.generate([list(range(1, 31))], params)[0].completions[0].tokens for e in (contiguous, paged)]
    assert tokens[0] == tokens[1]
    assert {s.usage.reserved_bytes for s in contiguous.last_steps[:-1]} == {80 * spec.kv_bytes_per_token("fp32")}
