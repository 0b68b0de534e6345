"""A model whose every layer slides with one window (Mistral 7B v0.1, StreamingLLM) in the paged cache
under kv_window "capped" (`CappedBlockManager`): the blocks behind the window go back to the pool and
their table entries read as block 0; the logits equal the contiguous cache's to fp32 round-off and the
tokens those of kv_window "full" and the contiguous cache, well past the window, while the blocks held
stay within `blocks_for`."""

from __future__ import annotations

import pytest
import torch

from llmperf.engine import Engine, PagedKVCache, SamplingParams, build_model
from llmperf.engine.cache import ContiguousKVCache, capped_window
from llmperf.serving.blocks import BlockManager, CappedBlockManager
from llmperf.specs.kvcache import KVCacheSpec

from engine_testing import check_paged_usage, tiny


def mistral_like(window: int = 10):
    return tiny("mistral-7b", sliding_window=window)


@pytest.fixture(scope="module")
def model8():
    """One model (window 8) for the module's runs: a model's first run of each path warms it up."""
    return build_model(mistral_like(8), seed=5)


def test_an_all_sliding_model_gets_the_capped_manager_and_full_keeps_the_plain_one():
    spec = mistral_like()
    capped = PagedKVCache(spec, num_blocks=16, block_size=4)
    assert capped_window(spec) == ("sliding", 10) and isinstance(capped.manager, CappedBlockManager)
    assert capped.layout is None and capped.pages_per_block == 1 and capped.kv.shape[0] == spec.num_layers
    full = PagedKVCache(spec, num_blocks=16, block_size=4, kv_window="full")
    assert capped_window(spec, "full") is None and type(full.manager) is BlockManager
    assert capped_window(tiny("llama-3.1-8b")) is None  # no window
    assert capped_window(tiny("llama-3.1-8b", num_layers=4, layer_types=("sliding", "full") * 2,
                              sliding_window=8)) is None  # hybrid: WindowedBlockManager's


def test_the_step_reads_null_entries_as_block_zero():
    cache = PagedKVCache(mistral_like(6), num_blocks=16, block_size=4)
    assert cache.allocate(0, 13)
    assert cache.reserve(0, 1)  # position 13 reads keys 8..13: blocks 0 and 1 go back
    assert cache.block_table(0) == [None, None, 2, 3]
    meta = cache.prepare([0], 1)
    assert meta.block_tables.tolist() == [[0, 0, 2, 3]] and meta.slot_mapping.tolist() == [3 * 4 + 1]
    cache.check_invariants()


@pytest.mark.parametrize("attention", ["sdpa", "naive"])
def test_logits_equal_the_contiguous_cache_past_the_window(model8, attention):
    """Two sequences of different lengths: a chunked prompt, then 24 decode steps (past a window of
    8 several times over); every step's logits as the contiguous cache's."""
    from llmperf.engine.attention import get_backend

    model, spec, attend = model8, model8.spec, get_backend(attention)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, spec.vocab_size, (n,), generator=g).tolist() for n in (14, 9)]
    paged = PagedKVCache(spec, num_blocks=64, block_size=4, max_step_tokens=8)
    contiguous = ContiguousKVCache(spec, max_batch=2, max_seq_len=80)
    logits = {}
    for name, cache in (("paged", paged), ("contiguous", contiguous)):
        outs = []
        for s, prompt in enumerate(prompts):  # the prompt in chunks of up to 8 tokens
            assert cache.allocate(s, 0)
            for i in range(0, len(prompt), 8):
                chunk = prompt[i:i + 8]
                assert cache.reserve(s, len(chunk))
                out = model.forward(torch.tensor([chunk]), cache.prepare([s], len(chunk)), attend=attend)
            outs.append(out)
        tokens = [int(o.argmax()) for o in outs]
        steps = [torch.cat(outs)]
        for _ in range(24):
            for s in (0, 1):
                assert cache.reserve(s, 1)
            out = model.forward(torch.tensor([[t] for t in tokens]), cache.prepare([0, 1], 1), attend=attend)
            steps.append(out)
            tokens = out.argmax(-1).tolist()
            if name == "paged":
                assert paged.num_used_blocks <= sum(paged.blocks_for(paged.seq_len(s)) for s in (0, 1))
        logits[name] = torch.stack(steps)
    # the last steps read keys 30..37 (blocks 7..9) and 25..32 (blocks 6..8): 6 blocks, not 10 + 9
    assert paged.num_used_blocks == 3 + 3
    torch.testing.assert_close(logits["paged"], logits["contiguous"], rtol=1e-5, atol=1e-5)
    paged.check_invariants()


@pytest.mark.parametrize("options", [dict(), dict(chunked_prefill=True, max_batched_tokens=6)],
                         ids=["whole-prompt", "chunked"])
def test_tokens_equal_full_pages_and_the_contiguous_cache(model8, options):
    model = model8
    prompts = [list(range(3, 15)), list(range(40, 45)), list(range(90, 109))]
    params = SamplingParams(max_new_tokens=28, eos_token_id=None)
    runs = {}
    for name, kw in (("capped", dict(cache="paged")), ("full", dict(cache="paged", kv_window="full")),
                     ("contiguous", dict(cache="contiguous"))):
        eng = Engine(model, block_size=4, **kw, **options)
        runs[name] = [o.completions[0].tokens for o in eng.generate(prompts, params)]
        if name == "capped":
            cache = eng.cache
            assert isinstance(cache.manager, CappedBlockManager)
            held = [s.usage.reserved_bytes // (4 * cache.bytes_per_token) for s in eng.last_steps]
            # the longest holds at most the blocks of 7 keys before a step and its tokens (a 19-token
            # prompt, or 6), where full pages would hold its 47 tokens' 12
            assert max(held) <= 3 * cache.blocks_for(19 + 28)
            assert cache.blocks_for(19 + 28) == (12 if not options else 5)  # 7 + 6 keys: 4 blocks, 5 straddling
    assert runs["capped"] == runs["full"] == runs["contiguous"]
    assert all(len(t) == 28 for t in runs["capped"])


def test_the_capped_pool_serves_in_fewer_blocks_what_full_pages_preempt(model8):
    """Three long sequences in 24 blocks: full pages must preempt and recompute, the capped pool need
    not; the tokens are the same."""
    model = model8
    prompts = [list(range(1 + i, 13 + i)) for i in range(3)]
    params = SamplingParams(max_new_tokens=30, eos_token_id=None)
    runs = {}
    for window in ("capped", "full"):
        eng = Engine(model, cache="paged", block_size=4, num_blocks=24, kv_window=window, chunked_prefill=True,
                     max_batched_tokens=16)
        outs = eng.generate(prompts, params)
        runs[window] = (sum(o.metrics.num_preemptions for o in outs), [o.completions[0].tokens for o in outs])
    assert runs["capped"][0] == 0 < runs["full"][0]
    assert runs["capped"][1] == runs["full"][1]


def test_samples_fork_and_a_shared_prefix_hits_in_the_capped_pool():
    """Sampled sequences fork the prompt's blocks; a later request's prompt finds the system prompt's
    published blocks (its first item starts past them); the tokens as with full pages."""
    from llmperf.engine.workload import Request

    spec = mistral_like(16)
    model = build_model(spec, seed=2)
    system = list(range(5, 17))  # 12 tokens: 3 blocks
    requests = [Request(request_id=i, prompt=tuple(system + list(range(50 + 10 * i, 58 + 10 * i))),
                        max_new_tokens=24) for i in range(2)]
    params = SamplingParams(max_new_tokens=24, eos_token_id=None, do_sample=True, num_return_sequences=2, seed=7)
    runs = {}
    for window in ("capped", "full"):
        eng = Engine(model, cache="paged", block_size=4, kv_window=window, prefix_sharing=True,
                     chunked_prefill=True, max_batched_tokens=8)
        res = eng.serve(requests, params, realtime=False)
        runs[window] = [[c.tokens for c in o.completions] for o in res.outputs]
        firsts = {}
        for st in res.steps:
            for item in st.log.items:
                firsts.setdefault(item.request_id, item.start)
        assert firsts[0] == 0 and max(firsts.values()) == 12, firsts  # a later request shares the system prompt
        eng.cache.check_invariants()
    assert runs["capped"] == runs["full"]
    assert all(len(t) == 24 for ts in runs["capped"] for t in ts)


@pytest.mark.parametrize("engine", [dict(), dict(chunked_prefill=True, max_batched_tokens=5)], ids=["paged", "chunked"])
def test_usage_equals_the_analytical_model_at_every_step(model8, engine):
    """Reserved bytes are the window's blocks, used bytes their slots holding a token: `KVCacheSpec`
    predicts both for every step from the context and the step's first position."""
    kv = KVCacheSpec.from_model(model8.spec, 4)  # fp32
    assert kv.capped_alone and not kv.pages_apart and not kv.with_window("full").capped_alone
    eng = Engine(model8, cache="paged", block_size=4, **engine)
    eng.generate([list(range(1, 21))], SamplingParams(max_new_tokens=40, eos_token_id=None))
    checked, _ = check_paged_usage(eng.last_steps, kv, 4)
    assert checked >= 39
    assert kv.paged_blocks(60, 4) == (2,)  # position 59 reads keys 52..59: blocks 13 and 14, not the 15 of 60
