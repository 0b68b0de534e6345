"""Torch-free workloads: arrivals (Poisson, gamma CV, duration), lengths from files, shared system
prompts, traces and every bad-input path (trace errors name the line and the field)."""

from __future__ import annotations

import numpy as np
import pytest

from llmperf.errors import SpecError
from llmperf.serving.workload import (
    Empirical,
    Gamma,
    Poisson,
    WorkloadSpec,
    generate,
    load_trace,
    parse_arrival,
    parse_length,
    read_length_file,
)


def spec(**kw):
    base = dict(arrival="poisson:5", prompt_len="uniform:10:50", output_len="lognormal:3:0.5:1:64", num_requests=200,
                seed=3)
    return WorkloadSpec(**(base | kw))


def test_same_seed_same_workload_other_seed_differs():
    assert generate(spec()) == generate(spec())
    assert generate(spec()) != generate(spec(seed=4))


def test_streams_independent_and_system_prompt_added():
    a, b = generate(spec()), generate(spec(output_len="fixed:7", system_prompt_len=100))
    assert np.array_equal(a.arrival_s, b.arrival_s)
    assert np.array_equal(a.prompt_tokens + 100, b.prompt_tokens)
    assert (b.shared_prefix_tokens == 100).all() and (b.output_tokens == 7).all()


def test_gamma_rate_and_cv():
    rng = np.random.default_rng(0)
    gaps = Gamma(4.0, 2.0).gaps(40000, rng)
    assert gaps.mean() == pytest.approx(0.25, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(2.0, rel=0.05)
    # cv = 1 is the exponential: the same mean and spread as Poisson
    g1 = Gamma(4.0, 1.0).gaps(40000, rng)
    assert g1.std() / g1.mean() == pytest.approx(1.0, rel=0.03)
    assert parse_arrival("gamma:4:2") == Gamma(4.0, 2.0) and str(Gamma(4.0, 2.0)) == "gamma:4:2"


def test_duration_gives_arrivals_within_it():
    w = generate(spec(num_requests=None, duration_s=60.0, arrival="poisson:10"))
    assert w.arrival_s.max() < 60 and w.arrival_s[0] == 0
    assert len(w) == pytest.approx(600, rel=0.15)
    with pytest.raises(SpecError, match="duration"):
        spec(num_requests=None, duration_s=10.0, arrival="offline")
    with pytest.raises(SpecError, match="exactly one"):
        spec(duration_s=10.0)
    with pytest.raises(SpecError, match="duration: must be"):
        spec(num_requests=None, duration_s=-1.0)


def test_length_file(tmp_path):
    f = tmp_path / "lens.txt"
    f.write_text("# observed\n10\n\n20  # a comment\n30\n")
    dist = parse_length(f"file:{f}")
    assert isinstance(dist, Empirical) and dist.mean == 20
    assert set(dist.sample(500, np.random.default_rng(0)).tolist()) == {10, 20, 30}
    f.write_text("10\nx\n")
    with pytest.raises(SpecError, match=r"line 2: length 'x' is not an integer"):
        parse_length(f"file:{f}")
    f.write_text("10\n0\n")
    with pytest.raises(SpecError, match="line 2: length must be a positive integer"):
        parse_length(f"file:{f}")
    with pytest.raises(SpecError, match="cannot read"):
        parse_length(f"file:{tmp_path / 'missing.txt'}")


def test_trace_csv_and_jsonl(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text("arrival_s,prompt_tokens,output_tokens\n0.5,100,10\n0.0,20,5\n")
    w = load_trace(csv)
    assert w.arrival_s.tolist() == [0.0, 0.5] and w.prompt_tokens.tolist() == [20, 100]
    js = tmp_path / "t.jsonl"
    js.write_text('{"arrival_s": 0, "prompt_tokens": 8, "output_tokens": 2, "shared_prefix_tokens": 4}\n')
    assert load_trace(js).shared_prefix_tokens.tolist() == [4]


def test_trace_and_length_file_with_a_byte_order_mark(tmp_path):
    """A CSV saved by a spreadsheet starts with a UTF-8 byte-order mark; its header was once read as
    lacking 'arrival_s' (regression)."""
    csv = tmp_path / "excel.csv"
    csv.write_bytes(b"\xef\xbb\xbfarrival_s,prompt_tokens,output_tokens\r\n0,100,10\r\n")
    assert load_trace(csv).prompt_tokens.tolist() == [100]
    lengths = tmp_path / "lengths.txt"
    lengths.write_bytes(b"\xef\xbb\xbf12\n34\n")
    assert read_length_file(lengths).values == (12, 34)


@pytest.mark.parametrize("text, message", [
    ("arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,,5\n", r"line 3: prompt_tokens: missing"),
    ("arrival_s,prompt_tokens,output_tokens\n-1,10,5\n", r"line 2: arrival_s: must be a number >= 0, got '-1'"),
    ("arrival_s,prompt_tokens,output_tokens\n0,10,-5\n", r"line 2: output_tokens: must be an integer >= 1"),
    ("arrival_s,prompt_tokens,output_tokens\n0,1.5,5\n", r"line 2: prompt_tokens: '1.5' is not an integer"),
    ("arrival_s,prompt_tokens,output_tokens\n0,abc,5\n", r"line 2: prompt_tokens: 'abc' is not a number"),
    ("arrival_s,prompt_tokens\n0,10\n", r"line 1: header lacks column 'output_tokens'"),
    ('{"arrival_s": 0, "prompt_tokens": 10}\n', r"line 1: output_tokens: missing"),
    ('{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 1}\n{oops\n', r"line 2: not a JSON object"),
    ('{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 1, "shared_prefix_tokens": 11}\n',
     r"line 1: shared_prefix_tokens: 11 exceeds prompt_tokens 10"),
    ("", "holds no requests"),
    # a JSON array was once read as a CSV whose header "lacks column 'arrival_s'" (regression)
    ('\n[{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 1}]\n', r"line 2: a JSON array; a trace is JSONL"),
])
def test_bad_trace_names_line_and_field(tmp_path, text, message):
    f = tmp_path / "trace.csv"
    f.write_text(text)
    with pytest.raises(SpecError, match=message):
        load_trace(f)


@pytest.mark.parametrize("kw, message", [
    (dict(arrival="poisson:0"), "rate must be"), (dict(arrival="gamma:1:0"), "cv must be"),
    (dict(arrival="gamma:-1:1"), "rate must be"), (dict(num_requests=-1), "requests"),
    (dict(system_prompt_len=-1), "system_prompt_len"), (dict(seed=-2), "seed"),
])
def test_bad_specs(kw, message):
    with pytest.raises(SpecError, match=message):
        spec(**kw)


def test_engine_adapter_shares_the_system_prompt():
    from llmperf.engine.workload import to_requests
    w = generate(spec(num_requests=5, system_prompt_len=12))
    reqs = to_requests(w, vocab_size=50, seed=1)
    assert all(r.prompt[:12] == reqs[0].prompt[:12] for r in reqs)
    assert [r.prompt_len for r in reqs] == w.prompt_tokens.tolist()
    assert [r.arrival_time_s for r in reqs] == w.arrival_s.tolist()
    assert isinstance(spec().arrival, Poisson)


def test_serving_never_imports_torch():
    import subprocess
    import sys
    code = ("import sys; import llmperf.serving.simulator, llmperf.serving.planner, llmperf.serving.workload, "
            "llmperf.serving.rundir; assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
