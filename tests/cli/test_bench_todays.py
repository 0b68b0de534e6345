"""The speed benchmark of today's models runs on tiny sizes (it prints figures; nothing here is timed),
and the speed fixes keep every answer: the CLI's one roll-up per configuration gives exactly the
sweep's rows, and the regime searches find the smallest n."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import given
from hypothesis import strategies as st

from llmperf.analysis.rollup import first_true_array
from llmperf.analysis.sweep import estimates_frame, sweep, sweep_estimates
from llmperf.cli.commands.bench_todays import Timing, bench, main, report


def test_bench_runs_on_tiny_sizes():
    timings = bench(repeats=2, estimate_models=("llama-3.1-8b", "deepseek-v3"), sweep_models=("gpt-oss-20b",),
                    batches=(1, 8), prompts=(128,), gens=(16,), devices=("h100-sxm",))
    assert [(t.what, t.model, t.configurations) for t in timings] == [
        ("estimate --per-op", "llama-3.1-8b", 1), ("estimate --per-op", "deepseek-v3", 1), ("sweep", "gpt-oss-20b", 2)]
    assert all(len(t.seconds) == 2 and t.min_s <= t.median_s <= t.max_s for t in timings)
    text = report(timings)
    assert "x1.00 of llama-3.1-8b" in text and "sweep (2 configuration(s) per run, 2 repeats)" in text


def test_report_gives_each_ratio_to_the_first_model():
    timings = [Timing(what="sweep", model="a", configurations=4, seconds=(1.0, 2.0, 3.0)),
               Timing(what="sweep", model="b", configurations=4, seconds=(4.0, 5.0, 6.0))]
    assert "x2.50 of a" in report(timings)


def test_main_parses_its_options(capsys, monkeypatch):
    import llmperf.cli.commands.bench_todays as b
    monkeypatch.setattr(b, "ESTIMATE_MODELS", ("llama-3.1-8b",))
    main(["--repeats", "1", "--only", "estimate"])
    assert "estimate --per-op" in capsys.readouterr().out


def test_estimates_frame_equals_the_sweep_rows():
    """The CLI builds its rows from the estimates it makes for the per-operator tables (one roll-up per
    configuration): they equal `sweep`'s, values and dtypes, missing regimes included."""
    for model, opts in (("deepseek-v3", dict(batch=[1, 64], prompt_len=[100, 5000], gen_len=[1, 50])),
                        ("gpt-oss-20b", dict(kv_window="full", prompt_len=[4000])),
                        ("llama-3.1-8b", dict(tp=[1, 2]))):
        rows = sweep(model, ["a100-80gb-sxm", "h200"], **opts)
        pd.testing.assert_frame_equal(estimates_frame(sweep_estimates(model, ["a100-80gb-sxm", "h200"], **opts)),
                                      rows, check_exact=True)


@given(st.lists(st.integers(1, 2**26 + 5), min_size=1, max_size=12), st.integers(1, 1000),
       st.integers(0, 2**26), st.sampled_from([2, 3, 32, 64]))
def test_first_true_array_finds_the_smallest_n_of_every_row(thresholds, lo, width, ways):
    """The regime searches' doubling bracket then `ways`-ary narrowing: for monotone predicates
    (n >= t_row), exactly max(t, lo) where t <= hi, NaN where no n in [lo, hi] works."""
    hi = lo + width
    t = np.asarray(thresholds, dtype=float)
    calls = []

    def pred(n):  # noqa: ANN001, ANN202
        calls.append(n.shape)
        return n >= t[:, None]

    got = first_true_array(pred, t.size, lo=lo, hi=hi, ways=ways)
    want = np.where(t <= hi, np.maximum(t, lo), np.nan)
    np.testing.assert_array_equal(got, want)
    assert all(shape[0] == t.size for shape in calls)
