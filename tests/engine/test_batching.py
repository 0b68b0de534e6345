"""Batching: continuous and static batching give every request the tokens it gets alone (greedy),
including when the paged cache runs out of blocks and requests are preempted and recomputed."""

from __future__ import annotations

import pytest

from llmperf.engine import Engine, SamplingParams, generate_workload
from llmperf.engine.workload import Request

from engine_testing import make_model


@pytest.fixture(scope="module")
def model():
    return make_model("llama", seed=21)


@pytest.fixture(scope="module")
def workload():
    return generate_workload(10, prompt_len="uniform:3:20", output_len="uniform:2:24", vocab_size=256, seed=4)


@pytest.fixture(scope="module")
def alone(model, workload):
    engine = Engine(model, cache="contiguous")
    return {r.request_id: engine.generate([list(r.prompt)], SamplingParams(max_new_tokens=r.max_new_tokens))[0].tokens
            for r in workload}


def _tokens(result):
    return {o.request_id: o.tokens for o in result.outputs}


@pytest.mark.parametrize("policy", ["continuous", "static"])
@pytest.mark.parametrize("cache", ["paged", "contiguous"])
def test_every_request_gets_the_tokens_it_gets_alone(model, workload, alone, policy, cache):
    engine = Engine(model, cache=cache, block_size=4, max_batch=4)
    result = engine.serve(workload, policy=policy, realtime=False)
    assert _tokens(result) == alone
    assert max(s.batch for s in result.steps) <= 4
    if policy == "continuous":  # requests joined while others were decoding
        phases = [s.phase for s in result.steps]
        assert "prefill" in phases[phases.index("decode"):]


def test_block_shortage_preempts_and_recomputes_without_corruption(model, workload, alone):
    # 24 blocks of 4 tokens: ~2 long requests at a time, so decodes run out of blocks.
    engine = Engine(model, cache="paged", block_size=4, num_blocks=24)
    result = engine.serve(workload, policy="continuous", realtime=False)
    assert result.num_preemptions > 0
    assert sum(o.metrics.num_preemptions for o in result.outputs) == result.num_preemptions
    assert _tokens(result) == alone
    assert all(s.usage.reserved_bytes <= s.usage.capacity_bytes for s in result.steps)
    assert engine.cache.num_seqs == 0 and engine.cache.num_free_blocks == 24  # every block came back
    assert engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=3)) and len(engine.last_steps) == 3


def test_sampled_and_beam_requests_survive_preemption(model):
    reqs = [Request(request_id=i, prompt=tuple(range(1 + i, 14 + i)), max_new_tokens=14,
                    sampling=SamplingParams(do_sample=True, num_return_sequences=2) if i % 2 else
                    SamplingParams(num_beams=2, num_return_sequences=2)) for i in range(4)]
    big = Engine(model, cache="paged", block_size=4, num_blocks=200).serve(reqs, realtime=False, seed=1)
    small = Engine(model, cache="paged", block_size=4, num_blocks=26).serve(reqs, realtime=False, seed=1)
    assert small.num_preemptions > 0 and big.num_preemptions == 0
    got = lambda r: [[c.tokens for c in o.completions] for o in r.outputs]  # noqa: E731
    assert got(small) == got(big)


def test_static_batching_waits_for_the_whole_batch(model, workload):
    engine = Engine(model, cache="paged", block_size=4, max_batch=4)
    result = engine.serve(workload, policy="static", realtime=False)
    # A prefill step only ever follows a step after which nothing was running.
    for prev, step in zip(result.steps, result.steps[1:]):
        if step.phase == "prefill":
            assert prev.num_running == 0


def test_metrics_and_per_step_cache_usage(model, workload):
    engine = Engine(model, cache="paged", block_size=4, max_batch=8)
    result = engine.serve(workload, policy="continuous", realtime=False)
    df = result.requests_frame()
    assert list(df["request_id"]) == list(range(10))
    assert (df["ttft_s"] > 0).all() and (df["latency_s"] >= df["ttft_s"]).all()
    assert (df["output_len"] == [r.max_new_tokens for r in workload]).all()
    steps = result.steps_frame()
    assert ((steps["utilization"] > 0) & (steps["utilization"] <= 1)).all()
    assert (steps["used_bytes"] <= steps["reserved_bytes"]).all()
    summary = result.summary()
    assert summary["throughput_tokens_per_s"] > 0 and summary["output_tokens"] == df["output_len"].sum()


def test_arrivals_are_respected_in_real_time(model):
    reqs = generate_workload(3, prompt_len=4, output_len=3, vocab_size=256, arrival="interval:0.05", seed=0)
    result = Engine(model).serve(reqs)
    starts = [o.metrics.scheduled - o.metrics.arrival for o in result.outputs]
    assert all(s >= 0 for s in starts)
    arrivals = [o.metrics.arrival for o in result.outputs]
    assert arrivals[2] - arrivals[0] == pytest.approx(0.1, abs=0.02)


def test_a_request_larger_than_the_cache_is_an_error(model):
    engine = Engine(model, cache="paged", block_size=4, num_blocks=3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate([list(range(10))], SamplingParams(max_new_tokens=8))
    with pytest.raises(ValueError, match="policy"):
        engine.serve([], policy="fifo")
