"""`llmperf plan` and `llmperf simulate` on today's models: layouts (tp, tp+ep, dp+ep) searched for a
mixture of experts, only tp for a dense model, the time model named in every answer, and bad
--layouts / --mla-mode / --kv-window / --ep refused in one line (exit 2)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from llmperf.cli import app
from llmperf.serving import planner
from llmperf.serving.simulator import SLO
from llmperf.serving.workload import WorkloadSpec

runner = CliRunner()
SPEC = WorkloadSpec(arrival="poisson:1", prompt_len="uniform:200:1000", output_len="uniform:20:200", num_requests=30,
                    seed=0)


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_deepseek_v3_on_8_h200_is_planned_in_every_layout():
    res = planner.plan("deepseek-v3", rate=2.0, slo=SLO(ttft_s=2.0, tpot_s=0.1), workload=SPEC, devices=["h200"],
                       precisions=["fp8"], tps=[8], jobs=1)
    rows = {r.layout: r for r in res.rows}
    assert set(rows) == {"tp", "tp+ep", "dp+ep"}
    assert (rows["tp"].ep, rows["tp"].dp_attention) == (1, False)
    assert (rows["tp+ep"].ep, rows["tp+ep"].dp_attention) == (8, False)
    assert (rows["dp+ep"].ep, rows["dp+ep"].dp_attention) == (8, True)
    assert all(r.feasible and r.gpus == 8 * r.replicas and r.time_model == "typical" for r in res.rows)
    frame = res.to_frame()
    assert {"layout", "ep", "dp_attention", "time_model"} <= set(frame.columns)
    assert res.settings["layouts"] == ["tp", "tp+ep", "dp+ep"] and res.settings["efficiency"] == "typical"


def test_a_dense_model_is_planned_with_tp_only():
    res = planner.plan("llama-3.1-8b", rate=1.0, slo=SLO(ttft_s=2.0), workload=SPEC, devices=["h100-sxm"],
                       precisions=["bf16"], tps=[1, 2], jobs=1)
    assert [(r.tp, r.layout) for r in res.rows] == [(1, "tp"), (2, "tp")]


def test_a_layout_the_model_cannot_take_loses_on_layout_and_tp1_duplicates_are_skipped():
    res = planner.plan("llama-3.1-8b", rate=1.0, slo=SLO(ttft_s=2.0), workload=SPEC, devices=["h100-sxm"],
                       precisions=["bf16"], tps=[1, 2], jobs=1, layouts=["tp", "tp+ep", "dp+ep"])
    got = {(r.tp, r.layout): r for r in res.rows}
    assert set(got) == {(1, "tp"), (2, "tp"), (2, "tp+ep"), (2, "dp+ep")}  # tp=1: one GPU, one layout
    for lay in ("tp+ep", "dp+ep"):
        r = got[(2, lay)]
        assert not r.feasible and r.binding == "layout"
        assert r.detail == f"{lay}: ep: 2 needs a mixture-of-experts model, llama-3.1-8b has no experts"


def test_plan_cli_names_the_layout_and_the_time_model():
    common = ["plan", "llama-3.1-8b", "--rate", "1", "-H", "h100-sxm", "--precisions", "bf16", "--tp", "1",
              "--slo-ttft", "2", "--requests", "20", "--prompt-len", "uniform:100:400", "--output-len", "uniform:5:40"]
    res = run(*common)
    assert res.exit_code == 0, res.output
    assert "layout" in res.output and "priced with the typical time model" in res.output
    res = run(*common, "--efficiency", "roofline", "-f", "json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["settings"]["efficiency"] == "roofline"
    assert [(r["layout"], r["time_model"]) for r in doc["rows"]] == [("tp", "roofline")]
    res = run(*common, "--efficiency", "roofline")
    assert "optimistic bound" in res.output


@pytest.mark.parametrize("args, message", [
    (["--layouts", "tp,pp"], "--layouts: unknown layout 'pp' (layouts: tp, tp+ep, dp+ep)"),
    (["--layouts", "tp,,dp+ep"], "--layouts: 'tp,,dp+ep' has an empty name"),
    (["--efficiency", "fast"], "--efficiency: must be one of"),
])
def test_plan_bad_layouts_and_efficiency(args, message):
    res = run("plan", "-H", "l4", "--rate", "1", "--slo-ttft", "1", *args)
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output


def test_simulate_takes_the_layout_and_says_how_it_priced():
    res = run("simulate", "qwen3-30b-a3b", "-H", "h100-sxm", "--tp", "2", "--ep", "2", "--dp-attention",
              "--requests", "20", "--rate", "2", "--prompt-len", "uniform:50:200", "--output-len", "uniform:5:30",
              "-f", "json")
    assert res.exit_code == 0, res.output
    st = json.loads(res.stdout)["settings"]
    assert (st["tp"], st["ep"], st["dp_attention"], st["layout"], st["kv_shards"]) == (2, 2, True, "dp+ep", 2)
    # the expected time by default, the engine profile named
    assert st["time_model"] == "typical" and st["engine"] == "compiled"
    assert st["kv_note"] == "" and not st["kv_sliding_full_pages"]
    res = run("simulate", "gpt-oss-20b", "-H", "h100-sxm", "--requests", "10", "--prompt-len", "100",
              "--output-len", "10", "--kv-window", "full")
    assert res.exit_code == 0, res.output
    assert "KV: sliding layers given full pages" in res.output and "TPOT bound" in res.output
    assert "typical time model" in " ".join(res.output.split())
    res = run("simulate", "gpt-oss-20b", "-H", "h100-sxm", "--requests", "10", "--prompt-len", "100",
              "--output-len", "10", "-f", "json")
    st = json.loads(res.stdout)["settings"]
    assert st["kv_window"] == "capped" and not st["kv_sliding_full_pages"]
    assert st["kv_note"].startswith("KV: sliding/chunked layers hold their window's blocks")


@pytest.mark.parametrize("args, message", [
    (["--mla-mode", "fast"], "--mla-mode: must be one of auto, absorbed, unabsorbed, got 'fast'"),
    (["--kv-window", "half"], "--kv-window: must be one of"),
    (["--ep", "0"], "--ep: must be a positive integer"),
    (["--tp", "2", "--ep", "2"], "ep: 2 needs a mixture-of-experts model"),
    (["qwen3-30b-a3b", "--tp", "4", "--ep", "2", "--dp-attention"], "ep: 2 must equal tp=4 with dp_attention"),
])
def test_simulate_bad_layout_options(args, message):
    res = run("simulate", *args, "--requests", "5")
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output
