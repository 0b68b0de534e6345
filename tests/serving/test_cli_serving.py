"""`llmperf simulate` and `llmperf plan` from the command line: good runs, the run directory
contract, and every bad-input path (exit 2, one line naming the field, no traceback)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from llmperf.cli import app
from llmperf.serving.rundir import REQUEST_COLUMNS, STEP_COLUMNS

runner = CliRunner()
SMALL = ["--requests", "40", "--prompt-len", "uniform:50:200", "--output-len", "uniform:5:40"]


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_simulate_table_and_run_dir(tmp_path):
    d = tmp_path / "run"
    res = run("simulate", "--rate", "5", *SMALL, "--slo-ttft", "0.5", "--slo-tpot", "0.05", "--run-dir", d)
    assert res.exit_code == 0, res.output
    assert "TTFT" in res.output and "goodput" in res.output and "over time" in res.output
    doc = json.loads((d / "run.json").read_text())
    assert doc["kind"] == "simulate" and doc["schema_version"] == 1 and doc["model"] == "llama-3.1-8b"
    assert set(doc["summary"]["ttft_s"]) == {"p50", "p90", "p99", "mean"}
    for key in ("throughput_rps", "tokens_per_s", "goodput_rps", "preemptions", "requests"):
        assert key in doc["summary"]
    assert tuple(pd.read_csv(d / "requests.csv").columns) == REQUEST_COLUMNS
    assert tuple(pd.read_csv(d / "steps.csv").columns) == STEP_COLUMNS
    assert len(pd.read_csv(d / "requests.csv")) == 40


def test_simulate_json_csv_and_find_max_rate(tmp_path):
    res = run("simulate", "--rate", "3", *SMALL, "-f", "json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["summary"]["requests"] == 40
    res = run("simulate", "--rate", "3", *SMALL, "-f", "csv")
    assert res.exit_code == 0 and "ttft_p50_s" in res.stdout.splitlines()[0]
    d = tmp_path / "rates"
    res = run("simulate", "--rate", "3", *SMALL, "--find-max-rate", "--slo-ttft", "0.03", "--slo-tpot", "0.02",
              "--max-batch", "8", "--run-dir", d, "-f", "json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert 0 < doc["max_rate_rps"] < doc["service_rate_bound_rps"] and not doc["max_rate_capped"]
    assert "misses (TTFT p90" in doc["max_rate_note"]
    rates = pd.read_csv(d / "rates.csv")
    assert rates["meets_slo"].any() and not rates["meets_slo"].all()


def test_simulate_trace(tmp_path):
    t = tmp_path / "t.csv"
    t.write_text("arrival_s,prompt_tokens,output_tokens\n0,100,10\n0.1,200,20\n")
    res = run("simulate", "--trace", t, "-f", "json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["summary"]["requests"] == 2


@pytest.mark.parametrize("args, message", [
    (["--rate", "0"], "--rate: must be a number > 0, got 0"),
    (["--rate", "-2"], "--rate: must be a number > 0"),
    (["--rate", "1", "--slo-ttft", "0"], "--slo-ttft: must be a number of seconds > 0"),
    (["--rate", "1", "--slo-tpot", "-1"], "--slo-tpot: must be a number of seconds > 0"),
    (["--rate", "1", "--arrival", "gamma", "--cv", "0"], "--cv: must be a number > 0"),
    (["--rate", "1", "--prompt-len", "uniform:5"], "--prompt-len: 'uniform:5': expected uniform:LO:HI"),
    (["--rate", "1", "--requests", "0"], "--requests: must be a positive integer"),
    (["--duration", "10"], "--duration: needs --rate"),
    (["--rate", "1", "--prompt-len", "5000", "--num-blocks", "100"],
     "(5000 prompt + 39 output tokens) needs 0.615 GiB of KV cache per GPU, more than the 0.195 GiB pool"),
    (["llama-3.1-70b", "-H", "l4", "--rate", "1"], "memory: llama-3.1-70b"),
    (["--rate", "1", "-H", "nope"], "unknown hardware 'nope'"),
    (["--find-max-rate", "--rate", "1"], "--find-max-rate: needs --slo-ttft and/or --slo-tpot"),
    (["--rate", "1", "--duration", "5"], "--requests / --duration: give one of them, not both"),
])
def test_simulate_bad_input(args, message):
    res = run("simulate", *SMALL, *args)
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) <= 2


@pytest.mark.parametrize("args, message", [
    (["--trace", "t.csv"], "--validate: serves its own Poisson workload with continuous batching; drop --trace"),
    (["--find-max-rate", "--slo-ttft", "1"], "drop --find-max-rate"),
    (["--rate", "0"], "--rate: must be a number > 0"),
])
def test_validate_refuses_options_it_would_ignore(args, message):
    """`--validate` once ran its own workload silently ignoring --trace, --find-max-rate, ... (regression)."""
    res = run("simulate", "--validate", *args)
    assert res.exit_code == 2 and message in res.output and len(res.output.strip().splitlines()) == 1


@pytest.mark.parametrize("args, message", [
    (["--rate", "1e6", "--duration", "1e4"], "about 1e+10 requests, more than the 10,000,000"),
    (["--requests", "20000000"], "requests: at most 10,000,000 per workload"),
])
def test_simulate_refuses_a_workload_too_large_for_memory(args, message):
    """A huge workload once ended in a numpy MemoryError traceback (regression)."""
    res = run("simulate", *args)
    assert res.exit_code == 2 and message in res.output and len(res.output.strip().splitlines()) == 1


def test_simulate_bad_trace_names_line_and_field(tmp_path):
    t = tmp_path / "t.csv"
    t.write_text("arrival_s,prompt_tokens,output_tokens\n0,100,10\n0.1,-3,20\n")
    res = run("simulate", "--trace", t)
    assert res.exit_code == 2
    assert "line 3: prompt_tokens: must be an integer >= 1, got '-3'" in res.output


def test_plan_ranks_and_explains(tmp_path):
    res = run("plan", "--rate", "4", "-H", "a100-80gb-sxm,l4", "--precisions", "bf16", "--tp", "1,2", "--slo-ttft",
              "0.5", "--slo-tpot", "0.04", "--requests", "30", "--prompt-len", "uniform:100:400", "--output-len",
              "uniform:10:60", "-f", "json", "--run-dir", tmp_path / "plan")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["rows"]
    ok = [r for r in rows if r["feasible"]]
    assert ok and ok[0]["rank"] == 1
    costs = [r["cost_per_million_tokens"] for r in ok]
    assert costs == sorted(costs)
    lost = [r for r in rows if not r["feasible"]]
    assert all(r["binding"] in ("memory", "TTFT", "TPOT", "tp", "replicas") and r["detail"] for r in lost)
    assert (tmp_path / "plan" / "plan.csv").exists()


def test_plan_infeasible_names_the_binding_constraint():
    res = run("plan", "--rate", "2", "-H", "l4", "--precisions", "bf16", "--tp", "1", "--slo-tpot", "0.001",
              "--requests", "20")
    assert res.exit_code == 2
    assert "no configuration meets the SLOs" in res.output and "loses on TPOT" in res.output


def test_plan_infeasible_tp_loses_on_tp_and_the_closest_is_the_smallest_overshoot():
    """A TP degree the heads cannot be split over loses on tp (it was reported as memory); among SLO
    misses the closest is the one with the smallest overshoot (it was the first device listed)
    (regressions). The error is one line."""
    res = run("plan", "--rate", "2", "-H", "a100-80gb-sxm", "--precisions", "bf16", "--tp", "3",
              "--slo-ttft", "1", "--requests", "20")
    assert res.exit_code == 2 and "loses on tp: tp: 3 does not divide" in res.output
    res = run("plan", "--rate", "2", "-H", "a100-80gb-sxm,h100-sxm", "--precisions", "bf16", "--tp", "1",
              "--slo-ttft", "0.0001", "--requests", "20")
    assert res.exit_code == 2 and "the closest, h100-sxm bf16 tp=1, loses on TTFT" in res.output
    assert len(res.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args, message", [
    (["--rate", "0", "--slo-ttft", "1"], "--rate: must be a number > 0"),
    (["--users", "10", "--rate", "1", "--slo-ttft", "1"], "exactly one of --rate and --users"),
    (["--rate", "1"], "give at least one SLO"),
    (["--rate", "1", "--slo-ttft", "-1"], "--slo-ttft: must be a number of seconds > 0"),
    (["--rate", "1", "--slo-ttft", "1", "--gpu-cost", "abc"], "--gpu-cost: 'abc' is not a price"),
    (["--rate", "1", "--slo-ttft", "1", "--gpu-cost", "l4=-1"], "--gpu-cost: l4 must cost > 0"),
    (["--rate", "1", "--slo-ttft", "1", "--tp", "0"], "--tp: 0 in '0' is not a positive integer"),
    (["--rate", "1", "--slo-ttft", "1", "--precisions", "fp7"], "fp7"),
    # a misspelt device in the price list was once ignored silently (regression)
    (["--rate", "1", "--slo-ttft", "1", "--gpu-cost", "l4=1,l40=2"], "--gpu-cost: unknown device 'l40'"),
])
def test_plan_bad_input(args, message):
    res = run("plan", "-H", "l4", *args)
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output


def test_plan_never_serves_more_than_the_service_rate_per_replica():
    """Loose SLOs at 1000 req/s: a 60-request run drains within them on one A100, which plan once
    ranked as feasible at one replica. The replica count never falls below rate / (an upper bound on
    one replica's service rate) (regression)."""
    import math

    from llmperf.serving import planner
    from llmperf.serving.simulator import SLO, ServingConfig, plan_memory, service_rate_bound
    from llmperf.serving.workload import WorkloadSpec, generate
    spec = WorkloadSpec(arrival="poisson:1", prompt_len="lognormal:6:0.8:16:4096", output_len="lognormal:5:0.8:1:1024",
                        num_requests=60, seed=0)
    res = planner.plan("llama-3.1-8b", rate=1000.0, slo=SLO(ttft_s=100, tpot_s=1), workload=spec,
                       devices=["a100-80gb-sxm"], precisions=["bf16"], tps=[1], jobs=1, max_replicas=200,
                       efficiency="roofline")
    (row,) = res.rows
    model = planner.load_model("llama-3.1-8b")
    cfg = ServingConfig(model=model, hardware=planner.load_hardware("a100-80gb-sxm"),
                        precision=planner.plan_precision(model, "bf16"), efficiency="roofline")  # as the plan
    probe = generate(WorkloadSpec(arrival="offline", prompt_len=spec.prompt_len, output_len=spec.output_len,
                                  num_requests=200, seed=0))
    mu = service_rate_bound(cfg, spec, plan_memory(cfg, probe).num_blocks)
    assert row.feasible and row.replicas >= math.ceil(1000 / mu) > 1


def test_plan_never_offers_a_replica_its_simulated_service_rate():
    """40 req/s of the default lengths on A100s: a 60-request run meets p90 TPOT 30 ms at 2 replicas,
    but one replica serves only about 17 req/s flat out, so at 20 req/s its queue grows without bound
    and a 1,500-request run misses the TPOT target. The plan takes the replicas that keep each one
    under its simulated service rate, and those hold on the long run (regression)."""
    from llmperf.serving import planner
    from llmperf.serving.simulator import SLO, ServingConfig, saturated_rate, simulate
    from llmperf.serving.workload import Poisson, WorkloadSpec, generate
    spec = WorkloadSpec(arrival="poisson:1", prompt_len="lognormal:6:0.8:16:4096", output_len="lognormal:5:0.8:1:1024",
                        num_requests=60, seed=0)
    slo = SLO(ttft_s=0.5, tpot_s=0.03, percentile=90)
    res = planner.plan("llama-3.1-8b", rate=40.0, slo=slo, workload=spec, devices=["a100-80gb-sxm"],
                       precisions=["bf16"], tps=[1], jobs=1, efficiency="roofline")
    assert res.rows[0].time_model == "roofline"
    (row,) = res.rows
    model = planner.load_model("llama-3.1-8b")
    cfg = ServingConfig(model=model, hardware=planner.load_hardware("a100-80gb-sxm"),
                        precision=planner.plan_precision(model, "bf16"), efficiency="roofline")  # as the plan
    mu = saturated_rate(spec, cfg)
    assert row.feasible and 40.0 / row.replicas < mu < 40.0 / 2
    long = WorkloadSpec(arrival=Poisson(40.0 / row.replicas), prompt_len=spec.prompt_len, output_len=spec.output_len,
                        num_requests=1500, seed=1)
    assert simulate(generate(long), cfg, slo=slo).meets_slo
    two = WorkloadSpec(arrival=Poisson(20.0), prompt_len=spec.prompt_len, output_len=spec.output_len,
                       num_requests=1500, seed=1)
    assert not simulate(generate(two), cfg, slo=slo).meets_slo


def test_plan_floors_at_exactly_the_slo_do_not_lose():
    """A candidate whose lone-request TTFT (or TPOT) floor equals the SLO is not ruled out by the
    floor check (it can still meet the SLO); one a hair above the SLO is."""
    import numpy as np

    from llmperf.serving import planner
    from llmperf.serving.simulator import SLO, ServingConfig
    from llmperf.serving.workload import WorkloadSpec
    spec = WorkloadSpec(arrival="poisson:1", prompt_len=300, output_len=8, num_requests=8, seed=0)
    model = planner.load_model("llama-3.1-8b")
    cfg = ServingConfig(model=model, hardware=planner.load_hardware("a100-80gb-sxm"),
                        precision=planner.plan_precision(model, "bf16"), efficiency=planner.DEFAULT_EFFICIENCY)
    ttft, tpot = planner._floors(cfg, spec, SLO(ttft_s=1.0))

    def row(slo):
        (r,) = planner.plan("llama-3.1-8b", rate=0.01, slo=slo, workload=spec, devices=["a100-80gb-sxm"],
                            precisions=["bf16"], tps=[1], jobs=1, max_replicas=2).rows
        return r
    for at, below, what in ((SLO(ttft_s=ttft), SLO(ttft_s=np.nextafter(ttft, 0)), "TTFT"),
                            (SLO(tpot_s=tpot), SLO(tpot_s=np.nextafter(tpot, 0)), "TPOT")):
        assert "alone takes" not in row(at).detail
        lost = row(below)
        assert not lost.feasible and lost.binding == what and "alone takes" in lost.detail
