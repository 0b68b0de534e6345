"""The simulator: step costs equal `estimate` on static batches, Little's law, saturation at the
predicted service rate, same seed same run, preemptions, rate search, memory refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import llmperf
from llmperf.analysis.timemodel import time_model_for
from llmperf.errors import SpecError
from llmperf.serving.costmodel import StepCostModel
from llmperf.serving.simulator import SLO, ServingConfig, find_max_rate, plan_memory, simulate
from llmperf.serving.workload import Workload, WorkloadSpec, generate
from llmperf.specs import load_hardware


@pytest.mark.parametrize("model, hw, batch, prompt, gen, tp, attention, eff", [
    ("llama-3.1-8b", "a100-80gb-sxm", 8, 512, 16, 1, "fused", "roofline"),
    ("llama-2-13b", "h100-sxm", 3, 1000, 9, 2, "naive", "typical"),
    ("mixtral-8x7b", "h100-sxm", 4, 300, 5, 4, "fused", "typical"),
    ("gpt2", "a10", 2, 77, 6, 1, "fused", "roofline"),
])
def test_step_costs_equal_estimate(model, hw, batch, prompt, gen, tp, attention, eff):
    tm = time_model_for(load_hardware(hw), eff, "fp16")
    est = llmperf.estimate(model, hw, batch=batch, prompt_len=prompt, gen_len=gen, tp=tp, attention=attention,
                           time_model=tm)
    cm = StepCostModel(model=est.model, hardware=est.hardware, precision=est.precision, tp=tp, attention=attention,
                       time_model=tm)
    # both include the engine's step overhead (prefill and decode terms)
    assert cm.step_time_s([prompt] * batch, [prompt] * batch, batch) == pytest.approx(est.ttft_s, rel=1e-12)
    steps = [cm.step_time_s([1] * batch, [prompt + j] * batch, batch) for j in range(1, gen)]
    assert np.allclose(steps, est.decode_step_times_s(), rtol=1e-12)


def static_config(**kw):
    base = dict(policy="static", max_batch=8, max_batched_tokens=None, chunked_prefill=False, prefix_sharing=False,
                efficiency="roofline")  # llmperf.estimate's default time model: the two must agree exactly
    return ServingConfig.build("llama-3.1-8b", "a100-80gb-sxm", **(base | kw))


def fixed_workload(n, prompt, out, times=None):
    return Workload(arrival_s=np.zeros(n) if times is None else times, prompt_tokens=np.full(n, prompt),
                    output_tokens=np.full(n, out), shared_prefix_tokens=np.zeros(n, dtype=int))


def test_simulated_static_batch_is_estimate():
    est = llmperf.estimate("llama-3.1-8b", "a100-80gb-sxm", batch=8, prompt_len=256, gen_len=32)
    res = simulate(fixed_workload(8, 256, 32), static_config())
    r = res.requests
    assert r["ttft_s"].to_numpy() == pytest.approx(np.full(8, est.ttft_s), rel=1e-12)
    assert r["e2e_s"].to_numpy() == pytest.approx(np.full(8, est.e2e_s), rel=1e-12)
    assert r["tpot_s"].to_numpy() == pytest.approx(np.full(8, est.tpot_s), rel=1e-12)
    assert (res.steps["phase"].iloc[1:] == "decode").all() and len(res.steps) == 32


def test_throughput_saturates_at_the_static_service_rate():
    """Static batches of 8 back to back: the service rate is 8 / e2e(batch 8). Offered well below it,
    throughput follows the load; offered well above, it saturates at the service rate."""
    est = llmperf.estimate("llama-3.1-8b", "a100-80gb-sxm", batch=8, prompt_len=256, gen_len=32)
    mu = 8 / est.e2e_s
    cfg = static_config()
    spec = WorkloadSpec(arrival=f"poisson:{3 * mu!r}", prompt_len=256, output_len=32, num_requests=400, seed=1)
    over = simulate(generate(spec), cfg).summary()["throughput_rps"]
    assert over == pytest.approx(mu, rel=0.03)
    under = simulate(generate(WorkloadSpec(arrival=f"poisson:{0.3 * mu!r}", prompt_len=256, output_len=32,
                                           num_requests=400, seed=1)), cfg).summary()["throughput_rps"]
    assert under == pytest.approx(0.3 * mu, rel=0.15)
    assert over <= mu * (1 + 1e-9) * 1.001


def test_littles_law_on_a_steady_run():
    """L = lambda W: the time-average of requests in the system (running + waiting after each step,
    weighted by the step's duration) equals the arrival rate times the mean time in system."""
    spec = WorkloadSpec(arrival="poisson:12", prompt_len="uniform:100:800", output_len="uniform:20:200",
                        num_requests=1500, seed=2)
    w = generate(spec)
    res = simulate(w, ServingConfig.build("llama-3.1-8b", "a100-80gb-sxm"))
    st, r = res.steps, res.requests
    # the middle of the run, away from the ramp-up and the drain
    t0, t1 = w.arrival_s[300], w.arrival_s[1200]
    sel = (st["start_s"] >= t0) & (st["start_s"] < t1)
    L = float(np.average(st.loc[sel, "running"] + st.loc[sel, "waiting"], weights=st.loc[sel, "duration_s"]))
    inside = (r["arrival_s"] >= t0) & (r["arrival_s"] < t1)
    lam = inside.sum() / (t1 - t0)
    W = float(r.loc[inside, "e2e_s"].mean())
    assert L == pytest.approx(lam * W, rel=0.1)


def test_same_seed_same_run_and_prefix_sharing_saves_prefill():
    spec = WorkloadSpec(arrival="poisson:20", prompt_len="uniform:50:300", output_len="uniform:5:60",
                        num_requests=150, system_prompt_len=512, seed=5)
    cfg = ServingConfig.build("llama-3.1-8b", "a100-80gb-sxm")
    a, b = simulate(generate(spec), cfg), simulate(generate(spec), cfg)
    assert a.requests.equals(b.requests) and a.steps.equals(b.steps)
    assert [s.decision() for s in a.log] == [s.decision() for s in b.log]
    off = simulate(generate(spec), ServingConfig.build("llama-3.1-8b", "a100-80gb-sxm", prefix_sharing=False))
    assert a.steps["prefill_tokens"].sum() < off.steps["prefill_tokens"].sum() - 100 * 480


def test_small_pool_preempts_and_replay_reproduces_the_schedule():
    spec = WorkloadSpec(arrival="poisson:50", prompt_len="uniform:100:400", output_len="uniform:50:300",
                        num_requests=120, seed=7)
    w = generate(spec)
    cfg = ServingConfig.build("llama-3.1-8b", "a100-80gb-sxm", num_blocks=200, max_batched_tokens=512)
    res = simulate(w, cfg)
    assert res.summary()["preemptions"] > 0
    assert (res.steps["phase"] == "mixed").any()
    replay = simulate(w, cfg, step_times=res.steps["duration_s"].to_list())
    assert [s.decision() for s in replay.log] == [s.decision() for s in res.log]
    assert res.steps["kv_reserved_bytes"].max() <= 200 * 16 * res.memory.kv_bytes_per_token


def test_find_max_rate_brackets_the_slo():
    spec = WorkloadSpec(arrival="poisson:1", prompt_len="uniform:100:400", output_len="uniform:20:100",
                        num_requests=150, seed=3)
    cfg = ServingConfig.build("llama-3.1-8b", "a100-80gb-sxm", max_batch=16)
    slo = SLO(ttft_s=0.05, tpot_s=0.03, percentile=90)
    search = find_max_rate(spec, cfg, slo, rel_tol=0.05)
    assert not search.capped and search.max_rate < search.service_rate_rps
    frame = search.to_frame()
    assert search.max_rate is not None and search.best.meets_slo
    above = frame[frame["rate"] > search.max_rate]
    assert len(above) and not above["meets_slo"].iloc[0]
    assert above["rate"].min() <= search.max_rate * 1.06


def test_memory_refusals_carry_figures():
    with pytest.raises(SpecError, match=r"memory: llama-3.1-70b .* GiB of weights .* usable on a10"):
        simulate(fixed_workload(1, 10, 10), ServingConfig.build("llama-3.1-70b", "a10"))
    cfg = ServingConfig.build("llama-3.1-8b", "a100-80gb-sxm", num_blocks=10)
    with pytest.raises(SpecError, match=r"request 0 \(1000 prompt \+ 10 output tokens\) needs 0\.\d+ GiB of KV cache"):
        simulate(fixed_workload(1, 1000, 10), cfg)
    with pytest.raises(SpecError, match="more than llama-3.1-8b's 131072 positions"):
        simulate(fixed_workload(1, 131072, 10), ServingConfig.build("llama-3.1-8b", "a100-80gb-sxm"))


@pytest.mark.parametrize("kw, message", [
    (dict(ttft_s=0.0), "--slo-ttft"), (dict(tpot_s=-1.0), "--slo-tpot"), (dict(percentile=0), "--slo-percentile"),
    (dict(ttft_s=math.nan), "--slo-ttft"),
])
def test_bad_slo(kw, message):
    with pytest.raises(SpecError, match=message):
        SLO(**kw)


@settings(max_examples=25, deadline=None)
@given(q=st.lists(st.integers(1, 300), min_size=1, max_size=6), extra=st.lists(st.integers(0, 900), min_size=6,
                                                                           max_size=6))
def test_a_mixed_step_adds_its_sequences_attention(q, extra):
    """Everything outside attention depends on the step's token count only; attention adds up over
    sequences: a mixed step's time minus the same tokens as one sequence without context equals the
    difference of their attention times."""
    cm = StepCostModel(model=llmperf.specs.load_model("llama-3.1-8b"), hardware=load_hardware("h100-sxm"),
                       precision=llmperf.specs.Precision.uniform("bf16"))
    kv = [a + b for a, b in zip(q, extra)]
    counts = cm.attention_counts(q, kv)
    parts = [cm.attention_counts([a], [b]) for a, b in zip(q, kv)]
    for i, c in enumerate(counts):
        assert np.allclose(c, sum(p[i] for p in parts), rtol=1e-12)
    assert cm.step_time_s(q, kv, 1) >= cm.dense_time_s(sum(q))


@settings(max_examples=40, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 40)), min_size=1, max_size=40))
def test_bulk_reserve_equals_slot_by_slot(ops):
    """`BlockManager.reserve` (bulk, the simulator's path) leaves exactly the state `append_slots`
    (one slot at a time, the engine's path) leaves."""
    from llmperf.serving.blocks import BlockManager
    a, b = BlockManager(30, 4), BlockManager(30, 4)
    for m in (a, b):
        for s in range(4):
            m.allocate(s, 1)
    for seq, n in ops:
        ok_a = a.reserve(seq, n)
        ok_b = b.append_slots(seq, n) is not None
        assert ok_a == ok_b
        assert [a.block_table(s) for s in range(4)] == [b.block_table(s) for s in range(4)]
        assert a.usage() == b.usage()
        a.check_invariants()


def test_find_max_rate_never_passes_the_service_rate():
    """Loose SLOs: a finite run drains its queue at any rate, so the search once doubled to
    5e8 req/s. It stops at the replica's service rate (regression)."""
    from llmperf.serving.simulator import saturated_rate
    spec = WorkloadSpec(arrival="poisson:1", prompt_len="uniform:100:400", output_len="uniform:20:100",
                        num_requests=20, seed=3)
    cfg = ServingConfig.build("llama-3.1-8b", "a100-80gb-sxm")
    search = find_max_rate(spec, cfg, SLO(ttft_s=100, tpot_s=100))
    mu = search.service_rate_rps  # the lower of the simulated saturation and the analytical bound
    assert mu <= saturated_rate(spec, cfg) * (1 + 1e-9)
    assert search.capped and search.max_rate == pytest.approx(mu)
    assert search.to_frame()["rate"].max() <= mu * (1 + 1e-9)
    assert "service rate" in search.note


def test_find_max_rate_gives_up_when_a_request_alone_misses():
    """An SLO no request meets even alone: the search stops once requests no longer overlap instead
    of halving the rate down to 1e-6 req/s (regression), and says what misses."""
    spec = WorkloadSpec(arrival="poisson:1", prompt_len=200, output_len=20, num_requests=20, seed=0)
    search = find_max_rate(spec, ServingConfig.build("llama-3.1-8b", "a100-80gb-sxm"), SLO(ttft_s=1e-7))
    assert search.max_rate is None and search.best is None
    assert len(search.points) <= 6 and min(p.rate for p in search.points) > 1e-4
    assert "no two requests overlapping" in search.note and "TTFT p90" in search.note


def test_a_request_exactly_at_its_slo_meets_it():
    """Static batches of 2 with replayed step times (exact binary fractions): requests 0 and 1 get
    their first token after a 0.25 s prefill, request 2 waits for them and gets it at 0.75 s; every
    decode step takes 0.125 s. With SLOs of exactly 0.25 s TTFT and 0.125 s TPOT, requests 0 and 1
    meet them (goodput 2 requests over the 1 s makespan) and so do the median TTFT and TPOT; a
    hair tighter and nobody does."""
    w = fixed_workload(3, 100, 3)
    cfg = static_config(max_batch=2)
    steps = [0.25, 0.125, 0.125] * 2
    res = simulate(w, cfg, slo=SLO(ttft_s=0.25, tpot_s=0.125, percentile=50), step_times=steps)
    assert res.requests["ttft_s"].tolist() == [0.25, 0.25, 0.75]
    assert res.requests["tpot_s"].tolist() == [0.125] * 3
    assert res.meets().tolist() == [True, True, False]
    s = res.summary()
    assert s["makespan_s"] == 1.0 and s["goodput_rps"] == 2.0 and s["throughput_rps"] == 3.0
    assert res.meets_slo and s["meets_slo"]
    assert simulate(w, cfg, slo=SLO(tpot_s=0.125), step_times=steps).summary()["goodput_rps"] == 3.0
    tight = simulate(w, cfg, slo=SLO(ttft_s=np.nextafter(0.25, 0), percentile=50), step_times=steps)
    assert not tight.meets().any() and not tight.meets_slo
    tight = simulate(w, cfg, slo=SLO(tpot_s=np.nextafter(0.125, 0), percentile=50), step_times=steps)
    assert not tight.meets().any() and not tight.meets_slo


_CONTINUOUS = ServingConfig.build("llama-3.1-8b", "a100-80gb-sxm", max_batched_tokens=256)


@settings(max_examples=12, deadline=None)
@given(arrivals=st.lists(st.floats(0, 2), min_size=1, max_size=6), prompt=st.integers(16, 600),
       outputs=st.lists(st.integers(1, 5), min_size=6, max_size=6),
       durations=st.lists(st.floats(1e-3, 0.5), min_size=1, max_size=5), q=st.floats(1, 100))
def test_slos_at_the_observed_latencies_are_met(arrivals, prompt, outputs, durations, q):
    """Whatever the schedule: SLOs equal to the worst TTFT and TPOT are met by every request (goodput
    equals throughput), and SLOs equal to the observed percentiles meet the percentile test."""
    n = len(arrivals)
    w = Workload(arrival_s=np.sort(np.array(arrivals)), prompt_tokens=np.full(n, prompt),
                 output_tokens=np.array(outputs[:n]), shared_prefix_tokens=np.zeros(n, dtype=int))
    steps = [durations[i % len(durations)] for i in range(200)]
    res = simulate(w, _CONTINUOUS, step_times=steps)
    ttft, tpot = res.requests["ttft_s"], res.requests["tpot_s"]
    worst = SLO(ttft_s=float(ttft.max()), tpot_s=float(tpot.max()) if tpot.notna().any() else None)
    at_worst = simulate(w, _CONTINUOUS, slo=worst, step_times=steps)
    assert at_worst.meets().all() and at_worst.meets_slo
    assert at_worst.summary()["goodput_rps"] == at_worst.summary()["throughput_rps"]
    pct = SLO(ttft_s=res.percentile("ttft_s", q), tpot_s=res.percentile("tpot_s", q) if tpot.notna().any() else None,
              percentile=q)
    assert simulate(w, _CONTINUOUS, slo=pct, step_times=steps).meets_slo


def test_kv_pool_and_a_request_at_an_exact_fit():
    """A device holding the weights, the activation reserve and exactly 3 blocks gets a pool of 3
    blocks (one byte less: 2; less than one block: refused). A pool of 10 blocks of 16 serves a
    150 + 10 token request (exactly 10 blocks) and refuses one token more; a step budget of 256
    tokens takes a 256-token prompt whole and refuses a 257-token one (without chunked prefill)."""
    from dataclasses import replace
    a100 = load_hardware("a100-80gb-sxm")
    w = fixed_workload(1, 150, 10)
    probe = ServingConfig.build("llama-3.1-8b", a100, mem_util=1.0, num_blocks=1)
    mem = plan_memory(probe, w)
    fixed = int(mem.weights_bytes + mem.activation_bytes)
    for extra, blocks in ((3 * mem.block_bytes, 3), (3 * mem.block_bytes - 1, 2), (mem.block_bytes, 1)):
        hw = replace(a100, name="a100-sized", memory_gib=(fixed + extra) / 2**30)
        assert plan_memory(ServingConfig.build("llama-3.1-8b", hw, mem_util=1.0), w).num_blocks == blocks
    hw = replace(a100, name="a100-sized", memory_gib=(fixed + mem.block_bytes - 1) / 2**30)
    with pytest.raises(SpecError, match=r"--block-size: one block of 16 tokens needs .* KV cache per GPU, more than"):
        plan_memory(ServingConfig.build("llama-3.1-8b", hw, mem_util=1.0), w)
    cfg = ServingConfig.build("llama-3.1-8b", "a100-80gb-sxm", num_blocks=10)
    res = simulate(w, cfg)
    assert res.steps["kv_reserved_bytes"].max() == 10 * res.memory.block_bytes
    with pytest.raises(SpecError, match=r"request 0 \(151 prompt \+ 10 output tokens\) needs"):
        simulate(fixed_workload(1, 151, 10), cfg)
    # without chunked prefill a prompt of exactly the step's token budget is one prefill step
    cfg = static_config(max_batched_tokens=256)
    res = simulate(fixed_workload(2, 256, 2), cfg, step_times=[0.25] * 4)
    assert [n for n in res.steps["prefill_tokens"] if n] == [256, 256]
    with pytest.raises(SpecError, match="request 0's 257-token prompt exceeds the per-step budget of 256"):
        simulate(fixed_workload(2, 257, 2), cfg, step_times=[0.25] * 4)
