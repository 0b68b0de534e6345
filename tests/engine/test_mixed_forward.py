"""A mixed step (decode tokens and prefill chunks of different lengths) runs as ONE forward: every
GEMM reads its weights once per step, as a serving engine does and as the simulator prices it. The
grouped forward gives the logits that one forward per group gives, for every family, cache and
backend, and it is what the runner really runs."""

from __future__ import annotations

import pytest
import torch

from llmperf.engine import Engine, Recorder, SamplingParams
from llmperf.engine.cache import make_cache

from engine_testing import make_model


def _caches(model, kind):
    return make_cache(kind, model.spec, dtype=model.dtype, device="cpu", max_batch=8, max_seq_len=64, block_size=4)


def _fill(cache, seq_ids, lengths):
    for s, n in zip(seq_ids, lengths):
        assert cache.allocate(s, n)


@pytest.mark.parametrize("kind", ["llama", "gpt2", "mixtral", "mistral", "gpt2_scaled"])
@pytest.mark.parametrize("cache_kind", ["contiguous", "paged"])
@pytest.mark.parametrize("backend", ["sdpa", "naive"])
def test_grouped_forward_equals_one_forward_per_group(kind, cache_kind, backend):
    """Groups of 2 x 1 token (decode), 1 x 7 and 1 x 3 (prefill chunks over some context): the
    grouped forward's logits and the cache it leaves equal those of one forward per group."""
    torch.manual_seed(0)
    model = make_model(kind, seed=3)
    contexts = {0: 9, 1: 12, 2: 0, 3: 5}  # tokens already cached per sequence
    new = {0: 1, 1: 1, 2: 7, 3: 3}
    prompts = {s: torch.randint(0, 256, (contexts[s] + new[s],)).tolist() for s in contexts}
    logits, stores = [], []
    for grouped in (False, True):
        cache = _caches(model, cache_kind)
        _fill(cache, list(contexts), [contexts[s] for s in contexts])
        for s in contexts:  # the context, one forward per sequence
            if contexts[s]:
                meta = cache.prepare([s], contexts[s])
                model(torch.tensor([prompts[s][:contexts[s]]]), meta, attend=None)
        for s in contexts:
            assert cache.reserve(s, new[s])
        groups = [([0, 1], 1), ([2], 7), ([3], 3)]
        batch = [(torch.tensor([prompts[s][contexts[s]:] for s in ids]), cache.prepare(ids, n)) for ids, n in groups]
        model.set_attention(backend)
        if grouped:
            out = model.forward_groups(batch)
        else:
            out = [model(t, m) for t, m in batch]
        model.set_attention("sdpa")
        logits.append(out)
        stores.append(cache)
    for a, b in zip(*logits):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    for s in contexts:  # the K/V written by both
        for layer in range(model.spec.num_layers):
            meta_a, meta_b = stores[0].prepare([s], 1), stores[1].prepare([s], 1)
            ka, va = stores[0].gather(layer, meta_a)
            kb, vb = stores[1].gather(layer, meta_b)
            n = contexts[s] + new[s]
            torch.testing.assert_close(kb[..., :n, :], ka[..., :n, :], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(vb[..., :n, :], va[..., :n, :], rtol=1e-5, atol=1e-5)


def test_a_mixed_step_reads_each_weight_once():
    """Recorded, a mixed step is one forward: one qkv_proj / gate_up_proj / down_proj per layer (the
    old runner ran one forward per token count, reading every weight once per count), one attention
    per group and layer, and the tokens are the solo ones."""
    model = make_model("llama", seed=5)
    engine = Engine(model, cache="paged", block_size=4, chunked_prefill=True, max_batched_tokens=8)
    prompts = [[1, 2, 3], list(range(10, 30))]
    rec = Recorder()
    out = engine.generate(prompts, SamplingParams(max_new_tokens=6), recorder=rec)
    solo = Engine(model, cache="contiguous")
    assert [o.tokens for o in out] == [solo.generate([p], SamplingParams(max_new_tokens=6))[0].tokens for p in prompts]
    logs = engine.last_schedule
    mixed = [i for i, log in enumerate(logs) if len({it.num_tokens for it in log.items}) > 1]
    assert mixed, "the workload has steps that mix token counts"
    ops = rec.trace.to_frame()
    L = model.spec.num_layers
    steps = rec.trace.steps
    assert len(steps) == len(logs)  # one recorded forward per step
    for step in mixed:
        here = ops[(ops.phase == steps[step].phase) & (ops.step == steps[step].step)]
        for op in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "attn_norm", "mlp_norm"):
            assert (here.op == op).sum() == L, (step, op)
        assert (here.op == "lm_head").sum() == 1
        groups = len({it.num_tokens for it in logs[step].items})
        assert (here.op == "attention").sum() == groups * L


def test_grouped_forward_refuses_bad_groups():
    model = make_model("llama")
    with pytest.raises(ValueError, match="groups: expected at least one"):
        model.forward_groups([])
    cache = _caches(model, "contiguous")
    _fill(cache, [0], [3])
    meta = cache.prepare([0], 3)
    with pytest.raises(ValueError, match=r"meta: positions \(1, 3\) do not match tokens \(1, 2\)"):
        model.forward_groups([(torch.tensor([[1, 2]]), meta)])
