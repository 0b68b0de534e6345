"""The tensor-parallel benchmark (`llmperf.measure.tensor_parallel`): it runs tp 1 and tp 2 (gloo, two
processes of one thread), the ranks' tokens equal one rank's, every step is priced at its tp with the
vocabulary split and its two collectives (as the engine runs it; with `vocab_parallel=False` the LM head
whole), and bad input is one line with exit 2. No figure is asserted."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from llmperf.analysis.rollup import Conventions, forward_model
from llmperf.analysis.timemodel import ROOFLINE_MODEL
from llmperf.measure import tensor_parallel as bench
from llmperf.specs import Precision, load_hardware, load_model

ROOT = Path(__file__).resolve().parents[2]
CALIBRATION = ROOT / "reports" / "calibrate" / "2026-11-27k-cpu-todays.yaml"  # a committed CPU calibration
TINY = load_model("llama-3.1-8b").scaled(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, ffn_size=128,
                                         vocab_size=256, rotary_dim=None)


def _linked(tmp_path: Path) -> Path:
    """The committed calibration with an all-reduce (a tp > 1 price needs the interconnect's terms)."""
    text = CALIBRATION.read_text().replace("interconnect_gbps: 0.0", "interconnect_gbps: 2.0", 1)
    path = tmp_path / "linked.yaml"
    path.write_text(text)
    return path


def test_the_price_shards_the_layers_and_the_vocabulary_or_keeps_the_head_whole(tmp_path):
    hw = load_hardware(_linked(tmp_path))
    wide = load_model("reports/tensor_parallel/llama-style-tp-cpu.yaml")
    steps = [("prefill", 1, 16, 16, 0.0), ("decode", 1, 1, 17, 0.0), ("decode", 8, 1, 18, 0.0)]
    one = bench.predicted(wide, 1, hw, steps, dtype="fp32", efficiency="roofline")
    two = bench.predicted(wide, 2, hw, steps, dtype="fp32", efficiency="roofline")
    kept = bench.predicted(wide, 2, hw, steps, dtype="fp32", efficiency="roofline", vocab_parallel=False)
    assert one["allreduce_s"] == 0.0 and kept["allreduce_s"] > 0.0
    for a, b, c in zip(one["bound"][1:], two["bound"][1:], kept["bound"][1:]):
        assert 0.5 * a < b < c < a  # the layers' weights halve; the LM head (262 MB of the 983) halves or stays
    # the split vocabulary's two collectives, once a decode step, on top of the layers' all-reduces
    fm = forward_model(wide, Precision.uniform("fp32"), Conventions(), 2)
    vocab_comm = [c for c in fm.head_ops(8, 1, 18) + fm.tail_ops(8, 1, 18) if c.kind == "comm"]
    assert [c.name for c in vocab_comm] == ["embed_allreduce", "logits_gather"]
    extra = sum(float(ROOFLINE_MODEL.op_time_s(c, hw, hw.compute_dtype("fp32"), c.rows)) for c in vocab_comm)
    assert two["allreduce_s"] - kept["allreduce_s"] == pytest.approx(extra, rel=1e-12)
    head = replace(wide, num_layers=1)  # nearly all head: halving the layer saves little unless the head splits
    h1 = bench.predicted(head, 1, hw, steps, dtype="fp32", efficiency="roofline")["bound"][1]
    h2 = bench.predicted(head, 2, hw, steps, dtype="fp32", efficiency="roofline")["bound"][1]
    h2_kept = bench.predicted(head, 2, hw, steps, dtype="fp32", efficiency="roofline", vocab_parallel=False)["bound"][1]
    assert h2_kept > 0.75 * h1 > h2
    cal = bench.predicted(wide, 2, hw, steps, dtype="fp32")
    assert (cal["time_model"], cal["engine"]) == ("calibrated", "llmperf")
    assert all(e > b for e, b in zip(cal["expected"], cal["bound"]))


def test_main_runs_tp_1_and_2_and_refuses_bad_input(tmp_path, capsys):
    spec = tmp_path / "tiny.yaml"
    import yaml
    spec.write_text(yaml.safe_dump(dict(name="tiny-tp", source="a test model", family="llama", vocab_size=256,
                                        hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, ffn_size=128,
                                        ffn_kind="swiglu", hidden_act="silu", norm_kind="rmsnorm", norm_eps=1e-5,
                                        pos_encoding="rope", rope_theta=10000.0, max_positions=256,
                                        tied_embeddings=False, dtype="fp32")))
    out, cal = tmp_path / "run", _linked(tmp_path)
    tail = ["-H", str(cal), "-b", "2", "-p", "4", "-g", "4", "--reps", "1", "--threads-per-rank", "1",
            "--out", str(out)]
    for argv, needle in (([str(spec), "--tp", "1,3", *tail], "num_heads"),
                         ([str(spec), "--tp", "0", *tail], "--tp"),
                         ([str(spec), "--tp", "2", *tail, "-H", str(CALIBRATION)], "interconnect"),
                         (["no-such-model", *tail], "no-such-model"),
                         ([str(spec), *tail, "--dtype", "fp8"], "--dtype")):
        with pytest.raises(SystemExit) as exc:
            bench.main(argv)
        err = capsys.readouterr().err
        assert exc.value.code == 2 and needle in err, (argv, err)
        assert not out.exists()  # nothing half-written
    assert bench.main([str(spec), "--tp", "1,2", *tail]) == 0
    data = json.loads((out / "tensor_parallel.json").read_text())
    rows = data["rows"]
    assert [(r["tp"], r["batch"]) for r in rows] == [(1, 2), (2, 2)]
    assert all(r["exact"] for r in rows)
    assert rows[1]["allreduce_s"] > 0 and rows[1]["allreduce_pred_s"] > 0 and rows[0]["allreduce_s"] == 0
    assert rows[1]["speedup"] > 0 and rows[1]["speedup_pred"] > 0
    assert "predicted / measured" in (out / "tensor_parallel.txt").read_text()
