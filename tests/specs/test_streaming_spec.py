"""StreamingLLM priced (`llmperf.specs.streaming`): a query sees min(p + 1, S + W) keys, exactly a
sliding window of S + W, so the transform windows every layer; counted here against the rule itself,
query by query; models that already bound their attention and bad input are refused."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from llmperf.analysis.operators import attended_pairs, keys_read
from llmperf.cli import app
from llmperf.errors import SpecError
from llmperf.specs import load_model
from llmperf.specs.streaming import parse_streaming, streaming


def _seen(p: int, sinks: int, window: int) -> set[int]:
    """The keys StreamingLLM's query at position p attends to."""
    return {k for k in range(p + 1) if k < sinks or k > p - window}


@pytest.mark.parametrize(("sinks", "window"), [(0, 1), (4, 1), (4, 16), (1, 7), (16, 4)])
def test_the_rule_counts_like_a_window_of_sinks_plus_window(sinks, window):
    W = sinks + window
    for q0, q in ((0, 40), (5, 1), (30, 1), (30, 8), (0, 3)):  # a step of q new tokens from position q0
        pairs = sum(len(_seen(p, sinks, window)) for p in range(q0, q0 + q))
        assert pairs == attended_pairs(q, q0 + q, True, W)
        keys = len(set().union(*(_seen(p, sinks, window) for p in range(q0, q0 + q))))
        assert keys == keys_read(q, q0 + q, W)


def test_streaming_windows_every_layer_and_names_itself():
    m = load_model("llama-3.1-8b")
    s = streaming(m, 4, 2044)
    assert s.name == "llama-3.1-8b streaming 4+2044" and s.sliding_window == 2048
    assert all(k.attention == "sliding" and k.window == 2048 for k in s.layer_kinds())
    assert s.param_count == m.param_count and s.kv_bytes_per_token() == m.kv_bytes_per_token()
    assert s.kv_cache("fp16").bytes_for_context(100_000) == s.kv_bytes_per_token() * 2048  # capped at S + W


def test_bounded_models_and_bad_values_are_refused():
    for name in ("gemma-3-27b", "mistral-7b", "llama-4-scout"):
        with pytest.raises(SpecError, match=f"^streaming: {name} already bounds its attention"):
            streaming(load_model(name), 4, 100)
    m = load_model("llama-3.1-8b")
    for kw, field in ((dict(sink_tokens=-1, window=4), "sink_tokens"), (dict(sink_tokens=1, window=0), "window"),
                      (dict(sink_tokens=True, window=4), "sink_tokens"), (dict(sink_tokens=1, window=2.0), "window")):
        with pytest.raises(SpecError, match=f"^streaming: {field} must be"):
            streaming(m, **kw)
    assert parse_streaming("--streaming", "4:2044") == (4, 2044)
    for text in ("4", "4:", "a:b", "-1:4", "4:0", "1:2:3"):
        with pytest.raises(SpecError, match="^--streaming: "):
            parse_streaming("--streaming", text)


def test_estimate_prices_a_long_stream_with_the_cache_bounded():
    runner = CliRunner()
    args = ["estimate", "llama-3.1-8b", "-H", "h100-sxm", "-b", "64", "-p", "32000", "-g", "1000", "-f", "json"]
    import json
    plain = json.loads(runner.invoke(app, args).stdout)["configurations"][0]
    r = runner.invoke(app, [*args, "--streaming", "4:2044"])
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout)["configurations"][0]
    assert row["model"] == "llama-3.1-8b streaming 4+2044"
    assert row["kv_cache_gib"] < plain["kv_cache_gib"] / 10 and row["fits"] and not plain["fits"]
    assert row["tpot_s"] < plain["tpot_s"]
    assert np.isclose(row["kv_cache_gib"] * 2 ** 30, 64 * 2048 * load_model("llama-3.1-8b").kv_bytes_per_token("bf16"),
                      rtol=0.02)
    bad = runner.invoke(app, ["estimate", "gemma-3-27b", "--streaming", "4:100"])
    assert bad.exit_code == 2 and "already bounds its attention" in bad.output
