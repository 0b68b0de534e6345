"""Sampled speculative decoding (`llmperf.engine.speculative`, Leviathan et al. 2023, Algorithm 1): the
tokens have exactly the target's sampling distribution, whatever the draft. Checked by a chi-square
test of the empirical joint distribution of the first tokens of a few thousand samples (one lockstep
run) against the exact one, computed from the target's own forwards; the same test with a wrong
acceptance rule fails by far. Also: an identical draft accepts everything, a seed fixes the tokens,
greedy params give the engine's greedy tokens, and what is not supported is refused by name."""

from __future__ import annotations

import json
import math

import pytest
import torch

import llmperf.engine.speculative as speculative
from llmperf.engine import Engine, SamplingParams, build_model
from llmperf.engine.sampling import process_logits
from llmperf.engine.speculative import speculative_generate

from engine_testing import tiny

V = 16  # a vocabulary small enough that the exact joint distribution of 4 tokens is one forward
PROMPT = [1, 2, 3, 4, 5]
NEW = 4  # tokens per sample: the prefill's, then k = 2 drafts checked in the first cycle, then more
SAMPLES = 4000
# The upper 1e-5 quantile of the standard normal: a correct sampler fails a statistic with probability
# about 1e-5 at any seed, so the test is a test of the algorithm, not of one seed's luck.
Z = 4.265


def _sharpened(model, scale: float = 12.0):
    """`model` with its final norm's gain times `scale`: peaked next-token distributions (a random
    model's are nearly uniform), so an unrelated draft is rejected often (acceptance about 0.4)."""
    with torch.no_grad():
        model.final_norm.weight.mul_(scale)
    return model


@pytest.fixture(scope="module")
def pair():
    spec = tiny("llama-3.1-8b", vocab_size=V, hidden_size=32, num_heads=2, num_kv_heads=1, ffn_size=64,
                max_positions=32)
    target = _sharpened(build_model(spec, seed=0))
    draft = _sharpened(build_model(spec.scaled(num_layers=1), seed=7))  # unrelated
    return target, draft


@pytest.fixture(scope="module")
def llama():
    """The greedy tests' target: vocabulary 256, 4 layers."""
    return build_model(tiny("llama-3.1-8b", num_layers=4), seed=0)


def exact_joint(model, params: SamplingParams, prompt=PROMPT, n: int = NEW) -> torch.Tensor:
    """P(t_1 .. t_n | prompt) `(V,) * n` (float64) of the engine's sampling with `params`: one forward
    without a cache of the prompt followed by every sequence of n - 1 tokens, each position's logits
    through `process_logits` with its history, as a token-by-token decode."""
    P = len(prompt)
    grid = torch.stack(torch.meshgrid(*[torch.arange(V)] * (n - 1), indexing="ij"), -1).reshape(-1, n - 1)
    tokens = torch.cat([torch.tensor(prompt).expand(len(grid), P), grid], dim=1)  # (V^(n-1), P + n - 1)
    with torch.inference_mode():
        logits = model(tokens, all_logits=True)  # (V^(n-1), P + n - 1, V)
    joint = torch.ones(1, dtype=torch.float64)
    for j in range(n):
        rows = slice(None, None, V ** (n - 1 - j))  # the V^j rows with distinct first j tokens, in order
        scores = process_logits(logits[rows, P - 1 + j].float(), tokens[rows, :P + j], params, j)
        joint = (joint[:, None] * scores.double().softmax(-1)).reshape(-1)
    return joint.view((V,) * n)


def chi_square(samples: list[list[int]], joint: torch.Tensor, dims: tuple[int, ...]) -> tuple[float, int]:
    """Pearson's statistic of the samples' frequencies of tokens `dims` (0-based) against `joint`'s
    marginal, the cells expected fewer than 5 times pooled into one, and its degrees of freedom. A
    sample in a cell of probability 0 (a token the processors forbid) makes it infinite."""
    others = tuple(d for d in range(joint.dim()) if d not in dims)
    marginal = (joint.sum(dim=others) if others else joint).flatten()
    picked = torch.tensor([[s[d] for d in dims] for s in samples])  # (N, len(dims))
    cell = (picked * torch.tensor([V ** (len(dims) - 1 - i) for i in range(len(dims))])).sum(1)  # (N,)
    observed = torch.bincount(cell, minlength=marginal.numel()).double()
    expected = marginal * len(samples)
    big = expected >= 5
    if observed[expected == 0].sum() > 0:
        return math.inf, int(big.sum())
    o = torch.cat([observed[big], observed[~big].sum()[None]])
    e = torch.cat([expected[big], expected[~big].sum()[None]])
    if e[-1] == 0:  # nothing to pool but cells of probability 0, never seen
        o, e = o[:-1], e[:-1]
    return ((o - e) ** 2 / e).sum().item(), len(o) - 1


def chi2_quantile(df: int, z: float = Z) -> float:
    """The chi-square(df) quantile at the normal quantile z (Wilson and Hilferty's approximation)."""
    a = 2 / (9 * df)
    return df * (1 - a + z * math.sqrt(a)) ** 3


# The joints checked: the first two tokens (the second from the first cycle's first draft or its
# replacement), the first three (the third from an accepted draft, a replacement after one, or the
# next cycle), and tokens 3 and 4 (the fourth is the first cycle's bonus token after 2 acceptances).
DIMS = [(0, 1), (0, 1, 2), (2, 3)]


def ratios(samples: list[list[int]], joint: torch.Tensor) -> dict[tuple[int, ...], float]:
    """Each statistic of DIMS over its threshold (the test passes below 1)."""
    out = {}
    for dims in DIMS:
        stat, df = chi_square(samples, joint, dims)
        out[dims] = stat / chi2_quantile(df)
    return out


PLAIN = SamplingParams(max_new_tokens=NEW, do_sample=True, temperature=1.0, seed=0, eos_token_id=None)
# warpers and history-dependent processors: p and q at each position must see that position's history
WARPED = SamplingParams(max_new_tokens=NEW, do_sample=True, temperature=1.3, top_k=12, top_p=0.95,
                        repetition_penalty=1.5, no_repeat_ngram_size=1, seed=0, eos_token_id=None)


def _sample(pair, params: SamplingParams) -> tuple[list[list[int]], speculative.SpeculativeResult]:
    target, draft = pair
    res = speculative_generate(target, draft, [PROMPT] * SAMPLES, num_draft_tokens=2, params=params)
    assert all(len(t) == NEW for t in res.tokens)
    return res.tokens, res


@pytest.mark.parametrize("params", [PLAIN, WARPED], ids=["plain", "warped"])
def test_the_tokens_have_the_targets_distribution(pair, params):
    samples, res = _sample(pair, params)
    r = ratios(samples, exact_joint(pair[0], params))
    assert max(r.values()) < 1, r
    # the draft is unrelated: rejections are common, every path of the algorithm is taken
    assert 0.2 < res.acceptance_rate < 0.8 and res.rejections > SAMPLES // 2
    assert res.steps[0].num_draft_tokens == 2
    # alpha = E[sum_x min(p, q)] and the observed acceptance estimate the same number
    assert res.expected_acceptance == pytest.approx(res.acceptance_rate, abs=0.03)


def _always_accept(p, q, drafts, gen):
    """A wrong rule: every draft kept (as if p == q), then a bonus token from p_(k+1)."""
    B, k = drafts.shape
    token = torch.multinomial(p[:, k], 1, generator=gen).squeeze(1)
    return torch.full((B,), k, dtype=torch.long), token, torch.minimum(p[:, :k], q).sum((1, 2))


@pytest.mark.parametrize("wrong,patch,margin", [
    ("always accept", ("_rejection_sample", _always_accept), 10.0),
    # subtler: the right acceptance test, but a rejected draft replaced by a draw from p, not max(0, p - q)
    ("replacement from p", ("_residual", lambda p, q: p), 2.0),
], ids=["always-accept", "replacement-from-p"])
def test_a_wrong_acceptance_fails_the_distribution_test(pair, monkeypatch, wrong, patch, margin):
    """The negative control: the same check with a wrong rule is far past its threshold."""
    monkeypatch.setattr(speculative, *patch)
    samples, _ = _sample(pair, PLAIN)
    r = ratios(samples, exact_joint(pair[0], PLAIN))
    assert max(r.values()) > margin, (wrong, r)


@pytest.mark.parametrize("params", [
    SamplingParams(max_new_tokens=16, do_sample=True, seed=3, eos_token_id=None),
    SamplingParams(max_new_tokens=16, do_sample=True, temperature=0.7, top_k=20, top_p=0.9, repetition_penalty=1.2,
                   no_repeat_ngram_size=2, bad_words_ids=[[5, 6]], seed=3, eos_token_id=None),
], ids=["plain", "processed"])
@pytest.mark.parametrize("k", [1, 4])
def test_an_identical_draft_accepts_everything(llama, params, k):
    """p == q at every position (up to rounding), so min(1, p / q) = 1 and sum_x min(p, q) = 1."""
    prompts = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15, 16, 17]]
    res = speculative_generate(llama, llama, prompts, num_draft_tokens=k, params=params)
    assert res.acceptance_rate == 1.0 and res.rejections == 0 and res.accepted == res.proposed > 0
    assert res.expected_acceptance == pytest.approx(1.0, abs=1e-5)
    assert [len(t) for t in res.tokens] == [16] * 3
    assert res.cycles == math.ceil(15 / (k + 1))
    assert sum(len(t) for t in res.tokens) == res.emitted + len(prompts)


def test_a_seed_fixes_the_tokens(pair):
    target, draft = pair
    prompts = [PROMPT, [3, 1], [7, 7, 7]] * 4

    def run(seed):
        params = SamplingParams(max_new_tokens=8, do_sample=True, seed=seed, eos_token_id=None)
        return speculative_generate(target, draft, prompts, num_draft_tokens=3, params=params)

    a, b, c = run(11), run(11), run(12)
    assert a.tokens == b.tokens and a.seed == b.seed == 11
    assert a.tokens != c.tokens
    drawn = run(None)  # a fresh seed, recorded: the run can be repeated
    assert isinstance(drawn.seed, int) and run(drawn.seed).tokens == drawn.tokens


def _plain(target, prompts, params: SamplingParams) -> list[list[int]]:
    return [o.tokens for o in Engine(target, cache="contiguous").generate(prompts, params)]


def test_greedy_params_give_the_engines_greedy_tokens(llama):
    prompts = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15, 16, 17]]
    draft = build_model(llama.spec.scaled(num_layers=1), seed=7)
    ref = _plain(llama, prompts, SamplingParams(max_new_tokens=12, eos_token_id=None))
    base = speculative_generate(llama, draft, prompts, num_draft_tokens=3, max_new_tokens=12)
    assert base.tokens == ref and math.isnan(base.expected_acceptance) and base.seed is None
    for params in (SamplingParams(max_new_tokens=12, eos_token_id=None),
                   SamplingParams(max_new_tokens=12, eos_token_id=None, do_sample=True, temperature=0.0, seed=1)):
        res = speculative_generate(llama, draft, prompts, num_draft_tokens=3, params=params)
        assert res.tokens == ref and res.seed is None
    # history-dependent processors, with drafts the target partly accepts (the target itself, early exit)
    eos = ref[0][4]
    params = SamplingParams(max_new_tokens=12, repetition_penalty=1.3, no_repeat_ngram_size=2,
                            bad_words_ids=[[ref[1][2]]], min_new_tokens=6, eos_token_id=eos,
                            stop_sequences=[ref[2][3:5]])
    expected = _plain(llama, prompts, params)
    assert expected != ref
    for d in (draft, llama, speculative.early_exit_draft(llama, 2)):
        assert speculative_generate(llama, d, prompts, num_draft_tokens=3, params=params).tokens == expected


def test_result_to_json(pair):
    target, draft = pair
    res = speculative_generate(target, draft, [PROMPT] * 3, num_draft_tokens=2, params=PLAIN)
    data = json.loads(json.dumps(res.to_dict(), allow_nan=False))
    assert data["expected_acceptance"] == res.expected_acceptance and data["seed"] == 0
    assert len(res.steps_frame()) == res.cycles
    greedy = speculative_generate(target, draft, [PROMPT], num_draft_tokens=2, max_new_tokens=4)
    assert greedy.to_dict()["expected_acceptance"] is None and greedy.to_dict()["seed"] is None


@pytest.mark.parametrize("kwargs,field", [
    (dict(params=SamplingParams(num_beams=2)), "num_beams"),
    (dict(params=SamplingParams(do_sample=True, num_beams=2, seed=0)), "num_beams"),
    (dict(params=SamplingParams(do_sample=True, num_return_sequences=2, seed=0)), "num_return_sequences"),
    (dict(params=SamplingParams(max_new_tokens=4), max_new_tokens=4), "max_new_tokens: given both"),
    (dict(params=SamplingParams(max_new_tokens=4), eos_token_id=3), "eos_token_id: given both"),
    (dict(params={"do_sample": True}), "params: must be a SamplingParams"),
    (dict(), "max_new_tokens: required"),
    (dict(params=SamplingParams(bad_words_ids=[[1, 99]], eos_token_id=None)), "bad_words_ids"),
    (dict(params=SamplingParams(stop_sequences=[[99]], eos_token_id=None)), "stop_sequences"),
    (dict(params=SamplingParams(max_new_tokens=40, do_sample=True)), "max_new_tokens"),  # past max_positions
])
def test_unsupported_decoding_is_refused_by_name(pair, kwargs, field):
    target, draft = pair
    with pytest.raises(ValueError, match=field):
        speculative_generate(target, draft, [PROMPT], num_draft_tokens=2, **kwargs)
