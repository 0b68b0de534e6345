"""Chunked prefill and prefix sharing in the real engine, through the shared scheduler: every
request gets exactly the tokens it gets alone (greedy), steps really are mixed / really share
blocks, and the schedule's decisions hold (newest preempted, front of queue, no thrash)."""

from __future__ import annotations

import pytest

from llmperf.analysis.vocabulary import Phase
from llmperf.engine import Engine, SamplingParams, generate_workload
from llmperf.engine.workload import Request

from engine_testing import check_schedule, make_model


@pytest.fixture(scope="module")
def model():
    return make_model("qwen2", seed=12)


@pytest.fixture(scope="module")
def workload():
    return generate_workload(8, prompt_len="uniform:3:30", output_len="uniform:2:12", vocab_size=256, seed=8)


def _alone(model, reqs):
    engine = Engine(model, cache="contiguous")
    return {r.request_id: engine.generate([list(r.prompt)], SamplingParams(max_new_tokens=r.max_new_tokens))[0].tokens
            for r in reqs}


def _tokens(result):
    return {o.request_id: o.tokens for o in result.outputs}


@pytest.mark.parametrize("budget", [5, 16])
@pytest.mark.parametrize("num_blocks", [None, 20])
def test_chunked_prefill_gives_the_solo_tokens(model, workload, budget, num_blocks):
    engine = Engine(model, cache="paged", block_size=4, num_blocks=num_blocks, chunked_prefill=True,
                    max_batched_tokens=budget)
    result = engine.serve(workload, realtime=False)
    assert _tokens(result) == _alone(model, workload)
    logs = engine.last_schedule
    assert all(log.prefill_tokens + log.decode_tokens <= budget for log in logs)
    assert any(log.phase == Phase.mixed for log in logs), "prefill chunks rode along with decodes"
    assert any(i.start > 0 and not i.decode for log in logs for i in log.items), "prompts were split"
    assert [s.phase for s in result.steps] == [log.phase for log in logs]
    check_schedule(logs)
    if num_blocks:
        assert engine.cache.num_free_blocks == num_blocks


def test_chunked_prefill_with_samples_and_beams(model):
    reqs = [Request(request_id=0, prompt=tuple(range(5, 27)), max_new_tokens=6,
                    sampling=SamplingParams(max_new_tokens=6, do_sample=True, num_return_sequences=2)),
            Request(request_id=1, prompt=tuple(range(40, 58)), max_new_tokens=6,
                    sampling=SamplingParams(max_new_tokens=6, num_beams=2, num_return_sequences=2))]
    plain = Engine(model, cache="paged", block_size=4).serve(reqs, realtime=False, seed=3)
    chunked = Engine(model, cache="paged", block_size=4, chunked_prefill=True, max_batched_tokens=7).serve(
        reqs, realtime=False, seed=3)
    got = lambda r: [[c.tokens for c in o.completions] for o in r.outputs]  # noqa: E731
    assert got(chunked) == got(plain)


def test_prefix_sharing_gives_the_solo_tokens_and_shares_blocks(model):
    system = tuple(range(100, 120))  # 20 tokens: 5 full blocks of 4
    reqs = [Request(request_id=i, prompt=system + tuple(range(1 + i, 4 + 2 * i)), max_new_tokens=5 + i,
                    arrival_time_s=0.0) for i in range(5)]
    engine = Engine(model, cache="paged", block_size=4, num_blocks=64, prefix_sharing=True, max_batch=2)
    result = engine.serve(reqs, realtime=False)
    assert _tokens(result) == _alone(model, reqs)
    starts = [i.start for log in engine.last_schedule for i in log.items if not i.decode and i.start > 0]
    assert starts and all(s % 4 == 0 and s <= 20 for s in starts), "later requests skip the shared blocks"
    assert engine.cache.num_free_blocks == 64
    engine.cache.check_invariants()
    check_schedule(engine.last_schedule)


def test_prefix_sharing_with_chunks_and_preemption(model):
    system = tuple(range(60, 76))  # 16 tokens: 4 full blocks
    reqs = [Request(request_id=i, prompt=system + tuple(range(1 + i, 6 + i)), max_new_tokens=14) for i in range(5)]
    engine = Engine(model, cache="paged", block_size=4, num_blocks=22, prefix_sharing=True, chunked_prefill=True,
                    max_batched_tokens=12, watermark=0.0)
    result = engine.serve(reqs, realtime=False)
    assert result.num_preemptions > 0
    assert _tokens(result) == _alone(model, reqs)
    assert engine.cache.num_free_blocks == 22
    check_schedule(engine.last_schedule)
