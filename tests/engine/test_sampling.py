"""Sampling: parameter validation, each processor equal to its transformers 5.23 class, hand-computed
cases, properties of top-k / top-p, determinism, and whole greedy / sampled generations equal to HF
`generate()` on a toy model."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from llmperf.engine.sampling import (
    SamplingParams,
    apply_repetition_penalty,
    apply_temperature,
    ban_repeated_ngrams,
    ban_sequences,
    enforce_min_new_tokens,
    finish_reason,
    hf_generate_kwargs,
    hits_stop,
    make_generator,
    process_logits,
    select_next_tokens,
    top_k_filter,
    top_p_filter,
)

from engine_testing import toy_hf_lm

hf = pytest.importorskip("transformers.generation.logits_process")

SETTINGS = settings(max_examples=40, deadline=None)


def rand_case(seed: int, n: int = 3, v: int = 12, length: int = 10, vocab_used: int | None = None):
    """Random logits (N, V) and a (N, L) history drawn from a few ids so that repeats happen."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, v, generator=g) * 3
    history = torch.randint(0, vocab_used or v, (n, length), generator=g)
    return logits, history


# --- SamplingParams -----------------------------------------------------------------------------------


def test_defaults_are_greedy_and_lists_become_tuples():
    p = SamplingParams(bad_words_ids=[[1], [2, 3]], stop_sequences=[[4, 5]], eos_token_id=[7, 8])
    assert p.bad_words_ids == ((1,), (2, 3)) and p.stop_sequences == ((4, 5),) and p.eos_token_id == (7, 8)
    assert p.eos_ids == (7, 8) and not p.is_sampling and not p.is_beam_search
    assert SamplingParams(eos_token_id=2).eos_ids == (2,)
    assert SamplingParams().eos_ids == ()
    hash(p)  # frozen and hashable


def test_temperature_zero_is_greedy():
    assert not SamplingParams(do_sample=True, temperature=0.0).is_sampling
    assert SamplingParams(do_sample=True, temperature=0.5).is_sampling


def test_min_tokens_to_keep_matches_hf_rule():
    assert SamplingParams(do_sample=True).min_tokens_to_keep == 1
    assert SamplingParams(num_beams=3).min_tokens_to_keep == 2  # no EOS
    assert SamplingParams(num_beams=3, eos_token_id=(1, 2)).min_tokens_to_keep == 3


@pytest.mark.parametrize("name, value", [
    ("temperature", -0.1), ("temperature", float("nan")), ("top_p", 0.0), ("top_p", 1.5), ("top_k", -1),
    ("top_k", 2.5), ("num_beams", 0), ("repetition_penalty", 0.0), ("repetition_penalty", -1.0),
    ("max_new_tokens", 0), ("min_new_tokens", -1), ("min_new_tokens", 40), ("no_repeat_ngram_size", -2),
    ("bad_words_ids", [[]]), ("bad_words_ids", [[1, -3]]), ("stop_sequences", [[]]), ("eos_token_id", -1),
    ("eos_token_id", ()), ("early_stopping", "sometimes"), ("num_return_sequences", 0), ("seed", -5),
    ("do_sample", "yes"), ("length_penalty", float("inf")),
])
def test_invalid_parameters_raise_naming_parameter_and_value(name, value):
    with pytest.raises(ValueError, match=rf"^{name}: .*, got ") as err:
        SamplingParams(**{name: value})
    shown = value[0] if isinstance(value, list) else value  # a bad entry is shown alone
    assert str(err.value).endswith(f"got {shown!r}")


def test_num_return_sequences_rules():
    with pytest.raises(ValueError, match="num_return_sequences: must not exceed num_beams=2"):
        SamplingParams(num_beams=2, num_return_sequences=3)
    with pytest.raises(ValueError, match="num_return_sequences: must be 1 for greedy"):
        SamplingParams(num_return_sequences=2)
    SamplingParams(do_sample=True, num_return_sequences=4)  # several samples of one prompt


# --- hand-computed cases ----------------------------------------------------------------------------


def test_repetition_penalty_sign_semantics():
    logits = torch.tensor([[2.0, -2.0, 1.0, -1.0]])
    out = apply_repetition_penalty(logits, [[0, 1, 1]], 2.0)
    assert out.tolist() == [[1.0, -4.0, 1.0, -1.0]]  # positive divided, negative multiplied, once per id
    rewarded = apply_repetition_penalty(logits, [[0, 1]], 0.5)
    assert rewarded.tolist() == [[4.0, -1.0, 1.0, -1.0]]
    assert logits.tolist() == [[2.0, -2.0, 1.0, -1.0]]  # not modified in place


def test_top_p_hand_computed():
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    kept = lambda p: torch.isfinite(top_p_filter(logits, p)).squeeze(0).tolist()  # noqa: E731
    assert kept(0.4) == [True, False, False, False]
    assert kept(0.75) == [True, True, False, False]  # 0.5 + 0.3 >= 0.75
    assert kept(0.85) == [True, True, True, False]
    assert kept(1.0) == [True, True, True, True]
    assert torch.isfinite(top_p_filter(logits, 0.01, min_tokens_to_keep=3)).sum() == 3


def test_top_p_drops_a_token_whose_cumulative_probability_is_exactly_one_minus_p():
    """A model equally unsure between 4 tokens (probabilities exactly 1/4) with top_p = 0.75: sorted
    ascending, the first cumulative probability is 0.25 = 1 - p, so that token goes and 3 stay, as
    transformers' TopPLogitsWarper does (three tokens already hold p). Two tokens at 1/2 with
    top_p = 0.5 keep one; a uniform 8 with top_p = 0.75 keeps 6."""
    inf = float("inf")
    cases = [(torch.tensor([[1.5, 1.5, -inf, 1.5, 1.5, -inf]]), 0.75, 3),
             (torch.tensor([[0.0, -inf, 0.0, -inf]]), 0.5, 1),
             (torch.zeros(1, 8), 0.75, 6)]
    for logits, p, kept in cases:
        out = top_p_filter(logits, p)
        assert torch.isfinite(out).sum() == kept
        assert torch.equal(out, hf.TopPLogitsWarper(p)(None, logits.clone()))


def test_top_k_hand_computed_keeps_ties():
    logits = torch.tensor([[1.0, 3.0, 2.0, 3.0, 0.0]])
    assert torch.isfinite(top_k_filter(logits, 2)).tolist() == [[False, True, False, True, False]]
    assert torch.isfinite(top_k_filter(logits, 1)).tolist() == [[False, True, False, True, False]]  # tie kept
    assert torch.isfinite(top_k_filter(logits, 1, min_tokens_to_keep=3)).sum() == 3
    assert top_k_filter(logits, 0) is logits  # off
    assert torch.isfinite(top_k_filter(logits, 99)).all()


def test_no_repeat_ngram_hand_computed():
    logits = torch.zeros(1, 6)
    out = ban_repeated_ngrams(logits, [[1, 2, 3, 1, 2]], 3)  # "1 2" was followed by 3
    assert torch.isinf(out).squeeze(0).tolist() == [False, False, False, True, False, False]
    unigram = ban_repeated_ngrams(logits, [[4, 0]], 1)  # n = 1 bans every seen token
    assert torch.isinf(unigram).squeeze(0).tolist() == [True, False, False, False, True, False]
    assert not torch.isinf(ban_repeated_ngrams(logits, [[1, 2]], 3)).any()  # shorter than n


def test_ban_sequences_hand_computed():
    logits = torch.zeros(2, 6)
    out = ban_sequences(logits, [[0, 1, 2], [0, 1, 4]], [[5], [1, 2, 3], [4, 2]], eos_ids=(5,))
    banned = torch.isinf(out).tolist()
    # [5] equals EOS and is dropped (HF keeps EOS reachable); [1, 2, 3] bans 3 after "1 2" only;
    # [4, 2] bans 2 after "4" only.
    assert banned[0] == [False, False, False, True, False, False]
    assert banned[1] == [False, False, True, False, False, False]
    with pytest.raises(ValueError, match="bad_words_ids: token ids \\[9\\] are outside"):
        ban_sequences(logits, [[0], [1]], [[9]])


def test_min_new_tokens_per_row():
    logits = torch.zeros(3, 4)
    out = enforce_min_new_tokens(logits, [0, 2, 5], 3, (1, 3))
    assert torch.isinf(out).tolist() == [[False, True, False, True], [False, True, False, True], [False] * 4]


def test_ragged_history_rows_are_independent():
    logits, _ = rand_case(7, n=3, v=10)
    history = [[1, 2, 3, 1, 2], [4], [5, 5, 5, 6, 7, 5, 5]]
    params = SamplingParams(repetition_penalty=1.7, no_repeat_ngram_size=2, bad_words_ids=[[5, 6]])
    joint = process_logits(logits, history, params, [1, 0, 3])
    for r in range(3):
        alone = process_logits(logits[r:r + 1], [history[r]], params, [1, 0, 3][r])
        assert torch.equal(joint[r:r + 1], alone)


# --- each processor equals transformers' class ------------------------------------------------------


@SETTINGS
@given(seed=st.integers(0, 10_000), penalty=st.sampled_from([0.3, 0.8, 1.2, 2.0, 5.0]))
def test_repetition_penalty_equals_hf(seed, penalty):
    logits, history = rand_case(seed)
    expected = hf.RepetitionPenaltyLogitsProcessor(penalty)(history, logits.clone())
    assert torch.equal(apply_repetition_penalty(logits, history, penalty), expected)
    assert torch.equal(apply_repetition_penalty(logits, history.tolist(), penalty), expected)


@SETTINGS
@given(seed=st.integers(0, 10_000), n=st.integers(1, 4), length=st.integers(0, 14))
def test_no_repeat_ngram_equals_hf(seed, n, length):
    logits, history = rand_case(seed, length=length, vocab_used=3)
    expected = hf.NoRepeatNGramLogitsProcessor(n)(history, logits.clone())
    assert torch.equal(ban_repeated_ngrams(logits, history, n), expected)


@SETTINGS
@given(seed=st.integers(0, 10_000),
       bad=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=3), min_size=1, max_size=5),
       eos=st.sampled_from([None, 1, [1, 2]]))
def test_bad_words_equals_hf(seed, bad, eos):
    logits, history = rand_case(seed, v=8, length=6, vocab_used=4)
    expected = hf.NoBadWordsLogitsProcessor(bad, eos)(history, logits.clone())
    eos_ids = () if eos is None else ((eos,) if isinstance(eos, int) else tuple(eos))
    assert torch.equal(ban_sequences(logits, history, bad, eos_ids=eos_ids), expected)


@SETTINGS
@given(seed=st.integers(0, 10_000), prompt_len=st.integers(0, 10), min_new=st.integers(0, 6),
       eos=st.sampled_from([0, 3, [2, 5]]))
def test_min_new_tokens_equals_hf(seed, prompt_len, min_new, eos):
    logits, history = rand_case(seed, length=10)
    expected = hf.MinNewTokensLengthLogitsProcessor(prompt_len, min_new, eos)(history, logits.clone())
    eos_ids = (eos,) if isinstance(eos, int) else tuple(eos)
    assert torch.equal(enforce_min_new_tokens(logits, 10 - prompt_len, min_new, eos_ids), expected)


@SETTINGS
@given(seed=st.integers(0, 10_000), temperature=st.floats(0.05, 5.0))
def test_temperature_equals_hf(seed, temperature):
    logits, history = rand_case(seed)
    expected = hf.TemperatureLogitsWarper(temperature)(history, logits.clone())
    assert torch.equal(apply_temperature(logits, temperature), expected)


@SETTINGS
@given(seed=st.integers(0, 10_000), k=st.integers(1, 14), keep=st.integers(1, 4))
def test_top_k_equals_hf(seed, k, keep):
    logits, history = rand_case(seed)
    expected = hf.TopKLogitsWarper(k, min_tokens_to_keep=keep)(history, logits.clone())
    assert torch.equal(top_k_filter(logits, k, min_tokens_to_keep=keep), expected)


@SETTINGS
@given(seed=st.integers(0, 10_000), p=st.floats(0.01, 1.0), keep=st.integers(1, 4))
def test_top_p_equals_hf(seed, p, keep):
    logits, history = rand_case(seed)
    expected = hf.TopPLogitsWarper(p, min_tokens_to_keep=keep)(history, logits.clone())
    assert torch.equal(top_p_filter(logits, p, min_tokens_to_keep=keep), expected)


# --- properties -------------------------------------------------------------------------------------


@SETTINGS
@given(n=st.integers(0, 6), data=st.data(), keep=st.integers(1, 4), seed=st.integers(0, 10_000))
def test_top_p_equals_hf_when_a_cumulative_probability_is_exactly_one_minus_p(n, data, keep, seed):
    """2**n equally likely tokens (exact probabilities 2**-n) among masked ones, and top_p = 1 - j / 2**n:
    a cumulative probability lands exactly on 1 - p. The nucleus is the 2**n - j tokens that hold
    exactly p (at least min_tokens_to_keep), as in transformers."""
    j = data.draw(st.integers(0, 2**n - 1))
    p = 1 - j / 2**n
    g = torch.Generator().manual_seed(seed)
    v = 2**n + data.draw(st.integers(0, 5))
    logits = torch.full((2, v), -math.inf)
    for r in range(2):
        logits[r, torch.randperm(v, generator=g)[:2**n]] = float(r) - 0.5
    out = top_p_filter(logits, p, min_tokens_to_keep=keep)
    assert torch.equal(out, hf.TopPLogitsWarper(p, min_tokens_to_keep=keep)(None, logits.clone()))
    assert (torch.isfinite(out).sum(-1) == max(2**n - j, min(keep, 2**n))).all()


@SETTINGS
@given(seed=st.integers(0, 10_000), k=st.integers(0, 11), keep=st.integers(1, 3))
def test_top_p_equals_hf_at_a_cumulative_probability_of_its_own(seed, k, keep):
    """top_p = 1 - (the k-th ascending cumulative probability of the row, as the warper computes it in
    the logits' float32): the boundary token sits exactly on 1 - p, with probabilities that are not
    binary fractions, and must be dropped exactly when transformers drops it."""
    logits, history = rand_case(seed, n=1, v=12)
    cum = logits.sort(dim=-1).values.softmax(dim=-1).cumsum(dim=-1)  # (1, V), float32
    p = 1 - float(cum[0, k])
    assume(0 < p <= 1)
    expected = hf.TopPLogitsWarper(p, min_tokens_to_keep=keep)(history, logits.clone())
    assert torch.equal(top_p_filter(logits, p, min_tokens_to_keep=keep), expected)


@SETTINGS
@given(seed=st.integers(0, 10_000), k=st.integers(1, 14), p=st.sampled_from([0.25, 0.5, 0.75, 0.9, 1.0]),
       keep=st.integers(1, 3))
def test_top_k_and_top_p_equal_hf_on_tied_logits(seed, k, p, keep):
    """Logits that take a few integer values (as a quantised or low-temperature model's do): ties at
    the k-th logit are kept, and ties straddling the nucleus are cut as transformers cuts them."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randint(-2, 2, (3, 12), generator=g).float()
    assert torch.equal(top_k_filter(logits, k, min_tokens_to_keep=keep),
                       hf.TopKLogitsWarper(k, min_tokens_to_keep=keep)(None, logits.clone()))
    assert torch.equal(top_p_filter(logits, p, min_tokens_to_keep=keep),
                       hf.TopPLogitsWarper(p, min_tokens_to_keep=keep)(None, logits.clone()))


@SETTINGS
@given(seed=st.integers(0, 10_000), k=st.integers(1, 12))
def test_top_k_never_leaves_the_top_k(seed, k):
    logits, _ = rand_case(seed, n=4, v=12)  # continuous random values: no ties
    kept = torch.isfinite(top_k_filter(logits, k))
    assert (kept.sum(-1) == k).all()
    top = torch.topk(logits, k).indices
    assert kept.gather(1, top).all()


@SETTINGS
@given(seed=st.integers(0, 10_000), p=st.floats(0.01, 0.99))
def test_top_p_keeps_the_smallest_nucleus(seed, p):
    logits, _ = rand_case(seed, n=4, v=16)
    logits = logits.double()
    probs = logits.softmax(-1)
    kept = torch.isfinite(top_p_filter(logits, p))
    for r in range(4):
        kept_p, dropped_p = probs[r][kept[r]], probs[r][~kept[r]]
        assert kept_p.sum() >= p - 1e-9  # enough mass
        assert kept_p.sum() - kept_p.min() < p + 1e-9  # and no smaller set of top tokens has it
        if dropped_p.numel():
            assert kept_p.min() >= dropped_p.max()  # the most probable tokens


def test_temperature_to_zero_equals_greedy():
    logits, history = rand_case(3, n=5, v=20)
    greedy = select_next_tokens(logits, SamplingParams(), None)
    assert torch.equal(greedy, logits.argmax(-1))
    assert torch.equal(select_next_tokens(logits, SamplingParams(do_sample=True, temperature=0.0), None), greedy)
    cold = SamplingParams(do_sample=True, temperature=1e-3)
    gen = make_generator(0)
    for _ in range(20):
        assert torch.equal(select_next_tokens(process_logits(logits, history, cold, 0), cold, gen), greedy)


def test_seeded_generator_reproduces_a_run():
    logits, history = rand_case(5, n=4, v=30)
    params = SamplingParams(do_sample=True, temperature=1.5, top_k=20, top_p=0.95)

    def run(seed):
        gen = make_generator(seed)
        return [select_next_tokens(process_logits(logits, history, params, i), params, gen).tolist()
                for i in range(30)]

    assert run(1234) == run(1234)
    assert run(1234) != run(4321)


def test_a_seeded_generator_draws_what_the_seeded_global_one_draws():
    probs = torch.rand(3, 50)
    torch.manual_seed(77)
    global_draw = torch.multinomial(probs, 1)
    assert torch.equal(torch.multinomial(probs, 1, generator=make_generator(77)), global_draw)


def test_select_next_tokens_refuses_beam_search_and_bad_shapes():
    with pytest.raises(ValueError, match="num_beams"):
        select_next_tokens(torch.zeros(2, 5), SamplingParams(num_beams=2), None)
    with pytest.raises(ValueError, match="logits: expected"):
        select_next_tokens(torch.zeros(5), SamplingParams(), None)
    with pytest.raises(ValueError, match="history: 1 rows for 2"):
        apply_repetition_penalty(torch.zeros(2, 5), [[1]], 1.5)


def test_functions_validate_their_arguments():
    x = torch.zeros(1, 4)
    for call in (lambda: apply_temperature(x, 0.0), lambda: top_p_filter(x, 0.0), lambda: top_k_filter(x, -1),
                 lambda: top_p_filter(x, 0.5, min_tokens_to_keep=0), lambda: ban_repeated_ngrams(x, [[1]], -1),
                 lambda: apply_repetition_penalty(x, [[1]], 0.0)):
        with pytest.raises(ValueError):
            call()


# --- stopping -----------------------------------------------------------------------------------------


def test_hits_stop_and_finish_reason():
    p = SamplingParams(eos_token_id=(2, 9), stop_sequences=[[4, 5], [7]], max_new_tokens=4)
    assert not hits_stop([], p) and not hits_stop([1, 4], p)
    assert hits_stop([1, 2], p) and hits_stop([9], p) and hits_stop([3, 4, 5], p) and hits_stop([7], p)
    assert hits_stop(torch.tensor([4, 5]), p)
    assert finish_reason([1, 3], p) is None
    assert finish_reason([1, 3, 6, 8], p) == "length"
    assert finish_reason([1, 3, 6, 2], p) == "eos"  # EOS wins over the length it reaches with
    assert finish_reason([4, 5], p) == "stop_sequence"
    assert not hits_stop([2], SamplingParams())  # no EOS configured


def test_hf_generate_kwargs():
    kw = hf_generate_kwargs(SamplingParams(do_sample=True, top_p=0.9, eos_token_id=(1, 2), bad_words_ids=[[3]]))
    assert kw["top_k"] == 0 and kw["top_p"] == 0.9 and kw["eos_token_id"] == [1, 2] and kw["bad_words_ids"] == [[3]]
    assert "top_k" not in hf_generate_kwargs(SamplingParams())
    with pytest.raises(ValueError, match="stop_sequences"):
        hf_generate_kwargs(SamplingParams(stop_sequences=[[1]]))


# --- whole generations equal HF generate() ------------------------------------------------------------


def _toy_model(vocab_size: int, seed: int):
    return toy_hf_lm(vocab_size, seed, scale=2, pad_token_id=vocab_size - 1)


def _our_generate(model, prompt: list[int], params: SamplingParams, generator) -> list[int]:
    tokens = list(prompt)
    generated: list[int] = []
    while finish_reason(generated, params) is None:
        logits = model(torch.tensor([tokens])).logits[:, -1].float()
        scores = process_logits(logits, [tokens], params, len(generated))
        token = int(select_next_tokens(scores, params, generator)[0])
        tokens.append(token)
        generated.append(token)
    return generated


def _hf_generate(model, prompt: list[int], params: SamplingParams) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), use_cache=False, **hf_generate_kwargs(params))
    return out[0, len(prompt):].tolist()


DECODINGS = [
    SamplingParams(max_new_tokens=12),
    SamplingParams(max_new_tokens=12, eos_token_id=3, min_new_tokens=4, repetition_penalty=1.4),
    SamplingParams(max_new_tokens=12, no_repeat_ngram_size=2, bad_words_ids=[[5], [1, 2]], eos_token_id=(3, 4)),
    SamplingParams(max_new_tokens=12, do_sample=True, eos_token_id=3),
    SamplingParams(max_new_tokens=12, do_sample=True, temperature=0.7, top_k=6, top_p=0.8, repetition_penalty=1.2,
                   no_repeat_ngram_size=3, bad_words_ids=[[6, 7]], eos_token_id=3, min_new_tokens=2),
    SamplingParams(max_new_tokens=12, do_sample=True, temperature=1.8, top_p=0.6),
]


@pytest.mark.parametrize("params", DECODINGS, ids=range(len(DECODINGS)))
def test_generation_equals_hf_generate(params):
    """Greedy and sampled generations, processors in HF's order, the same tokens as `generate()` (the
    sampled ones drawn from a generator seeded as HF's global one)."""
    pytest.importorskip("transformers")
    for seed in range(4):
        model = _toy_model(10, seed)
        prompt = torch.randint(0, 9, (4,), generator=torch.Generator().manual_seed(seed)).tolist()
        torch.manual_seed(seed)
        expected = _hf_generate(model, prompt, params)
        assert _our_generate(model, prompt, params, make_generator(seed)) == expected
