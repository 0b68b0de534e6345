"""The StreamingLLM benchmark (`llmperf.measure.streaming`): it runs, prices each step at its own
context (the stream's capped at S + W), writes its files, and refuses bad input in one line with exit
2. No figure is asserted (a benchmark; timings depend on the machine)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from llmperf.engine.weights import build_model
from llmperf.measure import streaming as bench
from llmperf.specs import load_model

ROOT = Path(__file__).resolve().parents[2]
CALIBRATION = ROOT / "reports" / "streaming" / "2026-11-27-cpu" / "calibration.yaml"
MODEL = ROOT / "reports" / "streaming" / "kv-heavy-gqa-cpu.yaml"


def test_each_step_is_priced_at_its_context():
    spec = load_model(MODEL).scaled(hidden_size=64, num_heads=4, num_kv_heads=2, ffn_size=128, vocab_size=256,
                                    head_dim=None, rotary_dim=None)
    series, tm, engine = bench.measure(build_model(spec, seed=0), CALIBRATION, sink_tokens=2, window=6, batch=2,
                                       prompt_len=12, gen_len=10)
    plain, stream = series
    assert (tm, engine) == ("calibrated", "llmperf")
    assert plain.context == list(range(13, 22)) and len(plain.measured_s) == len(plain.predicted_s) == 9
    assert set(stream.context) == {8} and len(stream.measured_s) == 12 - 8 + 9  # prompt tokens past S + W, then 9
    assert np.all(np.diff(plain.predicted_s) >= 0)  # plain decoding's price grows with the context
    assert max(stream.predicted_s) == pytest.approx(min(stream.predicted_s))  # the stream's does not
    assert stream.evict_s >= 0 and plain.evict_s == 0
    text = "\n".join(bench.lines(series, tm, engine))
    assert "streaming 2+6" in text and "calibrated time model, engine profile llmperf" in text


def test_main_writes_its_files_and_refuses_bad_input(tmp_path, capsys):
    out = tmp_path / "run"
    tail = ["-H", str(CALIBRATION), "-b", "1", "-p", "8", "-g", "6", "--out", str(out)]
    for argv, needle in (([str(MODEL), "--window", "0", *tail], "window"),
                         (["gemma-3-27b", *tail], "already bounds its attention"),
                         (["no-such-model", *tail], "no-such-model"),
                         ([str(MODEL), *tail, "-b", "0"], "--batch"),
                         ([str(MODEL), *tail, "--dtype", "fp8"], "--dtype"),
                         ([str(MODEL), *tail, "-H", "nowhere.yaml"], "nowhere.yaml")):
        with pytest.raises(SystemExit) as exc:
            bench.main(argv)
        err = capsys.readouterr().err
        assert exc.value.code == 2 and needle in err, (argv, err)
        assert not out.exists()
    assert bench.main([str(MODEL), "--sinks", "2", "--window", "4", *tail]) == 0
    data = json.loads((out / "streaming.json").read_text())
    assert [s["name"] for s in data["series"]] == ["plain", "streaming 2+4"] and data["time_model"] == "calibrated"
    assert "median |pred/meas-1|" in (out / "streaming.txt").read_text()
