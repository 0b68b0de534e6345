"""Beam search: hand-computed searches over a scripted "language model" (length penalty, EOS handling,
early stopping, ordering), and bit-for-bit equality with transformers 5.23 `generate(num_beams=...)`
(tokens and scores) on a toy model, including processors and beam sampling."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from llmperf.engine.beam import BeamSearch
from llmperf.engine.sampling import SamplingParams, hf_generate_kwargs, make_generator, process_logits

from engine_testing import toy_hf_lm

EOS = 2


def scripted(probs_by_prefix: dict[tuple[int, ...], list[float]], vocab: int = 3):
    """A model whose next-token distribution depends only on the generated tokens so far."""
    def logprobs(bs: BeamSearch) -> torch.Tensor:
        rows = [tuple(r) for r in bs.running_tokens().tolist()]
        uniform = [1.0 / vocab] * vocab
        return torch.tensor([probs_by_prefix.get(r, uniform) for r in rows]).log()
    return logprobs


def run(bs: BeamSearch, model) -> list[tuple[list[int], list[int]]]:
    steps = []
    while not bs.is_done:
        tokens, src = bs.step(model(bs))
        steps.append((tokens.tolist(), src.tolist()))
    return steps


# Two beams, V = {0, 1, EOS=2}, at most 3 new tokens. Step 1: only beam 0 is alive (the prompt copies
# are identical). Step 2: "0 EOS" (p = .35) is the best candidate and finishes. Step 3: length limit.
SCRIPT = {
    (): [0.5, 0.3, 0.2],
    (0,): [0.1, 0.2, 0.7],
    (1,): [0.6, 0.3, 0.1],
    (1, 0): [0.5, 0.3, 0.2],
    (0, 1): [0.2, 0.2, 0.6],
}


def test_hand_computed_search():
    bs = BeamSearch(1, 2, max_new_tokens=3, eos_token_id=EOS, num_return_sequences=2)
    steps = run(bs, scripted(SCRIPT))
    # Step 1: candidates 0 (.5), 1 (.3), EOS (.2, third: outside the top 2, so dropped, not finished).
    # Step 2: 0-EOS (.35) finishes; 1-0 (.18) and 0-1 (.10) continue, from rows 1 and 0.
    assert steps[:2] == [([0, 1], [0, 0]), ([0, 1], [1, 0])]
    # Step 3 hits the length limit (what it returns for the running beams is meaningless then):
    # 1-0-0 (.09) and 0-1-EOS (.06) are the top 2 and finish.
    assert len(steps) == 3
    hyps = bs.finalize()[0]
    assert [h[0] for h in hyps] == [[0, 2], [1, 0, 0]]
    assert hyps[0][1] == pytest.approx(math.log(0.35) / 2, rel=1e-6)  # score / generated_len ** 1.0
    assert hyps[1][1] == pytest.approx(math.log(0.09) / 3, rel=1e-6)
    assert bs.num_generated == 3


@pytest.mark.parametrize("length_penalty, best", [(1.0, [0, 2]), (0.0, [0, 2]), (3.0, [1, 0, 0])])
def test_length_penalty_changes_the_winner(length_penalty, best):
    bs = BeamSearch(1, 2, max_new_tokens=3, eos_token_id=EOS, length_penalty=length_penalty)
    run(bs, scripted(SCRIPT))
    (tokens, score), = bs.finalize()[0]
    assert tokens == best
    assert score == pytest.approx(math.log(0.35 if best == [0, 2] else 0.09) / len(best) ** length_penalty, rel=1e-6)


def test_without_eos_every_hypothesis_has_max_new_tokens():
    bs = BeamSearch(1, 2, max_new_tokens=3, num_return_sequences=2)
    run(bs, scripted(SCRIPT))
    hyps = bs.finalize()[0]
    assert all(len(t) == 3 for t, _ in hyps)
    assert hyps[0][1] >= hyps[1][1]  # best first


# Early stopping: at step 2 both top candidates end with EOS, filling the 2 finished slots.
EARLY = {(): [0.5, 0.4, 0.1], (0,): [0.05, 0.05, 0.9], (1,): [0.05, 0.05, 0.9]}


def test_early_stopping_true_stops_when_k_hypotheses_are_finished():
    bs = BeamSearch(1, 2, max_new_tokens=10, eos_token_id=EOS, early_stopping=True, num_return_sequences=2)
    steps = run(bs, scripted(EARLY))
    assert len(steps) == 2
    assert [t for t, _ in bs.finalize()[0]] == [[0, 2], [1, 2]]


def test_early_stopping_false_stops_when_no_running_beam_can_win():
    bs = BeamSearch(1, 2, max_new_tokens=10, eos_token_id=EOS, early_stopping=False)
    steps = run(bs, scripted(EARLY))
    # Running beams score at most log(.5 * .05) / 2 < log(.4 * .9) / 2, the worst finished: stop.
    assert len(steps) == 2


# An early short hypothesis with a poor normalised score: "EOS" finishes at step 1 (ln .35 / 1), then
# "0 EOS" at step 2 (ln .45 / 2) fills the second slot, while the running "1 0" (ln .135 / 2 = -1.00)
# could still beat the worst finished (-1.05).
LATE = {(): [0.5, 0.15, 0.35], (0,): [0.05, 0.05, 0.9], (1,): [0.9, 0.05, 0.05]}


@pytest.mark.parametrize("early_stopping, stops_at_step_2", [(True, True), (False, False)])
def test_early_stopping_true_does_not_wait_for_a_better_hypothesis(early_stopping, stops_at_step_2):
    bs = BeamSearch(1, 2, max_new_tokens=6, eos_token_id=EOS, early_stopping=early_stopping, num_return_sequences=2)
    steps = run(bs, scripted(LATE))
    assert (len(steps) == 2) == stops_at_step_2
    if early_stopping:
        assert [t for t, _ in bs.finalize()[0]] == [[0, 2], [2]]


def test_early_stopping_never_with_positive_penalty_runs_to_the_limit():
    # "never": a running beam is judged at max_new_tokens, where a length penalty > 0 divides its
    # (negative) score by more: it can still win, so the search goes on.
    bs = BeamSearch(1, 2, max_new_tokens=6, eos_token_id=EOS, early_stopping="never", length_penalty=2.0)
    steps = run(bs, scripted(EARLY))
    assert len(steps) > 2


def test_batch_items_are_independent_and_rows_are_batch_major():
    model = scripted(SCRIPT)
    bs = BeamSearch(2, 2, max_new_tokens=3, eos_token_id=EOS, num_return_sequences=2)
    steps = run(bs, model)
    single = BeamSearch(1, 2, max_new_tokens=3, eos_token_id=EOS, num_return_sequences=2)
    run(single, model)
    assert bs.finalize() == single.finalize() * 2
    assert steps[1] == ([0, 1, 0, 1], [1, 0, 3, 2])  # item 1's source rows are offset by K
    assert steps[0] == ([0, 1, 0, 1], [0, 0, 2, 2])


def test_several_eos_ids_keep_more_candidates():
    assert BeamSearch(1, 3, max_new_tokens=4).num_candidates == 6
    assert BeamSearch(1, 3, max_new_tokens=4, eos_token_id=(1, 2, 3)).num_candidates == 12


def test_stop_sequences_end_hypotheses():
    bs = BeamSearch(1, 2, max_new_tokens=5, stop_sequences=[[0, 1]], num_return_sequences=2)
    run(bs, scripted({(): [0.6, 0.3, 0.1], (0,): [0.1, 0.8, 0.1]}))
    assert [0, 1] in [t for t, _ in bs.finalize()[0]]


def test_misuse_raises():
    bs = BeamSearch(1, 2, max_new_tokens=1)
    with pytest.raises(RuntimeError, match="not done"):
        bs.finalize()
    with pytest.raises(ValueError, match="expected shape \\(2, V\\)"):
        bs.step(torch.zeros(3, 5))
    with pytest.raises(ValueError, match="fewer than the 4 candidates"):
        bs.step(torch.zeros(2, 1))
    bs.step(torch.zeros(2, 5).log_softmax(-1))
    assert bs.is_done
    with pytest.raises(RuntimeError, match="done"):
        bs.step(torch.zeros(2, 5))
    with pytest.raises(ValueError, match="num_return_sequences"):
        BeamSearch(1, 2, max_new_tokens=3, num_return_sequences=3)
    with pytest.raises(ValueError, match="batch_size"):
        BeamSearch(0, 2, max_new_tokens=3)


# --- bit-for-bit equality with transformers' generate() ---------------------------------------------------


def _toy_model(vocab_size: int, seed: int):
    return toy_hf_lm(vocab_size, seed, scale=1.5, pad_token_id=0)


def _ours(model, prompts: torch.Tensor, params: SamplingParams, generator=None):
    """The engine's loop in miniature: log-softmax, processors, BeamSearch.step, reorder by source."""
    beams = BeamSearch.from_params(prompts.shape[0], params)
    prompt_rows = prompts.repeat_interleave(params.num_beams, dim=0)  # (B*K, P)
    while not beams.is_done:
        history = torch.cat([prompt_rows, beams.running_tokens()], dim=1)
        logprobs = torch.log_softmax(model(history).logits[:, -1].float(), dim=-1)
        beams.step(process_logits(logprobs, history, params, beams.num_generated), generator)
    return beams.finalize()


def _hf(model, prompts: torch.Tensor, params: SamplingParams):
    out = model.generate(prompts, attention_mask=torch.ones_like(prompts), use_cache=False,
                         return_dict_in_generate=True, output_scores=True, **hf_generate_kwargs(params))
    P, R = prompts.shape[1], params.num_return_sequences
    result = []
    for b in range(prompts.shape[0]):
        hyps = []
        for i in range(b * R, (b + 1) * R):
            n = int((out.beam_indices[i] >= 0).sum())  # HF pads shorter hypotheses; beam_indices say how long
            hyps.append((out.sequences[i, P:P + n].tolist(), float(out.sequences_scores[i])))
        result.append(hyps)
    return result


CONFIGS = [
    dict(num_beams=K, eos_token_id=eos, length_penalty=lp, early_stopping=es, num_return_sequences=min(2, K))
    for K, eos, lp, es in itertools.product([2, 3], [None, 3, (3, 5)], [1.0, -1.0, 2.0], [False, True, "never"])
    if not (eos is None and es is not False)
] + [
    dict(num_beams=4, eos_token_id=3, repetition_penalty=1.3, num_return_sequences=4),
    dict(num_beams=3, eos_token_id=3, no_repeat_ngram_size=2, early_stopping=True),
    dict(num_beams=3, eos_token_id=(3, 4), bad_words_ids=[[5], [1, 2]], min_new_tokens=3, length_penalty=0.0),
    dict(num_beams=2, eos_token_id=3, max_new_tokens=1),
]


@pytest.mark.parametrize("config", CONFIGS, ids=[str(i) for i in range(len(CONFIGS))])
def test_equals_hf_generate(config):
    pytest.importorskip("transformers")
    params = SamplingParams(**{"max_new_tokens": 10, **config})
    for seed in range(2):
        model = _toy_model(10, seed)
        prompts = torch.randint(1, 10, (2, 3), generator=torch.Generator().manual_seed(seed))
        assert _ours(model, prompts, params) == _hf(model, prompts, params)  # tokens and float32 scores, exactly


def test_beam_sampling_equals_hf_generate():
    pytest.importorskip("transformers")
    params = SamplingParams(num_beams=3, do_sample=True, temperature=0.8, top_k=5, top_p=0.9, eos_token_id=3,
                            max_new_tokens=8, num_return_sequences=2)
    for seed in range(3):
        model = _toy_model(10, seed)
        prompts = torch.randint(1, 10, (2, 3), generator=torch.Generator().manual_seed(seed))
        torch.manual_seed(100 + seed)
        expected = _hf(model, prompts, params)
        assert _ours(model, prompts, params, make_generator(100 + seed)) == expected
