"""The speculative-decoding benchmark (`llmperf.measure.speculative`): it runs, its speculative tokens
equal plain decoding's, it prices the run at the acceptance it measured, and bad input is one line
with exit 2. No figure is asserted (a benchmark; timings depend on the machine)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from llmperf.analysis.speculative import expected_tokens
from llmperf.engine.weights import build_model
from llmperf.measure import speculative as bench
from llmperf.specs import load_model

ROOT = Path(__file__).resolve().parents[2]
CALIBRATION = ROOT / "reports" / "calibrate" / "2026-11-27k-cpu-todays.yaml"  # a committed CPU calibration
TINY = load_model("llama-3.1-8b").scaled(hidden_size=64, num_layers=3, num_heads=4, num_kv_heads=2, ffn_size=128,
                                         vocab_size=256, rotary_dim=None)


def test_scale_tail_shrinks_only_the_later_layers_updates():
    model = build_model(TINY, seed=0)
    before = [(layer.o_weight.clone(), layer.down_weight.clone(), layer.qkv_weight.clone()) for layer in model.layers]
    bench.scale_tail(model, 1, 0.25)
    assert model.layers[0].o_weight.equal(before[0][0])
    for layer, (o, down, qkv) in zip(model.layers[1:], before[1:]):
        assert layer.o_weight.equal(o * 0.25) and layer.down_weight.equal(down * 0.25) and layer.qkv_weight.equal(qkv)


def test_compare_is_exact_and_priced_at_the_measured_acceptance():
    from llmperf.engine.speculative import early_exit_draft
    target = build_model(TINY, seed=0)
    bench.scale_tail(target, 2, 0.05)
    rows = bench.compare(target, early_exit_draft(target, 2), CALIBRATION, ks=(1, 3), prompt_len=8, gen_len=12,
                         reps=1)
    assert [r.num_draft_tokens for r in rows] == [1, 3]
    for r in rows:
        assert r.exact
        assert 0.0 <= r.acceptance <= 1.0 and r.tokens_per_cycle_model == pytest.approx(
            expected_tokens(r.acceptance, r.num_draft_tokens))
        assert (r.time_model, r.engine) == ("calibrated", "llmperf")
        assert r.draft_pred_s > 0 and r.verify_pred_s > 0 and r.tpot_pred_s > 0 and r.tpot_plain_pred_s > 0
        assert r.decode_pred_s == pytest.approx(r.tpot_pred_s * 11)
        assert math.isfinite(r.ratio("tpot_s")) and math.isfinite(r.ratio("speedup"))
    text = "\n".join(bench.lines(rows))
    assert "calibrated time model, engine profile llmperf" in text and "yes" in text


TINY_YAML = """name: tiny-spec
source: a test model
family: llama
vocab_size: 256
hidden_size: 64
num_layers: 3
num_heads: 4
num_kv_heads: 2
ffn_size: 128
ffn_kind: swiglu
hidden_act: silu
norm_kind: rmsnorm
norm_eps: 1.0e-5
pos_encoding: rope
rope_theta: 10000.0
max_positions: 256
tied_embeddings: false
dtype: fp32
"""


def test_main_writes_its_files_and_refuses_bad_input(tmp_path, capsys):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(TINY_YAML)
    out = tmp_path / "run"
    tail = ["-H", str(CALIBRATION), "-k", "1,2", "-p", "4", "-g", "6", "--reps", "1", "--out", str(out)]
    for argv, needle in (([str(spec), "--early-exit", "1", "--tail-scale", "2", *tail], "--tail-scale"),
                         ([str(spec), "--draft", str(spec), "--tail-scale", "0.5", *tail], "--tail-scale"),
                         (["no-such-model", "--early-exit", "1", *tail], "no-such-model"),
                         ([str(spec), "--early-exit", "3", *tail], "num_layers"),
                         ([str(spec), "--early-exit", "1", *tail, "-H", "nowhere.yaml"], "nowhere.yaml"),
                         ([str(spec), "--early-exit", "1", *tail, "--dtype", "fp8"], "--dtype")):
        with pytest.raises(SystemExit) as exc:
            bench.main(argv)
        err = capsys.readouterr().err
        assert exc.value.code == 2 and needle in err, (argv, err)
        assert not out.exists()  # nothing half-written
    assert bench.main([str(spec), "--early-exit", "2", "--tail-scale", "0.1", *tail]) == 0
    data = json.loads((out / "speculative.json").read_text())
    assert [r["num_draft_tokens"] for r in data["rows"]] == [1, 2] and all(r["exact"] for r in data["rows"])
    assert data["settings"]["tail_scale"] == 0.1 and "machine" in data["environment"]
    assert "predicted / measured" in (out / "speculative.txt").read_text()
