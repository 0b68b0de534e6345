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


def test_reprice_prices_the_saved_run_again_and_keeps_what_was_measured(tmp_path, capsys):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(TINY_YAML)
    run, again = tmp_path / "run", tmp_path / "again"
    assert bench.main([str(spec), "--early-exit", "1", "-H", str(CALIBRATION), "-k", "1,2", "-p", "4", "-g", "6",
                       "--reps", "1", "--out", str(run)]) == 0
    first = json.loads((run / "speculative.json").read_text())
    assert bench.main([str(spec), "--reprice", str(run), "-H", str(CALIBRATION), "--out", str(again)]) == 0
    same = json.loads((again / "speculative.json").read_text())
    assert same["rows"] == first["rows"]  # the same pricing: every figure as before
    assert same["settings"]["repriced_from"] == str(run)
    assert bench.main([str(spec), "--reprice", str(run), "-H", str(CALIBRATION), "--efficiency", "roofline",
                       "--out", str(again)]) == 0
    bound = json.loads((again / "speculative.json").read_text())
    measured = ("acceptance", "tokens_per_cycle", "draft_s", "verify_s", "decode_s", "tpot_s", "tpot_plain_s",
                "speedup", "exact")
    for a, b in zip(first["rows"], bound["rows"]):
        assert all(a[m] == b[m] for m in measured) and b["time_model"] == "roofline"
        assert b["tpot_pred_s"] < a["tpot_pred_s"]  # the bound: no overheads, every ceiling reached
    capsys.readouterr()
    for argv, needle in (([str(spec), "--reprice", str(tmp_path / "nothing")], "--reprice"),
                         (["llama-3.1-8b", "--reprice", str(run)], "tiny-spec"),
                         ([str(spec)], "--early-exit")):
        with pytest.raises(SystemExit) as exc:
            bench.main(argv)
        assert exc.value.code == 2 and needle in capsys.readouterr().err, argv


def test_a_run_of_llmperfs_engine_is_priced_as_that_engine_runs():
    """A GPU run is llmperf's eager engine: priced by the GPU's calibration where the spec has one, else
    `typical`, with the eager profile either way (not the CUDA-graph stack a capacity answer assumes)."""
    from llmperf.analysis.roofline import engine_label
    from llmperf.measure.profile import own_engine_time_model
    from llmperf.specs import load_hardware
    gpu_cal = load_hardware(ROOT / "reports" / "calibrate" / "2026-11-27l-h100.yaml")
    for hw, dtype, want in ((gpu_cal, "bf16", ("calibrated", "eager")),
                            (load_hardware("h100-sxm"), "bf16", ("typical", "eager")),
                            (load_hardware(CALIBRATION), "fp32", ("calibrated", "llmperf"))):
        tm = own_engine_time_model(hw, None, dtype, "triton" if dtype == "bf16" else "sdpa")
        assert (tm.name, engine_label(tm)) == want
    assert own_engine_time_model(load_hardware("h100-sxm"), "roofline", "bf16").name == "roofline"
