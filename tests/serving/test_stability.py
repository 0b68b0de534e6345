"""The stopping rule of `plan`: percentile intervals by batch sectioning, the growth check, and the
planner's use of them (small workloads; no timing assertions)."""

import math

import numpy as np
import pandas as pd
import pytest

from llmperf.errors import SpecError
from llmperf.serving import planner
from llmperf.serving.simulator import SLO
from llmperf.serving.stability import Stopping, assess, in_system, percentile_ci, rising, t_quantile, trend
from llmperf.serving.workload import WorkloadSpec


def test_t_quantile_matches_the_table():
    assert t_quantile(9) == pytest.approx(2.262, abs=1e-3)
    assert t_quantile(1000) == pytest.approx(1.96, abs=1e-2)


def test_interval_covers_the_true_percentile_of_iid_samples():
    rng = np.random.default_rng(1)
    true = -math.log(0.1)  # p90 of Exp(1)
    hits = 0
    for _ in range(200):
        ci = percentile_ci(rng.exponential(size=2000), 90)
        hits += ci.low <= true <= ci.high
    assert 0.88 <= hits / 200 <= 0.99  # about 95%


def test_interval_narrows_as_the_sample_grows():
    rng = np.random.default_rng(2)
    x = rng.lognormal(size=40000)
    widths = [percentile_ci(x[:n], 99).relative_half_width for n in (1000, 4000, 16000, 40000)]
    assert widths == sorted(widths, reverse=True)


def test_interval_is_wider_on_correlated_samples_than_iid_ranks_say():
    # an AR(1) series (a queue's memory): its batch-sectioning interval is wider than on the same
    # values shuffled (independent), as it must be
    rng = np.random.default_rng(3)
    e = rng.normal(size=20000)
    x = np.empty_like(e)
    x[0] = e[0]
    for i in range(1, len(e)):
        x[i] = 0.98 * x[i - 1] + e[i]
    corr = percentile_ci(x, 90).half_width
    iid = percentile_ci(rng.permutation(x), 90).half_width
    assert corr > 2 * iid


def test_interval_edge_cases():
    assert math.isnan(percentile_ci([], 90).estimate)
    one = percentile_ci([1.0, 2.0, 3.0], 90)
    assert one.low == -math.inf and one.relative_half_width == math.inf
    nan = percentile_ci([np.nan, 1.0, 2.0, np.nan, 3.0, 4.0], 50)  # NaNs (one-token TPOT) are dropped
    assert nan.n == 4 and nan.estimate == pytest.approx(2.5)


def test_rising_series_are_flagged_and_stationary_ones_are_not():
    assert rising(np.arange(10) + 1.0)
    assert not rising(np.ones(10) * 5)
    rng = np.random.default_rng(4)
    assert not any(rising(50 + rng.normal(scale=5, size=10)) for _ in range(50))
    assert trend(np.linspace(0, 10, 500))
    assert not trend(rng.normal(size=500))


def test_in_system_windows():
    steps = pd.DataFrame(dict(start_s=[0.0, 1.0, 2.0, 3.0], duration_s=[1.0] * 4, running=[1, 2, 3, 4],
                              waiting=[0, 0, 1, 1]))
    assert in_system(steps, 0.0, 4.0, 4).tolist() == [1.0, 2.0, 4.0, 5.0]


def test_assess_discards_the_warm_up_and_the_drain():
    n = 1000
    arrival = np.arange(n, dtype=float)
    ttft = np.where((arrival < 100) | (arrival >= 900), 100.0, 1.0)  # a fast start and end would bias it
    req = pd.DataFrame(dict(arrival_s=arrival, ttft_s=ttft, tpot_s=np.full(n, 0.01), e2e_s=np.ones(n),
                            queue_s=np.zeros(n)))
    st = assess(req, 90, Stopping())
    assert st.ttft.estimate == 1.0 and st.ttft.n == 800 and st.converged and not st.unstable


def test_stopping_is_checked_by_name():
    with pytest.raises(SpecError, match="--ci-tolerance"):
        Stopping(tolerance=0)
    with pytest.raises(SpecError, match="--max-requests"):
        Stopping(min_requests=100, max_requests=10)


SPEC = WorkloadSpec(arrival="poisson:1", prompt_len="uniform:10:60", output_len="uniform:5:20", num_requests=40)


def test_plan_stops_when_the_interval_is_within_the_tolerance():
    stop = Stopping(tolerance=0.2, min_requests=40, max_requests=640, min_warmup=5)
    (row,) = planner.plan("llama-3.1-8b", rate=20.0, slo=SLO(ttft_s=5.0, tpot_s=1.0), workload=SPEC,
                          devices=["a100-80gb-sxm"], precisions=["bf16"], tps=[1], jobs=1, stopping=stop).rows
    assert row.feasible and 40 <= row.requests_simulated <= 640
    assert row.ttft_ci_low_s <= row.ttft_s <= row.ttft_ci_high_s
    assert row.tpot_ci_low_s <= row.tpot_s <= row.tpot_ci_high_s
    if row.requests_simulated < 640:  # stopped early: because the intervals were within 20%
        assert row.ci_converged
        assert (row.ttft_ci_high_s - row.ttft_ci_low_s) / 2 <= 0.2 * row.ttft_s


def test_plan_with_a_fixed_sample_reports_its_interval_unchecked():
    res = planner.plan("llama-3.1-8b", rate=2.0, slo=SLO(ttft_s=5.0), workload=SPEC, devices=["a100-80gb-sxm"],
                       precisions=["bf16"], tps=[1], jobs=1)
    (row,) = res.rows
    assert row.requests_simulated == 40 and row.ttft_ci_low_s is not None
    assert res.settings["stopping"]["method"] == "fixed sample"


def test_plan_cli_shows_the_interval(tmp_path):
    import json

    from typer.testing import CliRunner

    from llmperf.cli import app
    args = ["plan", "--rate", "2", "-H", "a100-80gb-sxm", "--precisions", "bf16", "--tp", "1", "--slo-ttft", "5",
            "--prompt-len", "uniform:10:60", "--output-len", "uniform:5:20", "-j", "1", "-n", "40",
            "--ci-tolerance", "0.5", "--max-requests", "80"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "[CI]" in res.output and "batch sectioning" in res.output and "+-50%" in res.output
    res = CliRunner().invoke(app, args + ["-f", "json"])
    doc = json.loads(res.output)
    row = doc["rows"][0]
    assert {"ttft_ci_low_s", "ttft_ci_high_s", "requests_simulated", "ci_converged"} <= set(row)
    assert doc["settings"]["stopping"]["ci_tolerance"] == 0.5
    bad = CliRunner().invoke(app, args[:-2] + ["--max-requests", "10"])
    assert bad.exit_code == 2 and "--max-requests" in bad.output


def test_one_token_budget_default_for_estimate_simulate_and_plan():
    import inspect

    from typer.testing import CliRunner

    from llmperf.analysis.rollup import Conventions
    from llmperf.cli import app
    from llmperf.defaults import DEFAULT_MAX_BATCHED_TOKENS
    from llmperf.serving.simulator import ServingConfig
    assert Conventions().max_batched_tokens == DEFAULT_MAX_BATCHED_TOKENS
    assert ServingConfig.__dataclass_fields__["max_batched_tokens"].default == DEFAULT_MAX_BATCHED_TOKENS
    from llmperf.analysis.generation import estimate
    assert inspect.signature(estimate).parameters["max_batched_tokens"].default == DEFAULT_MAX_BATCHED_TOKENS
    for command in ("estimate", "simulate", "plan"):
        out = CliRunner().invoke(app, [command, "--help"], terminal_width=400).output
        assert f"default: {DEFAULT_MAX_BATCHED_TOKENS}" in out.replace("\n", " ") or \
            str(DEFAULT_MAX_BATCHED_TOKENS) in out, command


def test_simulate_shows_the_p90_interval():
    import json

    from typer.testing import CliRunner

    from llmperf.cli import app
    args = ["simulate", "-H", "a100-80gb-sxm", "--rate", "5", "-n", "60", "--prompt-len", "100", "--output-len", "10"]
    res = CliRunner().invoke(app, args, terminal_width=200)
    assert res.exit_code == 0 and "p90 [CI]" in res.output
    doc = json.loads(CliRunner().invoke(app, args + ["-f", "json"]).output)
    ci = doc["percentile_ci"]["ttft_s"]["p90"]
    assert ci["low"] <= ci["estimate"] <= ci["high"] and ci["batches"] == 10
    assert 0 < doc["prefill_time_share"] < 1
