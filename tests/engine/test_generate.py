"""Decoding through `Engine.generate`: Hugging Face `generate()`'s exact tokens for greedy and beam
search (with processors), both caches; samplers, seeds, EOS / stop sequences, min_new_tokens."""

from __future__ import annotations

import pytest
import torch

from llmperf.engine import Engine, SamplingParams, generate

from engine_testing import hf_generate, hf_twin, make_model

PROMPTS = [[11, 42, 7, 99, 3], [5, 200, 17], [8] * 9]


@pytest.fixture(scope="module")
def models():
    return {kind: make_model(kind, seed=11) for kind in ("llama", "gpt2", "mistral")}


@pytest.fixture(scope="module")
def twins(models):
    return {kind: hf_twin(m) for kind, m in models.items()}


HF_CASES = {
    "greedy": SamplingParams(max_new_tokens=12),
    "greedy_processors": SamplingParams(max_new_tokens=12, repetition_penalty=1.3, no_repeat_ngram_size=2,
                                        bad_words_ids=[[7], [42, 13]]),
    "greedy_eos_min": SamplingParams(max_new_tokens=12, eos_token_id=(17, 99), min_new_tokens=3),
    "beam": SamplingParams(max_new_tokens=10, num_beams=4, num_return_sequences=3),
    "beam_eos": SamplingParams(max_new_tokens=10, num_beams=3, eos_token_id=(17, 99), length_penalty=0.7,
                               num_return_sequences=2),
    "beam_early": SamplingParams(max_new_tokens=10, num_beams=3, eos_token_id=17, early_stopping=True,
                                 repetition_penalty=1.2),
    "beam_never": SamplingParams(max_new_tokens=8, num_beams=2, eos_token_id=17, early_stopping="never",
                                 length_penalty=1.5),
}


_HF_MEMO: dict[tuple[str, str], list] = {}


@pytest.mark.parametrize("cache", ["paged", "contiguous"])
@pytest.mark.parametrize("case", list(HF_CASES))
@pytest.mark.parametrize("kind", ["llama", "gpt2", "mistral"])  # mistral: a window of 6 < prompt + new tokens
def test_tokens_equal_transformers_generate(models, twins, kind, case, cache):
    params = HF_CASES[case]
    if (kind, case) not in _HF_MEMO:  # one HF run serves both caches
        _HF_MEMO[kind, case] = hf_generate(twins[kind], PROMPTS, params)
    expected = _HF_MEMO[kind, case]
    outputs = Engine(models[kind], cache=cache, block_size=4).generate(PROMPTS, params)
    got = [[c.tokens for c in o.completions] for o in outputs]
    assert got == expected


def test_beam_scores_equal_transformers(models, twins):
    params = HF_CASES["beam_eos"]
    from llmperf.engine.sampling import hf_generate_kwargs

    with torch.no_grad():
        ref = twins["llama"].generate(torch.tensor([PROMPTS[0]]), output_scores=True, return_dict_in_generate=True,
                                      **hf_generate_kwargs(params))
    out = Engine(models["llama"]).generate([PROMPTS[0]], params)[0]
    torch.testing.assert_close(torch.tensor([c.score for c in out.completions]), ref.sequences_scores,
                               rtol=1e-5, atol=1e-5)


def test_temperature_to_zero_equals_greedy(models):
    engine = Engine(models["llama"])
    greedy = [o.tokens for o in engine.generate(PROMPTS, SamplingParams(max_new_tokens=10))]
    cold = [o.tokens for o in engine.generate(PROMPTS, SamplingParams(max_new_tokens=10, do_sample=True,
                                                                      temperature=1e-4), seed=3)]
    zero = [o.tokens for o in engine.generate(PROMPTS, SamplingParams(max_new_tokens=10, do_sample=True,
                                                                      temperature=0.0), seed=3)]
    assert cold == greedy and zero == greedy


@pytest.mark.parametrize("cache", ["paged", "contiguous"])
def test_a_seed_reproduces_a_sampled_run_and_another_seed_differs(models, cache):
    params = SamplingParams(max_new_tokens=16, do_sample=True, temperature=1.5, top_k=50, top_p=0.9,
                            num_return_sequences=2)
    engine = Engine(models["gpt2"], cache=cache)
    run = lambda seed: [[c.tokens for c in o.completions] for o in engine.generate(PROMPTS, params, seed=seed)]  # noqa: E731
    first = run(0)
    assert run(0) == first
    assert run(1) != first
    assert all(len(c) == 16 for o in first for c in o)
    assert first[0][0] != first[0][1]  # two samples of one prompt draw differently


def test_samples_do_not_depend_on_their_batch(models):
    params = SamplingParams(max_new_tokens=10, do_sample=True, temperature=1.2)
    engine = Engine(models["llama"])
    together = engine.generate(PROMPTS, params, seed=5)
    alone = engine.generate([PROMPTS[2]], SamplingParams(max_new_tokens=10, do_sample=True, temperature=1.2,
                                                         seed=5 + 2))
    assert together[2].tokens == alone[0].tokens


def test_top_k_one_is_greedy(models):
    engine = Engine(models["llama"])
    greedy = [o.tokens for o in engine.generate(PROMPTS, SamplingParams(max_new_tokens=8))]
    topk1 = [o.tokens for o in engine.generate(PROMPTS, SamplingParams(max_new_tokens=8, do_sample=True, top_k=1,
                                                                       temperature=2.0), seed=9)]
    assert topk1 == greedy


def test_eos_and_stop_sequences_end_a_sequence(models):
    engine = Engine(models["llama"])
    free = engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=12))[0].tokens
    eos = free[4]
    out = engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=12, eos_token_id=eos))[0]
    first = free.index(eos)
    assert out.tokens == free[:first + 1] and out.completions[0].finish_reason == "eos"
    stop = tuple(free[5:7])
    out = engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=12, stop_sequences=[stop]))[0]
    assert out.tokens == free[:7] and out.completions[0].finish_reason == "stop_sequence"
    out = engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=12))[0]
    assert out.completions[0].finish_reason == "length"


def test_min_new_tokens_is_respected(models):
    engine = Engine(models["gpt2"])
    free = engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=10))[0].tokens
    eos = free[0]  # would end the sequence at once
    out = engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=10, eos_token_id=eos, min_new_tokens=4))[0]
    assert eos not in out.tokens[:4] and len(out.tokens) >= 4


def test_samples_of_one_prompt_share_its_blocks(models):
    """After the prefill, n samples hold the prompt's full blocks once (forks), not n times."""
    model = models["llama"]
    engine = Engine(model, cache="paged", block_size=4, num_blocks=64)
    prompt = list(range(1, 17))  # 16 tokens: 4 full blocks
    params = SamplingParams(max_new_tokens=1, do_sample=True, num_return_sequences=4)
    engine.generate([prompt], params)  # warm: nothing stays allocated
    assert engine.cache.num_free_blocks == 64
    from llmperf.engine.runner import ModelRunner
    from llmperf.engine.sampling import make_generator
    from llmperf.engine.scheduler import request_state
    from llmperf.engine.sequence import SequenceGroup
    from llmperf.serving import Scheduler

    params = SamplingParams(max_new_tokens=5, do_sample=True, num_return_sequences=4)
    g = SequenceGroup(0, prompt, params, arrival=0.0, generator=make_generator(0))
    sched = Scheduler(engine.cache, ModelRunner(model, engine.cache, {0: g}))
    sched.add(request_state(g))
    sched.step()  # prefill: 4 blocks, forked 4 times
    assert len(g.seqs) == 4 and engine.cache.num_used_blocks == 4
    sched.step()  # decode: each sample opens its own fifth block
    assert engine.cache.num_used_blocks == 4 + 4
    usage = engine.cache.usage()
    # each sample: 16 shared prompt slots + 1 of its own (the token just fed)
    assert usage.logical_tokens == 4 * 17 and usage.used_bytes == (16 + 4) * usage.bytes_per_token


def test_invalid_parameters_raise_value_errors(models):
    engine = Engine(models["llama"])
    with pytest.raises(ValueError, match="temperature"):
        engine.generate(PROMPTS, SamplingParams(temperature=-1.0))
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=1.5)
    with pytest.raises(ValueError, match="prompts"):
        engine.generate([[1, 2], []])
    with pytest.raises(ValueError, match="vocabulary"):
        engine.generate([[1, 10_000]])
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate([[1, 2]], SamplingParams(max_new_tokens=300))
    with pytest.raises(ValueError, match="params"):
        engine.generate(PROMPTS, [SamplingParams()])
    with pytest.raises(ValueError, match="cache"):
        Engine(models["llama"], cache="ring")


def test_one_shot_generate_and_single_prompt(models):
    out = generate(models["llama"], [1, 2, 3], SamplingParams(max_new_tokens=4), cache="contiguous")
    assert len(out) == 1 and len(out[0].tokens) == 4
    assert out[0].metrics.ttft is not None and out[0].metrics.tpot is not None


@pytest.mark.parametrize("options", [dict(attention="naive"), dict(chunked_prefill=True, max_batched_tokens=5),
                                     dict(block_size=4, num_blocks=14, watermark=0.0, kv_window="full")],
                         ids=["naive", "chunked", "preempted"])
def test_sliding_window_equals_transformers_across_chunks_and_recompute(models, twins, options):
    """Mistral's window of 6 against prompts up to 14 tokens, with the window crossing prefill chunks
    (extend steps) and recomputed after preemption (full pages: the capped pool holds these four in 14
    blocks without preempting): HF's exact tokens."""
    prompts = [list(range(3, 17)), [5, 200, 17], [8] * 11, list(range(40, 47))]
    params = SamplingParams(max_new_tokens=12)
    expected = hf_generate(twins["mistral"], prompts, params)
    engine = Engine(models["mistral"], **options)
    outputs = engine.generate(prompts, params)
    assert [[c.tokens for c in o.completions] for o in outputs] == expected
    if "num_blocks" in options:
        assert sum(o.metrics.num_preemptions for o in outputs) > 0
