"""`llmperf speculate`: the table names its time model, engine profile and bound; JSON and CSV carry one
row per (k, acceptance); bad input is one line and exit 2, and the contract holds under random input."""

from __future__ import annotations

import io
import json

import pandas as pd
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from llmperf.cli import app
from tests.cli.test_fuzz_contract import FUZZ, check_contract, snapshot, values

runner = CliRunner()
PAIR = ["speculate", "llama-3.1-70b", "--draft", "llama-3.1-8b", "-H", "h100-sxm", "--tp", "4"]


def test_table_names_the_time_model_engine_and_bound():
    r = runner.invoke(app, [*PAIR, "-k", "1,4", "-a", "0.6,0.9"])
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    assert "priced with the typical time model, engine profile compiled" in out
    assert "expected" in out and "bound" in out and "[bound]" in out
    assert out.count("*") >= 2  # the best k of each acceptance rate


def test_json_and_csv_have_one_row_per_configuration(tmp_path):
    r = runner.invoke(app, [*PAIR, "-k", "2,3,4", "-a", "0.5,0.8", "-f", "json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert len(rows) == 6 and {(x["num_draft_tokens"], x["acceptance"]) for x in rows} == {
        (k, a) for k in (2, 3, 4) for a in (0.5, 0.8)}
    assert all(x["time_model"] == "typical" and x["engine"] == "compiled" for x in rows)
    out = tmp_path / "s.csv"
    r = runner.invoke(app, [*PAIR, "-k", "2,3", "-a", "0.7", "-f", "csv", "-o", str(out), "--efficiency", "roofline"])
    assert r.exit_code == 0, r.output
    frame = pd.read_csv(io.StringIO(out.read_text()))
    assert len(frame) == 2 and set(frame["time_model"]) == {"roofline"} and set(frame["engine"]) == {"none"}
    assert (frame["tpot_s"] == frame["tpot_bound_s"]).all()


def test_a_configuration_that_does_not_fit_is_warned_about():
    r = runner.invoke(app, ["speculate", "llama-3.1-70b", "-d", "llama-3.1-8b", "-k", "2", "-a", "0.7"])
    assert r.exit_code == 0 and "does not fit" in r.stderr


def test_bad_input_is_one_line_naming_the_option():
    for args, needle in ((["-k", "0"], "--tokens"), (["-a", "1.2"], "--acceptance"), (["-a", "x"], "--acceptance"),
                         (["--draft-tp", "3"], "--draft-tp"), (["--efficiency", "fast"], "--efficiency"),
                         (["--engine", "nope"], "engine"), (["--batch", "0"], "--batch")):
        r = runner.invoke(app, [*PAIR, *args])
        assert r.exit_code == 2, (args, r.output)
        lines = [ln for ln in r.output.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], (args, r.output)
    r = runner.invoke(app, ["speculate", "llama-3.1-70b", "-d", "qwen3-8b"])
    assert r.exit_code == 2 and "vocab_size" in r.output


@FUZZ
@given(k=values, a=values, batch=values, fmt=st.sampled_from(["json", "csv"]))
def test_random_input_keeps_the_contract(tmp_path_factory, k, a, batch, fmt):
    folder = tmp_path_factory.mktemp("spec")
    before = snapshot(folder)
    out = "out." + fmt
    res = runner.invoke(app, [*PAIR, "-k", k, "-a", a, "-b", batch, "-g", "16", "-f", fmt, "-o", str(folder / out)])
    check_contract(res, folder, before, out, fmt)


def test_the_models_own_mtp_layer_drafts():
    r = runner.invoke(app, ["speculate", "deepseek-v3", "--draft", "mtp", "-H", "h200", "--tp", "8", "--dtype", "fp8",
                            "-k", "1,2", "-a", "0.8", "-f", "json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert [x["draft"] for x in rows] == ["deepseek-v3 MTP"] * 2 and all(x["fits"] for x in rows)
    # as DeepSeek-V3 is served: data-parallel attention, experts over the eight GPUs, both named
    r = runner.invoke(app, ["speculate", "deepseek-v3", "--draft", "mtp", "-H", "h200", "--tp", "8", "--ep", "8",
                            "--dp-attention", "-k", "2", "-a", "0.8", "-b", "64"])
    assert r.exit_code == 0, r.output
    assert "ep 8, data-parallel attention" in " ".join(r.stdout.split())
    r = runner.invoke(app, ["speculate", "deepseek-v3", "--draft", "mtp", "-H", "h200", "--tp", "8", "--ep", "3"])
    assert r.exit_code == 2 and r.output.startswith("error: ep: 3") and len(r.output.strip().splitlines()) == 1
    r = runner.invoke(app, ["speculate", "llama-3.1-8b", "--draft", "mtp"])
    assert r.exit_code == 2 and "mtp_layers" in r.output and len(r.output.strip().splitlines()) == 1


def test_the_table_goes_to_a_file(tmp_path):
    out = tmp_path / "spec.txt"
    r = runner.invoke(app, [*PAIR, "-k", "2", "-a", "0.7", "-o", str(out)])
    assert r.exit_code == 0 and r.stdout == "", r.output
    text = " ".join(out.read_text().split())
    assert "llama-3.1-70b drafted by llama-3.1-8b" in text and "typical time model" in text
