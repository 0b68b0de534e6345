"""`plan --top`: candidates simulated cheapest optimistic bound first, only until the N cheapest that
meet the SLOs are certain; the same rows for any number of processes; one figure of tokens per
second for every candidate (small fixed samples; no timing assertions)."""

import json

import pytest
from typer.testing import CliRunner

from llmperf.errors import SpecError
from llmperf.serving import planner
from llmperf.serving.simulator import SLO
from llmperf.serving.workload import WorkloadSpec

SPEC = WorkloadSpec(arrival="poisson:1", prompt_len="uniform:10:60", output_len="uniform:5:20", num_requests=40)
KW = dict(rate=20.0, slo=SLO(ttft_s=1.0, tpot_s=0.05), workload=SPEC, devices=["h100-sxm", "a100-80gb-sxm", "l40s"],
          precisions=["bf16"], tps=[1, 2])


@pytest.fixture(scope="module")
def every():
    return planner.plan("llama-3.1-8b", jobs=1, **KW)


@pytest.fixture(scope="module")
def top1():
    return planner.plan("llama-3.1-8b", jobs=1, top=1, **KW)


def test_top_keeps_the_cheapest_and_the_rows_it_simulated(every, top1):
    assert top1.feasible[0].as_dict() == every.feasible[0].as_dict()
    out = [r for r in top1.rows if r.binding == "outranked"]
    assert out and not any(r.binding == "outranked" for r in every.rows)
    assert all(r.simulations == 0 and r.replicas is None and "--top 0" in r.detail for r in out)
    for a, b in zip(every.rows, top1.rows):  # the same candidates, in the same order
        assert (a.device, a.tp) == (b.device, b.tp)
        if b.binding != "outranked":
            assert a.as_dict() == b.as_dict()
        else:  # what it would have cost, simulated, ranks after the cheapest
            assert not a.feasible or a.cost_per_hour >= top1.feasible[0].cost_per_hour
    assert sum(r.simulations for r in top1.rows) < sum(r.simulations for r in every.rows)
    assert top1.settings["top"] == 1 and every.settings["top"] is None


def test_top_gives_the_same_rows_in_parallel(top1):
    two = planner.plan("llama-3.1-8b", jobs=2, top=1, **KW)
    assert [r.as_dict() for r in two.rows] == [r.as_dict() for r in top1.rows]


def test_cost_per_million_tokens_divides_by_one_figure_for_every_candidate(every):
    lengths = planner.mean_lengths(SPEC)
    assert lengths[1] == pytest.approx(12.5, rel=0.01)  # uniform:5:20
    assert every.settings["mean_output_tokens"] == lengths[1]
    for r in every.feasible:
        assert r.cost_per_million_tokens == pytest.approx(r.cost_per_hour / 3600 / (KW["rate"] * lengths[1]) * 1e6)


def test_an_unpriced_device_ranks_after_the_priced_ones():
    kw = dict(KW, devices=["h100-sxm", "h200"], tps=[1])
    res = planner.plan("llama-3.1-8b", jobs=1, top=1, **kw)
    (h200,) = [r for r in res.rows if r.device == "h200"]
    assert h200.binding == "outranked" and "no price for h200" in h200.detail and "--gpu-cost h200=" in h200.detail
    priced = planner.plan("llama-3.1-8b", jobs=1, top=1, gpu_cost={"h200": 1.0}, **kw)
    assert priced.feasible[0].device == "h200"


@pytest.mark.parametrize("top", [-1, 1.5, True])
def test_bad_top_is_refused(top):
    with pytest.raises(SpecError, match="--top: must be 0"):
        planner.plan("llama-3.1-8b", jobs=1, top=top, **KW)


def test_plan_cli_says_what_it_did_not_simulate():
    from llmperf.cli import app
    args = ["plan", "--rate", "20", "-H", "h100-sxm,a100-80gb-sxm,l40s", "--precisions", "bf16", "--tp", "1,2",
            "--slo-ttft", "1", "--slo-tpot", "0.05", "--prompt-len", "uniform:10:60", "--output-len", "uniform:5:20",
            "-j", "1", "-n", "40", "--top", "1"]
    res = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "the 1 cheapest are certain" in res.output and "not simulated" in res.output
    assert "outranked" not in res.output  # listed in the csv and json, not in the losers' table
    doc = json.loads(CliRunner().invoke(app, args + ["-f", "json"]).output)
    assert any(r["binding"] == "outranked" for r in doc["rows"]) and doc["settings"]["top"] == 1
    bad = CliRunner().invoke(app, args[:-1] + ["-1"])
    assert bad.exit_code == 2 and "--top: must be 0" in bad.output


def test_fp8_notes_are_one_line_per_kind_naming_their_devices():
    from llmperf.specs import load_model
    devices = planner.all_devices()
    notes = planner._precision_notes(load_model("llama-3.1-8b"), devices, ["bf16", "fp8"], None)
    assert len(notes) == 2 and notes[0].startswith("fp8 as deployed: W8A8 on ") and "weight-only" in notes[1]
    assert "a100-80gb-sxm" in notes[1] and "h100-sxm" in notes[0] and "h100-sxm" not in notes[1]
    assert planner._precision_notes(load_model("llama-3.1-8b"), devices, ["bf16"], None) == []
