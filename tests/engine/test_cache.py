"""KV caches: bytes per token equal the spec's, reserved vs used bytes of contiguous and paged caches
on a ragged workload, copy-on-write, beam reordering, and the storage layouts."""

from __future__ import annotations

import pytest
import torch

from llmperf.engine import ContiguousKVCache, Engine, PagedKVCache, SamplingParams, generate_workload

from engine_testing import SPECS, make_model


@pytest.mark.parametrize("dtype,name", [(torch.float32, "fp32"), (torch.float16, "fp16"), (torch.bfloat16, "bf16")])
@pytest.mark.parametrize("kind", ["llama", "gpt2", "mixtral"])
def test_bytes_per_token_equal_the_spec(kind, dtype, name):
    spec = SPECS[kind]()
    contiguous = ContiguousKVCache(spec, max_batch=3, max_seq_len=40, dtype=dtype)
    paged = PagedKVCache(spec, num_blocks=10, block_size=8, dtype=dtype)
    expected = spec.kv_bytes_per_token(name)
    for cache, slots in ((contiguous, 3 * 40), (paged, 10 * 8)):
        assert cache.bytes_per_token == expected
        # the real storage, byte for byte: tensor bytes / token slots
        assert cache.kv.numel() * cache.kv.element_size() == slots * expected == cache.capacity_bytes


def test_published_llama2_7b_fp16_kv_is_512_kib_per_token():
    from llmperf.specs import load_model

    spec = load_model("llama-2-7b")
    cache = PagedKVCache(spec, num_blocks=1, block_size=1, dtype=torch.float16)
    assert cache.bytes_per_token == 524_288 == spec.kv_bytes_per_token("fp16")


def test_layouts():
    spec = SPECS["llama"]()
    c = ContiguousKVCache(spec, max_batch=3, max_seq_len=40)
    p = PagedKVCache(spec, num_blocks=10, block_size=8)
    L, H_kv, D = spec.num_layers, spec.num_kv_heads, spec.head_dim
    assert c.kv.shape == (L, 2, 3, H_kv, 40, D)
    assert p.kv.shape == (L, 2, 10, 8, H_kv, D)
    assert p.pools(1)[0].shape == (10, 8, H_kv, D)


def test_ragged_workload_paged_uses_memory_better_than_contiguous():
    model = make_model("llama", seed=1)
    reqs = generate_workload(8, prompt_len="uniform:4:40", output_len="uniform:4:40", vocab_size=256, seed=2)
    results = {}
    for kind in ("contiguous", "paged"):
        engine = Engine(model, cache=kind, block_size=8, max_batch=8, max_seq_len=96)
        results[kind] = engine.serve(reqs, SamplingParams(), realtime=False)
    steps = {k: r.steps for k, r in results.items()}
    for kind, ss in steps.items():
        for s in ss:
            u = s.usage
            assert u.used_bytes <= u.reserved_bytes <= u.capacity_bytes
            assert u.used_bytes == u.logical_tokens * u.bytes_per_token  # no forks here
    contiguous = results["contiguous"].mean_utilization
    paged = results["paged"].mean_utilization
    # Contiguous rows reserve max_seq_len = 96 slots for sequences of 8..80 tokens; paged wastes
    # less than one 8-token block per sequence.
    assert contiguous < 0.5 < 0.8 < paged
    s = steps["contiguous"][0].usage
    assert s.reserved_bytes == s.num_seqs * 96 * s.bytes_per_token


def test_copy_on_write_keeps_the_parent_intact():
    spec = SPECS["llama"]()
    cache = PagedKVCache(spec, num_blocks=8, block_size=4)
    assert cache.allocate(0, 6)  # blocks: one full, one with 2 of 4 slots
    cache.kv.normal_()
    before = cache.kv.clone()
    table = cache.block_table(0)
    cache.fork(0, 1)
    assert cache.append_slot(1)  # child writes into the shared half-full block: copy it first
    child_table = cache.block_table(1)
    assert child_table[0] == table[0] and child_table[1] != table[1]
    torch.testing.assert_close(cache.kv[:, :, child_table[1], :2], before[:, :, table[1], :2], rtol=0, atol=0)
    torch.testing.assert_close(cache.kv[:, :, table[1]], before[:, :, table[1]], rtol=0, atol=0)
    cache.check_invariants()
    cache.free(0)
    cache.free(1)
    assert cache.num_free_blocks == 8


@pytest.mark.parametrize("kind", ["contiguous", "paged"])
def test_fork_without_room_returns_false_and_changes_nothing(kind):
    """`KVCache.fork`'s contract, for both caches: False when there is no room (a contiguous cache
    has no free row; a paged fork shares blocks and needs none), never an exception."""
    spec = SPECS["llama"]()
    cache = (ContiguousKVCache(spec, max_batch=2, max_seq_len=8) if kind == "contiguous"
             else PagedKVCache(spec, num_blocks=2, block_size=4))
    assert cache.allocate(0, 4) and cache.allocate(1, 4)
    cache.kv.normal_()
    before = cache.kv.clone()
    expected = kind == "paged"
    assert cache.fork(0, 2) is expected
    assert sorted(cache.live_ids()) == ([0, 1, 2] if expected else [0, 1])
    torch.testing.assert_close(cache.kv, before, rtol=0, atol=0)
    cache.free(1)
    assert cache.fork(0, 3) is True  # room again


@pytest.mark.parametrize("kind", ["contiguous", "paged"])
def test_reorder_moves_whole_sequences(kind):
    spec = SPECS["llama"]()
    cache = (ContiguousKVCache(spec, max_batch=3, max_seq_len=12) if kind == "contiguous"
             else PagedKVCache(spec, num_blocks=12, block_size=4))
    for s, n in ((10, 5), (11, 7), (12, 3)):
        assert cache.allocate(s, n)
    cache.kv.normal_()
    meta = cache.prepare([10, 11, 12], 1)
    k_before, _ = cache.gather(0, meta)
    k_before = k_before.clone()
    assert cache.reorder([10, 11, 12], [1, 1, 0])
    assert [cache.seq_len(s) for s in (10, 11, 12)] == [7, 7, 5]
    k_after, _ = cache.gather(0, cache.prepare([10, 11, 12], 1))
    torch.testing.assert_close(k_after[0, :, :7], k_before[1, :, :7], rtol=0, atol=0)
    torch.testing.assert_close(k_after[1, :, :7], k_before[1, :, :7], rtol=0, atol=0)
    torch.testing.assert_close(k_after[2, :, :5], k_before[0, :, :5], rtol=0, atol=0)
    if kind == "paged":
        cache.check_invariants()


def test_shortage_is_reported_not_corrupting():
    spec = SPECS["llama"]()
    cache = PagedKVCache(spec, num_blocks=2, block_size=4)
    assert cache.allocate(0, 8)
    assert not cache.can_allocate([1])
    assert not cache.allocate(1, 1) and 1 not in cache
    assert not cache.append_slot(0)  # no block for the ninth token: nothing changed
    assert cache.seq_len(0) == 8
    contiguous = ContiguousKVCache(spec, max_batch=1, max_seq_len=4)
    assert contiguous.allocate(0, 4)
    assert not contiguous.append_slot(0) and contiguous.seq_len(0) == 4
    assert not contiguous.allocate(1, 1)


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.integers(1, 23), min_size=1, max_size=4), extra=st.integers(0, 6),
       block_size=st.sampled_from([1, 3, 4, 16]))
def test_paged_and_contiguous_store_the_same_keys_and_values(lengths, extra, block_size):
    """Prefill each sequence alone, then decode `extra` ragged steps: both caches gather the same K/V."""
    spec = SPECS["llama"]()
    H_kv, D = spec.num_kv_heads, spec.head_dim
    caches = [ContiguousKVCache(spec, max_batch=len(lengths), max_seq_len=32),
              PagedKVCache(spec, num_blocks=len(lengths) * -(-32 // block_size), block_size=block_size)]
    g = torch.Generator().manual_seed(len(lengths) * 100 + extra)
    writes = [(s, n) for s, n in enumerate(lengths)]
    kv = {(s, n): (torch.randn(1, n, H_kv, D, generator=g), torch.randn(1, n, H_kv, D, generator=g)) for s, n in writes}
    steps = [torch.randn(len(lengths), 1, H_kv, D, generator=g) for _ in range(extra)]
    for cache in caches:
        for s, n in writes:
            assert cache.allocate(s, n)
            k, v = kv[s, n]
            for layer in range(spec.num_layers):
                cache.write(layer, k, v, cache.prepare([s], n))
        for k in steps:
            for s in range(len(lengths)):
                assert cache.append_slot(s)
            meta = cache.prepare(list(range(len(lengths))), 1)
            cache.write(1, k, -k, meta)
    seqs = list(range(len(lengths)))
    metas = [c.prepare(seqs, 1) for c in caches]
    (k0, v0), (k1, v1) = (c.gather(1, m) for c, m in zip(caches, metas))
    for b, n in enumerate(lengths):
        torch.testing.assert_close(k0[b, :, :n + extra], k1[b, :, :n + extra], rtol=0, atol=0)
        torch.testing.assert_close(v0[b, :, :n + extra], v1[b, :, :n + extra], rtol=0, atol=0)
    assert caches[0].usage().logical_tokens == caches[1].usage().logical_tokens == sum(lengths) + extra * len(lengths)


def test_block_runs_find_tables_that_are_one_equally_spaced_run_each():
    from llmperf.engine.cache import _block_runs

    assert _block_runs([[3, 4, 5]], 3) == (3, 3)
    assert _block_runs([[3, 4, 5, 9]], 3) == (3, 3)  # only the blocks the step reads count
    assert _block_runs([[0, 1], [4, 5], [8, 9]], 2) == (0, 4)
    assert _block_runs([[0, 1], [4, 5], [9, 10]], 2) is None  # unequal spacing
    assert _block_runs([[4, 5], [0, 1]], 2) is None  # descending: no positive stride
    assert _block_runs([[0, 1], [1, 2]], 2) is None  # overlapping runs
    assert _block_runs([[0, 2]], 2) is None and _block_runs([[0]], 2) is None


def test_paged_gather_view_equals_the_copying_gather():
    """A step whose blocks are one run per sequence reads the pool in place (a strided view); the
    values are those of the gather that copies blocks (forced by dropping the run)."""
    spec = SPECS["llama"]()
    cache = PagedKVCache(spec, num_blocks=12, block_size=4)
    g = torch.Generator().manual_seed(7)
    for s, n in enumerate((9, 9)):  # 3 blocks each: [0, 1, 2], [3, 4, 5]
        assert cache.allocate(s, n)
        for layer in range(spec.num_layers):
            shape = (1, n, spec.num_kv_heads, spec.head_dim)
            cache.write(layer, torch.randn(shape, generator=g), torch.randn(shape, generator=g), cache.prepare([s], n))
    meta = cache.prepare([0, 1], 1)
    assert meta._memo["block_runs"] == (0, 3)
    view = cache.gather(1, meta)
    assert view[0].data_ptr() == cache.kv[1, 0].data_ptr()  # the pool itself, no copy
    del meta._memo["block_runs"]
    copy = cache.gather(1, meta)
    for a, b in zip(view, copy):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
