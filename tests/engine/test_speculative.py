"""Greedy speculative decoding (`llmperf.engine.speculative`): token for token the target's plain greedy
output (the engine's `generate`) whatever the draft, with exact bookkeeping of proposals, acceptances
and cycles; early-exit drafts share the target's tensors; bad input is refused by name."""

from __future__ import annotations

import json
import math

import pytest
import torch

from llmperf.engine import ContiguousKVCache, Engine, SamplingParams, build_model
from llmperf.engine.speculative import SpeculativeResult, early_exit_draft, speculative_generate

from engine_testing import tiny

PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15, 16, 17]]
N = 16  # max_new_tokens


def _plain(target, prompts=PROMPTS, max_new_tokens=N, eos_token_id=None) -> list[list[int]]:
    params = SamplingParams(max_new_tokens=max_new_tokens, eos_token_id=eos_token_id)
    return [o.tokens for o in Engine(target, cache="contiguous").generate(prompts, params)]


def _noisy(model, spec, scale: float = 0.004, seed: int = 0):
    """A copy of `model`'s weights with small noise: a draft that agrees with it often, not always."""
    draft = build_model(spec, seed=seed, attention=model.attention_backend)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale)
    return draft


@pytest.fixture(scope="module")
def llama():
    spec = tiny("llama-3.1-8b", num_layers=4)
    target = build_model(spec, seed=0)
    return spec, target, _plain(target)


def _check_counts(res: SpeculativeResult, prompts=PROMPTS) -> None:
    """The invariants every run keeps."""
    assert res.cycles == len(res.steps)
    assert 0 <= res.accepted <= res.proposed
    assert res.proposed == sum(s.batch * s.num_draft_tokens for s in res.steps)
    assert res.accepted == sum(s.accepted for s in res.steps)
    assert res.rejections <= res.sequence_cycles
    # every token but each sequence's first (from the prefill) is emitted by a cycle
    assert sum(len(t) for t in res.tokens) == res.emitted + len(prompts)
    if res.sequence_cycles:
        assert res.tokens_per_cycle == pytest.approx(res.emitted / res.sequence_cycles)
    assert res.draft_s == pytest.approx(sum(s.draft_s for s in res.steps))
    assert res.verify_s == pytest.approx(sum(s.verify_s for s in res.steps))
    assert res.prefill_s == res.target_prefill_s + res.draft_prefill_s
    assert min(res.target_prefill_s, res.draft_prefill_s, res.wall_s) >= 0.0


@pytest.mark.parametrize("k", [1, 3, 5])
def test_unrelated_draft_gives_the_target_tokens(llama, k):
    spec, target, ref = llama
    draft = build_model(spec.scaled(num_layers=1), seed=7)  # random, unrelated: almost nothing is accepted
    res = speculative_generate(target, draft, PROMPTS, num_draft_tokens=k, max_new_tokens=N)
    assert res.tokens == ref
    assert res.acceptance_rate < 0.5
    _check_counts(res)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_target_as_its_own_draft_accepts_everything(llama, k):
    _, target, ref = llama
    res = speculative_generate(target, target, PROMPTS, num_draft_tokens=k, max_new_tokens=N)
    assert res.tokens == ref
    assert res.acceptance_rate == 1.0 and res.rejections == 0
    # N - 1 tokens after the prefill's, k + 1 a cycle (the last cycle drafts only what is still needed)
    assert res.cycles == math.ceil((N - 1) / (k + 1))
    assert [s.emitted for s in res.steps] == [len(PROMPTS) * min(k + 1, N - 1 - c * (k + 1))
                                              for c in range(res.cycles)]
    assert res.accepted == res.proposed == len(PROMPTS) * (N - 1 - res.cycles)
    _check_counts(res)


def test_partial_acceptance_feeds_the_draft_mixed_lengths(llama, monkeypatch):
    """A draft that agrees often: some sequences accept all k (their draft has not seen d_k and gets two
    tokens next cycle) while others reject, so a first draft forward has groups of 2 and 1 tokens."""
    spec, target, ref = llama
    draft = _noisy(target, spec)
    seen = []
    real = draft.forward_groups

    def spy(groups, **kw):
        seen.append(sorted(t.shape[1] for t, _ in groups))
        return real(groups, **kw)

    monkeypatch.setattr(draft, "forward_groups", spy)
    res = speculative_generate(target, draft, PROMPTS, num_draft_tokens=2, max_new_tokens=N)
    assert res.tokens == ref
    assert 0 < res.acceptance_rate < 1
    assert [1, 2] in seen
    _check_counts(res)


def test_early_exit_draft_shares_the_target_tensors(llama):
    spec, target, ref = llama
    draft = early_exit_draft(target, 2)
    assert draft.spec.num_layers == 2 and len(draft.layers) == 2
    target_params = dict(target.named_parameters())
    names = [n for n, _ in draft.named_parameters()]
    assert "embed_weight" in names and "final_norm.weight" in names and "layers.1.qkv_weight" in names
    for name, p in draft.named_parameters():
        assert p is target_params[name] and p.data_ptr() == target_params[name].data_ptr(), name
    assert draft.lm_head_weight is target.lm_head_weight
    res = speculative_generate(target, draft, PROMPTS, num_draft_tokens=3, max_new_tokens=N)
    assert res.tokens == ref
    _check_counts(res)


_MOE = dict(num_experts=4, experts_per_token=2, moe_ffn_size=32)
# DeepSeek-V3 tiny: latent attention, three dense layers then two of experts
_MLA = dict(_MOE, num_layers=5, kv_lora_rank=32, q_lora_rank=48, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
            head_dim=None, rotary_dim=8, router_groups=1, router_topk_groups=1, shared_ffn_size=None)


@pytest.mark.parametrize("name,changes,num_layers,layout,kinds", [
    # sliding and full layers: the draft keeps the first layers' kinds
    ("gemma-3-27b", dict(num_layers=4, sliding_window=4, layer_types=("sliding", "full", "sliding", "full")), 3,
     "auto", ("sliding", "full", "sliding")),
    ("gpt-oss-20b", dict(_MOE, num_layers=4, sliding_window=4), 2, "in_out", ("sliding", "full")),  # sinks
    ("deepseek-v3", _MLA, 4, "auto", None),
    ("gpt2", dict(num_kv_heads=4, ffn_size=256, num_layers=3), 1, "in_out", None),  # tied head, (in, out)
])
def test_early_exit_draft_of_other_families(name, changes, num_layers, layout, kinds):
    target = build_model(tiny(name, **changes), seed=0, weight_layout=layout)
    draft = early_exit_draft(target, num_layers)
    assert draft.spec.layer_types == kinds
    assert all(p is dict(target.named_parameters())[n] for n, p in draft.named_parameters())
    res = speculative_generate(target, draft, PROMPTS, num_draft_tokens=3, max_new_tokens=N)
    assert res.tokens == _plain(target)


def test_early_exit_draft_refuses_a_cut_without_experts():
    target = build_model(tiny("deepseek-v3", **_MLA), seed=0)
    with pytest.raises(ValueError, match=r"num_layers: the first 3 layers of deepseek-v3 are dense .* at least 4"):
        early_exit_draft(target, 3)


@pytest.mark.parametrize("num_layers", [0, 4, 5, 1.0, True])
def test_early_exit_draft_refuses_bad_layer_counts(llama, num_layers):
    with pytest.raises(ValueError, match="num_layers"):
        early_exit_draft(llama[1], num_layers)


def test_eos_stops_as_the_engine_does(llama):
    _, target, ref = llama
    eos = ref[0][5]  # a token the target emits mid-way through the first prompt
    expected = _plain(target, eos_token_id=eos)
    assert expected[0] == ref[0][:ref[0].index(eos) + 1] and len(expected[0]) < N
    for draft in (target, early_exit_draft(target, 1)):
        res = speculative_generate(target, draft, PROMPTS, num_draft_tokens=3, max_new_tokens=N, eos_token_id=eos)
        assert res.tokens == expected
        _check_counts(res)
    two = [ref[1][3], ref[2][6]]  # several EOS ids, as a list
    res = speculative_generate(target, target, PROMPTS, num_draft_tokens=4, max_new_tokens=N, eos_token_id=two)
    assert res.tokens == _plain(target, eos_token_id=tuple(two))


@pytest.mark.parametrize("name,changes", [
    ("qwen3-8b", {}),  # q/k norms
    ("qwen3-30b-a3b", dict(num_experts=4, experts_per_token=2, moe_ffn_size=32)),  # a mixture of experts
    ("gpt2", dict(num_kv_heads=4, ffn_size=256, attention="naive")),  # learned positions, the naive backend
])
def test_other_families_are_exact(name, changes):
    changes = dict(changes)
    attention = changes.pop("attention", "sdpa")
    spec = tiny(name, **changes)
    target = build_model(spec, seed=0, attention=attention)
    draft = _noisy(target, spec)
    res = speculative_generate(target, draft, PROMPTS, num_draft_tokens=3, max_new_tokens=N)
    assert res.tokens == _plain(target)
    _check_counts(res)


def test_prompt_at_the_positions_limit(llama):
    """A prompt whose last tokens reach max_positions: the cycles draft fewer tokens, the output is exact."""
    spec, target, _ = llama
    prompts = [list(range(1, spec.max_positions - 7)), [3, 4], [5, 6, 7]]  # 248 + 9 = max_positions + 1
    for draft in (target, _noisy(target, spec)):
        res = speculative_generate(target, draft, prompts, num_draft_tokens=5, max_new_tokens=9)
        assert res.tokens == _plain(target, prompts, max_new_tokens=9)
        _check_counts(res, prompts)


def test_bookkeeping_and_json(llama):
    spec, target, _ = llama
    res = speculative_generate(target, _noisy(target, spec), PROMPTS, num_draft_tokens=3, max_new_tokens=N)
    _check_counts(res)
    assert res.acceptance_rate == res.accepted / (res.accepted + res.rejections)
    data = json.loads(json.dumps(res.to_dict(), allow_nan=False))
    assert data["tokens"] == res.tokens and data["acceptance_rate"] == res.acceptance_rate
    assert len(data["steps"]) == res.cycles and set(data["steps"][0]) >= {"batch", "mean_context", "draft_s",
                                                                         "verify_s", "emitted"}
    first = res.steps[0]
    assert first.batch == len(PROMPTS)
    # the verify's context: each prompt, the first token, the k drafts
    assert first.mean_context == pytest.approx(sum(len(p) + 1 + 3 for p in PROMPTS) / len(PROMPTS))
    assert len(res.steps_frame()) == res.cycles
    # one new token: the prefill gives it, no cycle runs, nothing to estimate
    one = speculative_generate(target, target, PROMPTS, num_draft_tokens=3, max_new_tokens=1)
    assert one.cycles == 0 and [len(t) for t in one.tokens] == [1, 1, 1]
    assert math.isnan(one.acceptance_rate) and one.to_dict()["acceptance_rate"] is None
    assert json.dumps(one.to_dict(), allow_nan=False)
    assert speculative_generate(target, target, [], num_draft_tokens=2, max_new_tokens=4).tokens == []


@pytest.mark.parametrize("kwargs,field", [
    (dict(num_draft_tokens=0), "num_draft_tokens"),
    (dict(num_draft_tokens=2.0), "num_draft_tokens"),
    (dict(num_draft_tokens=True), "num_draft_tokens"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(max_new_tokens=1000), "max_new_tokens"),  # past max_positions
    (dict(eos_token_id=-1), "eos_token_id"),
    (dict(eos_token_id=10_000), "eos_token_id"),  # outside the vocabulary
    (dict(prompts=[[1, 2], []]), r"prompts\[1\]"),
    (dict(prompts=[[1, 10_000]]), r"prompts\[0\]"),
    (dict(prompts="hello"), "prompts"),
    (dict(draft="other vocabulary"), "draft: vocab_size 300 .* vocab_size 256"),
    (dict(draft="bf16"), "draft: dtype"),
    (dict(draft="not a model"), "draft"),
])
def test_bad_input_is_refused_by_name(llama, kwargs, field):
    spec, target, _ = llama
    args = dict(prompts=PROMPTS, draft=target, num_draft_tokens=2, max_new_tokens=4)
    args.update(kwargs)
    args["draft"] = {"other vocabulary": lambda: build_model(spec.scaled(vocab_size=300, num_layers=1)),
                     "bf16": lambda: build_model(spec.scaled(num_layers=1), dtype="bf16"),
                     "not a model": lambda: "gpt2"}.get(args["draft"], lambda: args["draft"])()
    with pytest.raises(ValueError, match=field):
        speculative_generate(target, args.pop("draft"), args.pop("prompts"), **args)


def test_cache_truncate(llama):
    spec = llama[0]
    cache = ContiguousKVCache(spec, max_batch=2, max_seq_len=16)
    cache.allocate(0, 5)
    assert cache.reserve(0, 4) and cache.seq_len(0) == 9
    cache.truncate(0, 6)
    assert cache.seq_len(0) == 6 and cache.prepare([0], 1).starts == (5,)
    for bad in (0, 7, 2.0):
        with pytest.raises(ValueError, match="num_tokens"):
            cache.truncate(0, bad)
