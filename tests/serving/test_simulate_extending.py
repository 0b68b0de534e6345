"""`simulate_extending`: a run resumed from a shorter run's checkpoint is the run from the start, to the
bit (requests, steps, the scheduler's decisions), over doublings as the planner's stopping rule makes them."""

from __future__ import annotations

import dataclasses

import pytest

from llmperf.serving.simulator import SLO, ServingConfig, simulate, simulate_extending, step_cost_model
from llmperf.serving.workload import Poisson, WorkloadSpec, generate

CASES = {
    # a shared system prompt: prefix sharing publishes and finds blocks across the pause
    "prefix": (dict(arrival=Poisson(20.0), prompt_len="uniform:50:300", output_len="uniform:5:60",
                    system_prompt_len=512, seed=5), dict()),
    # a small pool: requests wait and are preempted while the run is paused
    "preempt": (dict(arrival=Poisson(50.0), prompt_len="uniform:100:400", output_len="uniform:50:300", seed=7),
                dict(num_blocks=200, max_batched_tokens=512)),
    # a light load: the shorter run ends before the next arrival (resumed from its end)
    "idle": (dict(arrival=Poisson(0.2), prompt_len="uniform:10:40", output_len="uniform:2:9", seed=3), dict()),
}


def _same(a, b) -> None:  # noqa: ANN001
    assert a.requests.equals(b.requests)
    assert a.steps.equals(b.steps)
    assert [s.decision() for s in a.log] == [s.decision() for s in b.log]
    assert a.settings == b.settings


@pytest.mark.parametrize("case", sorted(CASES))
def test_doubling_runs_resume_to_the_same_result(case):
    wl, kw = CASES[case]
    cfg = ServingConfig.build("llama-3.1-8b", "a100-80gb-sxm", **kw)
    cost = step_cost_model(cfg)
    slo = SLO(ttft_s=1.0, tpot_s=0.05)
    sizes = [40, 80, 160]
    works = [generate(WorkloadSpec(num_requests=n, **wl)) for n in sizes]
    prev = None
    for i, w in enumerate(works):
        pause = float(works[i + 1].arrival_s[len(w)]) if i + 1 < len(works) else None
        res, ckpt = simulate_extending(w, cfg, slo=slo, cost=cost, previous=prev, pause_at=pause)
        if prev is not None:
            assert prev.state is None  # it was resumed, not run from the start
        _same(res, simulate(w, cfg, slo=slo, cost=cost))
        assert (ckpt is None) == (pause is None)
        prev = ckpt


def test_a_checkpoint_of_other_requests_is_not_resumed():
    wl, kw = CASES["preempt"]
    cfg = ServingConfig.build("llama-3.1-8b", "a100-80gb-sxm", **kw)
    cost = step_cost_model(cfg)
    short, long = (generate(WorkloadSpec(num_requests=n, **wl)) for n in (40, 80))
    _, ckpt = simulate_extending(short, cfg, slo=None, cost=cost, pause_at=float(long.arrival_s[40]))
    other = dataclasses.replace(long, output_tokens=long.output_tokens + 1)  # not the paused run's requests
    res, _ = simulate_extending(other, cfg, slo=None, cost=cost, previous=ckpt)
    assert ckpt.state is not None  # refused: simulated from the start
    _same(res, simulate(other, cfg, cost=cost))


def test_plan_rows_are_the_same_as_simulating_every_run_from_the_start(monkeypatch):
    from llmperf.serving import planner
    from llmperf.serving.stability import Stopping
    spec = WorkloadSpec(arrival="poisson:1", prompt_len="uniform:10:300", output_len="uniform:5:80", num_requests=50)
    kw = dict(rate=30.0, slo=SLO(ttft_s=0.5, tpot_s=0.03), workload=spec, devices=["a100-80gb-sxm"],
              precisions=["bf16", "int4"], tps=[1], jobs=1, stopping=Stopping(tolerance=0.02, min_requests=50,
                                                                                 max_requests=400))
    real = planner.simulate_extending
    resumed = []

    def counted(w, config, *, slo, cost, previous=None, pause_at=None):  # noqa: ANN001, ANN202
        out = real(w, config, slo=slo, cost=cost, previous=previous, pause_at=pause_at)
        resumed.append(previous is not None and previous.state is None)
        return out

    monkeypatch.setattr(planner, "simulate_extending", counted)
    got = planner.plan("llama-3.1-8b", **kw)
    assert any(resumed)

    def fresh(w, config, *, slo, cost, previous=None, pause_at=None):  # noqa: ANN001, ANN202, ARG001
        return simulate(w, config, slo=slo, cost=cost), None

    monkeypatch.setattr(planner, "simulate_extending", fresh)
    want = planner.plan("llama-3.1-8b", **kw)
    assert [r.as_dict() for r in got.rows] == [r.as_dict() for r in want.rows]
    assert any(r.simulations > 1 for r in got.rows)
