"""`llmperf estimate --ep / --dp-attention / --mla-mode` through typer's CliRunner."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from llmperf.cli import app

runner = CliRunner()


def test_estimate_takes_ep_and_dp_attention():
    r = runner.invoke(app, ["estimate", "mixtral-8x7b", "-H", "h100-sxm", "--tp", "2", "--ep", "2",
                            "--dp-attention", "--batch", "8", "-f", "json", "--per-op"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    row = doc["configurations"][0]
    assert (row["ep"], row["dp_attention"], row["mla_mode"]) == (2, True, "auto")
    ops = {o["op"] for o in doc["ops"]}
    assert {"moe_dispatch", "moe_combine"} <= ops and "attn_allreduce" not in ops


def test_estimate_refuses_an_ep_that_does_not_divide_tp():
    r = runner.invoke(app, ["estimate", "mixtral-8x7b", "--tp", "2", "--ep", "4"])
    assert r.exit_code == 2
    assert "ep: 4 does not divide tp=2" in r.output and "Traceback" not in r.output
    r = runner.invoke(app, ["estimate", "llama-3.1-8b", "--mla-mode", "sideways"])
    assert r.exit_code == 2 and "mla_mode: must be one of auto, absorbed, unabsorbed" in r.output
