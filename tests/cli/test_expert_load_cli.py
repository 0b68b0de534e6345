"""`--expert-load PATH` and `--eplb N` on `simulate`, `plan`, `speculate` and `report`: each honoured (a
skewed load slows the busiest expert-parallel GPU, EPLB's redundant experts take memory), named in
every JSON, run directory and CSV beside ep and dp_attention, and bad values refused in one line
(exit 2, no traceback)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from llmperf.analysis.speculative import speculate
from llmperf.cli import app
from llmperf.specs.expert_load import load_expert_load

runner = CliRunner()
SIM = ["--requests", "6", "--rate", "2", "--prompt-len", "2000", "--output-len", "10", "--efficiency", "roofline",
       "-f", "json"]


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def skewed_load(path: Path, experts: int, hot: int, layers: int = 2) -> Path:
    """SGLang's logical_count as JSON: the first `hot` experts four times as popular as the rest."""
    row = [4000.0] * hot + [1000.0] * (experts - hot)
    path.write_text(json.dumps({"logical_count": [row] * layers}))
    return path


def one_line_exit_2(res, needle: str) -> None:
    assert res.exit_code == 2, res.output
    assert needle in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1, res.output


def test_simulate_prices_the_measured_load_and_names_it(tmp_path):
    load = skewed_load(tmp_path / "q.json", 128, 16)
    qwen = ["simulate", "qwen3-30b-a3b", "-H", "h100-sxm", "--tp", "4", "--ep", "4", *SIM]
    uniform = run(*qwen)
    skewed = run(*qwen, "--expert-load", load, "--run-dir", tmp_path / "run")
    assert uniform.exit_code == 0 and skewed.exit_code == 0, uniform.output + skewed.output
    u, s = json.loads(uniform.stdout), json.loads(skewed.stdout)
    assert s["summary"]["ttft_s"]["p50"] > u["summary"]["ttft_s"]["p50"]
    assert (s["settings"]["expert_load"], s["settings"]["eplb"]) == (str(load), None)
    assert (u["settings"]["expert_load"], u["settings"]["eplb"]) == (None, None)
    doc = json.loads((tmp_path / "run" / "run.json").read_text())
    assert doc["settings"]["expert_load"] == str(load) and doc["settings"]["eplb"] is None
    table = run(*qwen[:-2], "--expert-load", load, "--eplb", "0")
    assert table.exit_code == 0, table.output
    words = " ".join(table.output.split())  # the title wraps at the terminal's width
    assert "EPLB 0 redundant experts, expert load q.json" in words


def test_simulate_eplb_takes_weights_on_deepseek_v3(tmp_path):
    ds = ["simulate", "deepseek-v3", "-H", "h200", "--tp", "8", "--ep", "8", "--dtype", "fp8", "--requests", "3",
          "--prompt-len", "100", "--output-len", "5", "--efficiency", "roofline", "-f", "json"]
    plain, eplb = run(*ds), run(*ds, "--eplb", "32")
    assert plain.exit_code == 0 and eplb.exit_code == 0, plain.output + eplb.output
    p, e = json.loads(plain.stdout)["settings"], json.loads(eplb.stdout)["settings"]
    assert e["eplb"] == 32 and p["eplb"] is None
    assert e["weights_bytes"] > p["weights_bytes"] * 1.05 and e["num_blocks"] < p["num_blocks"]


@pytest.mark.parametrize("args, needle", [
    (["deepseek-v3", "-H", "h200", "--tp", "8", "--ep", "8", "--eplb", "3"], "eplb: 256 experts + 3 redundant"),
    (["qwen3-30b-a3b", "--eplb", "8", "--ep", "1"], "eplb: 8 needs expert parallelism"),
    (["deepseek-v3", "-H", "h200", "--tp", "8", "--ep", "8", "--expert-load", "QWEN"],
     "has 128 experts per layer, the model 256"),
    (["qwen3-30b-a3b", "--expert-load", "MISSING"], "expert_load: file not found"),
    (["qwen3-30b-a3b", "--expert-load", "BROKEN"], "expert_load: "),
])
def test_simulate_bad_expert_options_are_one_line(tmp_path, args, needle):
    files = dict(QWEN=skewed_load(tmp_path / "q.json", 128, 16), MISSING=tmp_path / "none.json",
                 BROKEN=tmp_path / "broken.json")
    files["BROKEN"].write_text('{"logical_count": [[1, 2')
    res = run("simulate", *[files.get(a, a) for a in args], "--requests", "3")
    one_line_exit_2(res, needle)
    if "QWEN" in args:
        assert "expert_load: " in res.output


def test_plan_names_eplb_per_candidate_and_skips_what_cannot_hold_it(tmp_path):
    load = skewed_load(tmp_path / "d.json", 256, 32)
    base = ["plan", "deepseek-v3", "--rate", "1", "-H", "h200", "--precisions", "fp8", "--tp", "8", "--slo-ttft", "5",
            "--requests", "20", "--prompt-len", "uniform:100:400", "--output-len", "uniform:5:40", "-j", "1"]
    res = run(*base, "--expert-load", load, "--eplb", "3", "-f", "json", "--run-dir", tmp_path / "plan")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert (doc["settings"]["expert_load"], doc["settings"]["eplb"]) == (str(load), 3)
    rows = {r["layout"]: r for r in doc["rows"]}
    assert rows["tp"]["feasible"] and rows["tp"]["eplb"] is None and rows["tp"]["expert_load"] == str(load)
    for lay in ("tp+ep", "dp+ep"):
        assert rows[lay]["binding"] == "layout" and rows[lay]["eplb"] == 3
        assert "eplb: 256 experts + 3 redundant do not divide over ep=8" in rows[lay]["detail"]
    csv = pd.read_csv(tmp_path / "plan" / "plan.csv")
    assert {"expert_load", "eplb"} <= set(csv.columns)
    table = run(*base, "--eplb", "32")
    assert table.exit_code == 0, table.output
    assert "eplb 32" in table.output and "EPLB with 32 redundant experts" in table.output


@pytest.mark.parametrize("args, needle", [
    (["deepseek-v3", "--layouts", "tp", "--eplb", "8"], "eplb: 8 needs an expert-parallel candidate"),
    (["llama-3.1-8b", "--eplb", "8"], "eplb: 8 needs a mixture-of-experts model"),
    (["deepseek-v3", "--expert-load", "QWEN"], "expert_load: "),
])
def test_plan_bad_expert_options_are_one_line(tmp_path, args, needle):
    load = skewed_load(tmp_path / "q.json", 128, 16)
    res = run("plan", *[load if a == "QWEN" else a for a in args], "--rate", "1", "-H", "h200", "--precisions",
              "fp8", "--tp", "8", "--slo-ttft", "5", "--requests", "5")
    one_line_exit_2(res, needle)


def test_speculate_names_the_load_and_eplb_takes_memory(tmp_path):
    load = skewed_load(tmp_path / "d.json", 256, 32)
    common = ["speculate", "deepseek-v3", "--draft", "mtp", "-H", "h200", "--tp", "8", "--ep", "8", "--dtype", "fp8",
              "-k", "2", "-a", "0.8", "-b", "64", "-f", "json"]
    plain, measured = run(*common), run(*common, "--expert-load", load, "--eplb", "32")
    assert plain.exit_code == 0 and measured.exit_code == 0, plain.output + measured.output
    p, m = json.loads(plain.stdout)[0], json.loads(measured.stdout)[0]
    assert (p["expert_load"], p["eplb"]) == (None, None) and (m["expert_load"], m["eplb"]) == (str(load), 32)
    assert m["memory_gib"] > p["memory_gib"]
    one_line_exit_2(run(*common[:-2], "--eplb", "3"), "eplb: 256 experts + 3 redundant")
    one_line_exit_2(run(*common[:-2], "--ep", "1", "--eplb", "8"), "eplb: 8 needs expert parallelism")


def test_speculate_routes_the_draft_as_the_target_only_for_its_own_layers(tmp_path):
    load = load_expert_load(skewed_load(tmp_path / "d.json", 256, 32))
    kw = dict(num_draft_tokens=2, acceptance=0.8, batch=8, prompt_len=128, gen_len=16, tp=8, ep=8,
              precision="fp8", expert_load=load, eplb=32)
    mtp = speculate("deepseek-v3", "mtp", "h200", **kw)
    assert mtp.target.conventions.expert_load is load and mtp.draft.conventions.expert_load is load
    assert mtp.draft.conventions.eplb == 32
    other = speculate("qwen3-30b-a3b", "qwen3-8b", "h100-sxm", **dict(kw, tp=2, ep=2, eplb=None,
                                                                      expert_load=skewed_load(tmp_path / "q.json",
                                                                                              128, 16)))
    assert other.target.conventions.expert_load is not None
    assert other.draft.conventions.expert_load is None and other.draft.conventions.eplb is None


def test_report_draws_the_measured_load_and_eplb(tmp_path):
    load = skewed_load(tmp_path / "q.json", 128, 16)
    common = ["report", "-m", "qwen3-30b-a3b", "-H", "h100-sxm", "--tp", "4", "--ep", "4", "-b", "1", "-p", "512",
              "-g", "8", "--compare", "h100-sxm"]
    res = run(*common, "--expert-load", load, "--eplb", "0", "-o", tmp_path / "r.html")
    assert res.exit_code == 0, res.output
    assert "EPLB 0" in (tmp_path / "r.html").read_text()
    sweep = pd.read_csv(tmp_path / "r_files" / "01-estimate-sweep.csv")
    assert set(sweep["expert_load"]) == {str(load)} and set(sweep["eplb"]) == {0}


def test_report_bad_expert_options_are_one_line(tmp_path):
    load = skewed_load(tmp_path / "q.json", 128, 16)
    common = ["report", "-m", "qwen3-30b-a3b", "-H", "h100-sxm", "--compare", "h100-sxm"]
    one_line_exit_2(run(*common, "--eplb", "8", "--ep", "1", "--tp", "1", "-o", tmp_path / "x.html"),
                    "eplb: 8 needs expert parallelism")
    one_line_exit_2(run("report", "-m", "deepseek-v3", "-H", "h200", "--tp", "8", "--ep", "8", "--expert-load", load,
                        "-o", tmp_path / "y.html"), "expert_load: ")
    assert not (tmp_path / "x.html").exists() and not (tmp_path / "y.html").exists()
