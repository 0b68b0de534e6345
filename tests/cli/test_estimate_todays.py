"""`llmperf estimate` on today's models (issue #22) through typer's CliRunner: every new built-in
answers, the JSON rows carry ep, dp_attention and mla_mode, the memory table shows KV by layer kind
and MLA's latent, and `--kv-window` switches sliding layers between their window and full pages."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from llmperf.cli import app

runner = CliRunner()

TODAYS_MODELS = ("qwen3-8b", "qwen3-32b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "deepseek-r1",
                 "kimi-k2", "glm-4.5", "gpt-oss-20b", "gpt-oss-120b", "llama-4-scout", "llama-4-maverick",
                 "gemma-2-9b", "gemma-3-27b")


def run(*args: str, columns: int = 120):  # noqa: ANN201
    return runner.invoke(app, list(args), env={"COLUMNS": str(columns)})


def rows(*args: str) -> list[dict]:
    r = run("estimate", *args, "-f", "json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["configurations"]


@pytest.mark.parametrize("model", TODAYS_MODELS)
def test_every_todays_builtin_estimates(model):
    r = run("estimate", model)
    assert r.exit_code == 0, r.output
    assert f"{model} on a100-80gb-sxm" in r.output and "time per output token" in r.output
    assert "Traceback" not in r.output


def test_json_rows_carry_the_parallelism_and_mla_columns():
    row, = rows("deepseek-v3", "-H", "h200", "--tp", "8", "--ep", "8", "--dp-attention", "--efficiency", "roofline")
    assert (row["ep"], row["dp_attention"], row["mla_mode"], row["tp"]) == (8, True, "auto", 8)
    # MLA's absorbed decode attention (242 FLOP/B) does turn compute-bound on the roofline (ridge 206);
    # under typical (the default) its efficiencies put it at the ridge, so it may not: not asserted there
    assert row["attention_critical_context"] is not None
    typical, = rows("deepseek-v3", "-H", "h200", "--tp", "8", "--ep", "8", "--dp-attention")
    assert typical["time_model"] == "typical" and "attention_critical_context" in typical
    row, = rows("llama-3.1-8b")
    assert (row["ep"], row["dp_attention"], row["mla_mode"]) == (1, False, "auto")
    assert row["attention_critical_context"] is None  # GQA decode attention never does


def test_json_per_op_has_mla_operators_with_their_layer_kind():
    r = run("estimate", "deepseek-v3", "--per-op", "-f", "json")
    assert r.exit_code == 0, r.output
    ops = json.loads(r.stdout)["ops"]
    names = {(o["phase"], o["op"]) for o in ops}
    assert {("prefill", "kv_b_proj"), ("decode", "q_absorb"), ("decode", "v_absorb")} <= names
    # MLA attention is the same in the dense and MoE layers: one row for the 61, labelled with both kinds
    assert {o["layer"] for o in ops if o["scope"] == "layer"} == {"full+full/moe", "full", "full/moe"}
    assert {o["layers"] for o in ops if o["op"] == "q_absorb"} == {61}


def test_tables_show_layer_kinds_latent_and_attention_regime():
    r = run("estimate", "deepseek-v3", "--per-op", columns=160)
    assert r.exit_code == 0, r.output
    assert "MLA latent" in r.output and "512 + 64 = 576 elements" in r.output
    assert "q_absorb [full+full/moe] x61" in r.output and "router [full/moe] x58" in r.output
    assert "\\[" not in r.output  # no markup escape shown
    assert "decode context where attention turns compute-bound" in r.output
    r = run("estimate", "gpt-oss-120b", "-p", "8000", columns=160)
    assert "sliding-128 layers x18 (128 tokens)" in r.output and "full layers x18 (8,128 tokens)" in r.output


def test_kv_window_full_holds_at_least_the_capped_kv():
    capped, = rows("gpt-oss-120b", "-p", "8000")
    full, = rows("gpt-oss-120b", "-p", "8000", "--kv-window", "full")
    assert full["kv_cache_gib"] > capped["kv_cache_gib"]  # 18 sliding layers keep 8,128 tokens, not 128
    assert full["max_batch"] <= capped["max_batch"]
    r = run("estimate", "gpt-oss-120b", "-p", "8000", "--kv-window", "full", columns=160)
    assert "sliding-128 (full pages) layers x18 (8,128 tokens)" in r.output
    dense, = rows("llama-3.1-8b", "--kv-window", "full")  # no windowed layer: nothing changes but the label
    assert capped["kv_window"] == "capped" and full["kv_window"] == dense["kv_window"] == "full"
    assert dense == dict(rows("llama-3.1-8b")[0], kv_window="full")


def test_bad_kv_window_exits_2_naming_it():
    r = run("estimate", "gpt-oss-20b", "--kv-window", "sometimes")
    assert r.exit_code == 2
    assert "--kv-window" in r.output and "sometimes" in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("model", ["gpt-oss-20b", "deepseek-v3", "llama-4-scout"])
def test_per_op_tables_in_80_columns_cut_no_figure(model):
    """Layer-kind labels (`attn_residual [sliding-128/moe] x12`) made the table wider than 80 columns
    even with every optional column left out, and rich cut the last one (`memor`): the names fold."""
    r = run("estimate", model, "--per-op", columns=80)
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    bounds = [line.split()[-1] for line in lines if line.startswith(" ") and re.search(r"FLOP\s", line)]
    assert len(bounds) > 40 and set(bounds) <= {"memory", "compute", "comm"}, set(bounds)
