"""`llmperf simulate --streaming SINKS:WINDOW` and `llmperf plan --streaming`: the model windowed as
`estimate --streaming` windows it, named in the settings, the JSON and the run directory, its pool
capped at the window; bad input refused in one line naming the option (exit 2)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from llmperf.cli import app

runner = CliRunner()
SIM = ["simulate", "llama-3.1-8b", "-H", "a100-80gb-sxm", "--requests", "10", "--prompt-len", "100",
       "--output-len", "10", "--efficiency", "roofline"]
PLAN = ["plan", "llama-3.1-8b", "--rate", "1", "-H", "a100-80gb-sxm", "--precisions", "bf16", "--tp", "1", "-n", "20",
        "-j", "1", "--slo-ttft", "1", "--prompt-len", "100", "--output-len", "10"]


def test_simulate_streaming_names_it_and_caps_the_pool(tmp_path):
    res = runner.invoke(app, [*SIM, "--streaming", "4:60", "-f", "json", "--run-dir", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    st = json.loads(res.stdout)["settings"]
    assert st["model"] == "llama-3.1-8b streaming 4+60" and st["streaming"] == "4:60"
    assert st["kv_sliding_full_pages"] is False and st["kv_note"].startswith("KV: every layer sliding (64 tokens)")
    saved = json.loads((tmp_path / "run" / "run.json").read_text())
    assert saved["settings"]["streaming"] == "4:60" and saved["model"] == "llama-3.1-8b streaming 4+60"
    plain = runner.invoke(app, [*SIM, "-f", "json"])
    assert plain.exit_code == 0 and json.loads(plain.stdout)["settings"]["streaming"] is None
    table = runner.invoke(app, SIM + ["--streaming", "4:60"])
    assert table.exit_code == 0 and "llama-3.1-8b streaming 4+60" in table.output


def test_plan_streaming_names_it(tmp_path):
    res = runner.invoke(app, [*PLAN, "--streaming", "4:60", "-f", "json", "--run-dir", str(tmp_path / "plan")])
    assert res.exit_code == 0, res.output
    st = json.loads(res.stdout)["settings"]
    assert st["model"] == "llama-3.1-8b streaming 4+60" and st["streaming"] == "4:60"
    assert st["kv_note"].startswith("KV: every layer sliding (64 tokens)")
    assert json.loads((tmp_path / "plan" / "plan.json").read_text())["settings"]["streaming"] == "4:60"


@pytest.mark.parametrize("command", [SIM, PLAN], ids=["simulate", "plan"])
@pytest.mark.parametrize("value, needle", [("4", "'4' is not SINKS:WINDOW"), ("a:b", "'a:b' is not SINKS:WINDOW"),
                                           ("4:0", "'4:0' needs SINKS >= 0 and WINDOW >= 1"),
                                           ("-1:8", "'-1:8' needs SINKS >= 0")])
def test_bad_streaming_values_are_one_line(command, value, needle):
    res = runner.invoke(app, [*command, "--streaming", value])
    _one_error_line(res, "--streaming", needle)


@pytest.mark.parametrize("command", ["simulate", "plan"])
def test_a_model_with_sliding_layers_is_refused(command):
    args = [*(SIM if command == "simulate" else PLAN), "--streaming", "4:60"]
    args[1] = "mistral-7b"
    _one_error_line(runner.invoke(app, args), "--streaming: mistral-7b already bounds its attention")


def test_validate_does_not_take_streaming():
    _one_error_line(runner.invoke(app, ["simulate", "--validate", "--streaming", "4:60"]), "--validate", "--streaming")


def _one_error_line(res, *needles: str) -> None:
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    assert "Traceback" not in res.output
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
