"""One scheduler, two runners: the real engine and the simulator, fed the engine's measured step
times, make the same decisions step by step (admissions, chunks, preemptions, finishes)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from llmperf.engine import Engine, SamplingParams, build_model  # noqa: E402
from llmperf.engine.workload import to_requests  # noqa: E402
from llmperf.measure.validate import replay_durations  # noqa: E402
from llmperf.serving.simulator import ServingConfig, simulate  # noqa: E402
from llmperf.serving.workload import WorkloadSpec, generate  # noqa: E402
from llmperf.specs import Precision, load_hardware, load_model  # noqa: E402


@pytest.mark.parametrize("chunked, sharing, num_blocks, system, policy", [
    (True, False, 16, 0, "continuous"),  # chunked prefill, mixed steps, preemptions
    (False, False, 16, 0, "continuous"),  # prefill-first steps, preemptions
    (True, True, 40, 24, "continuous"),  # shared system prompt blocks
    (False, False, 40, 0, "static"),  # static batches
])
def test_engine_and_simulator_schedules_match(chunked, sharing, num_blocks, system, policy):
    spec = load_model("llama-3.1-8b").scaled(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, ffn_size=128,
                                             vocab_size=97, max_positions=512)
    _assert_same_schedule(spec, chunked, sharing, num_blocks, system, policy, preempts=num_blocks == 16)


_TINY = dict(hidden_size=64, num_heads=4, num_kv_heads=2, ffn_size=128, vocab_size=97, max_positions=512,
             rotary_dim=None)


@pytest.mark.parametrize("layers, sharing, num_blocks, system, preempts", [
    (dict(num_layers=4, layer_types=("sliding", "full") * 2, sliding_window=8), False, 20, 0, True),  # gpt-oss
    # Llama 4: the chunks' blocks (3 pool blocks each) promised at admission keep the pool from running short
    (dict(num_layers=4, layer_types=("chunked",) * 3 + ("full",), attention_chunk_size=12), False, 32, 0, False),
    (dict(num_layers=4, layer_types=("sliding", "full") * 2, sliding_window=8), True, 60, 24, False),
    # Mistral 7B v0.1 / StreamingLLM: every layer sliding, one capped table (`CappedBlockManager`)
    (dict(num_layers=2, sliding_window=32), False, 14, 0, True),
    (dict(num_layers=2, sliding_window=24), True, 40, 24, False),
], ids=["sliding", "chunked-attention", "sliding-prefix-sharing", "all-sliding", "all-sliding-prefix-sharing"])
def test_hybrid_pools_schedule_alike(layers, sharing, num_blocks, system, preempts):
    """Sliding / chunked layers give their old blocks back in both, by one rule (`WindowedBlockManager`,
    `CappedBlockManager`): the engine and the simulator admit, preempt and share prefixes alike."""
    spec = load_model("llama-3.1-8b").scaled(**_TINY, **layers)
    _assert_same_schedule(spec, True, sharing, num_blocks, system, "continuous", preempts=preempts, budget=8)


def _assert_same_schedule(spec, chunked, sharing, num_blocks, system, policy, *, preempts, budget=32):
    work = generate(WorkloadSpec(arrival="poisson:400", prompt_len="uniform:8:40", output_len="uniform:4:16",
                                 num_requests=10, system_prompt_len=system, seed=11))
    engine = Engine(build_model(spec, seed=0), cache="paged", block_size=4, num_blocks=num_blocks,
                    max_batched_tokens=budget if chunked else None, chunked_prefill=chunked, prefix_sharing=sharing)
    longest = int(work.output_tokens.max())
    res = engine.serve(to_requests(work, vocab_size=spec.vocab_size, seed=2),
                       SamplingParams(max_new_tokens=longest, min_new_tokens=longest), policy=policy, realtime=True)
    engine_logs = [s.log for s in res.steps]
    cfg = ServingConfig(model=spec, hardware=load_hardware("a100-80gb-sxm"), precision=Precision.uniform("fp32"),
                        max_batch=None, max_batched_tokens=budget if chunked else None, chunked_prefill=chunked,
                        prefix_sharing=sharing, block_size=4, num_blocks=num_blocks, policy=policy)
    sim = simulate(work, cfg, step_times=replay_durations([g.start_s for g in engine_logs],
                                                          [g.duration_s for g in engine_logs],
                                                          origin=float(work.arrival_s.min())))
    assert len(sim.log) == len(engine_logs)
    for a, b in zip(engine_logs, sim.log):
        assert a.decision() == b.decision(), f"step {a.step} differs"
    if preempts:
        assert sum(len(g.preempted) for g in engine_logs) > 0, "the pool should force preemptions"
    if policy == "static":
        assert all(not g.admitted or g.num_running == len(g.admitted) - len(g.finished) for g in engine_logs)
    if chunked:
        assert any(str(g.phase) == "mixed" for g in engine_logs)
    # The engine's scheduler clock follows the wall clock (its host time between steps included), so
    # the replay spends each step until the next one started; per-request times are compared by
    # `simulate --validate`, not here. What must be equal is every decision, checked above, and so
    # the step at which each request got its first token and finished.
    first_step = {}
    for g in sim.log:
        for i in g.items:
            if i.samples:
                first_step.setdefault(i.request_id, g.step)
    assert len(first_step) == len(work)
