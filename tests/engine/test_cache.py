"""KV caches: bytes per token equal the spec's, reserved vs used bytes of contiguous and paged caches
on a ragged workload, copy-on-write, beam reordering, and the storage layouts."""

from __future__ import annotations

import pytest
import torch

from conftest import SPECS, make_model
from llmperf.engine import ContiguousKVCache, Engine, PagedKVCache, SamplingParams, generate_workload


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
    table = cache.manager.block_table(0)
    cache.fork(0, 1)
    assert cache.append_slot(1)  # child writes into the shared half-full block: copy it first
    child_table = cache.manager.block_table(1)
    assert child_table[0] == table[0] and child_table[1] != table[1]
    torch.testing.assert_close(cache.kv[:, :, child_table[1], :2], before[:, :, table[1], :2], rtol=0, atol=0)
    torch.testing.assert_close(cache.kv[:, :, table[1]], before[:, :, table[1]], rtol=0, atol=0)
    cache.manager.check_invariants()
    cache.free(0)
    cache.free(1)
    assert cache.num_free_blocks == 8


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
        cache.manager.check_invariants()


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
