"""Synthetic workloads: reproducibility, independence of the random streams, bounds, (loose) means,
the compact string forms and their errors, and `Request` validation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmperf.engine.sampling import SamplingParams
from llmperf.engine.workload import (
    Cycle,
    Fixed,
    FixedInterval,
    LogNormal,
    Normal,
    Offline,
    Poisson,
    Request,
    Uniform,
    generate_workload,
    parse_arrival,
    parse_length,
)
from llmperf.errors import SpecError


def workload(**changes):
    kw = dict(prompt_len="uniform:4:32", output_len="lognormal:3:0.5:1:64", arrival="poisson:4", vocab_size=100,
              seed=7)
    kw.update(changes)
    return generate_workload(50, **kw)


def test_same_seed_same_workload_and_another_seed_differs():
    assert workload() == workload()
    other = workload(seed=8)
    assert [r.prompt for r in other] != [r.prompt for r in workload()]


def test_streams_are_independent():
    """Changing one distribution leaves the other quantities of a seeded workload unchanged."""
    base, changed = workload(), workload(output_len="fixed:5", arrival="offline")
    assert [r.prompt for r in base] == [r.prompt for r in changed]
    assert [r.max_new_tokens for r in changed] == [5] * 50
    assert [r.arrival_time_s for r in workload(prompt_len=9)] == [r.arrival_time_s for r in base]


def test_requests_are_ordered_and_within_bounds():
    reqs = workload(sampling=SamplingParams(do_sample=True))
    assert [r.request_id for r in reqs] == list(range(50))
    times = [r.arrival_time_s for r in reqs]
    assert times[0] == 0.0 and times == sorted(times)
    assert all(4 <= r.prompt_len <= 32 and 1 <= r.max_new_tokens <= 64 for r in reqs)
    assert all(0 <= t < 100 for r in reqs for t in r.prompt)
    assert all(r.sampling == SamplingParams(do_sample=True) for r in reqs)
    assert generate_workload(0, prompt_len=4, output_len=4, vocab_size=10) == []


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_fixed_uniform_and_cycle():
    assert Fixed(9).sample(3, rng()).tolist() == [9, 9, 9]
    u = Uniform(3, 5).sample(2000, rng())
    assert set(u.tolist()) == {3, 4, 5}  # both ends included
    assert u.mean() == pytest.approx(Uniform(3, 5).mean, rel=0.05)
    assert Cycle((1, 2, 3)).sample(7, rng()).tolist() == [1, 2, 3, 1, 2, 3, 1]
    assert Cycle([4, 6]).mean == 5.0


def test_normal_and_lognormal_are_clipped_and_centred():
    n = Normal(100, 30, lo=60, hi=130).sample(4000, rng())
    assert n.min() >= 60 and n.max() <= 130 and n.dtype == np.int64
    assert np.median(Normal(100, 10).sample(4000, rng())) == pytest.approx(100, rel=0.05)
    ln = LogNormal(6.0, 0.5).sample(4000, rng())
    assert np.median(ln) == pytest.approx(math.exp(6.0), rel=0.05)  # median exp(mu) ~ 403
    assert ln.mean() == pytest.approx(LogNormal(6.0, 0.5).mean, rel=0.05)
    clipped = LogNormal(6.0, 2.0, lo=10, hi=500).sample(4000, rng())
    assert clipped.min() >= 10 and clipped.max() <= 500
    assert Normal(5, 50).sample(1000, rng()).min() >= 1  # lengths are at least 1 by default


def test_arrival_processes():
    assert Offline().times(4, rng()).tolist() == [0.0] * 4
    assert FixedInterval(0.25).times(4, rng()).tolist() == [0.0, 0.25, 0.5, 0.75]
    t = Poisson(4.0).times(4001, rng())
    gaps = np.diff(t)
    assert t[0] == 0.0 and (gaps >= 0).all()
    assert gaps.mean() == pytest.approx(0.25, rel=0.05)  # mean gap 1 / rate
    assert gaps.std() == pytest.approx(0.25, rel=0.1)  # exponential: std = mean
    assert Poisson(2.0).times(1, rng()).tolist() == [0.0] and Poisson(2.0).times(0, rng()).size == 0


@pytest.mark.parametrize("spec, expected", [
    ("128", Fixed(128)), (64, Fixed(64)), ("fixed:128", Fixed(128)), ("uniform:32:512", Uniform(32, 512)),
    ("normal:100:20", Normal(100.0, 20.0)), ("normal:100:20:50:150", Normal(100.0, 20.0, 50, 150)),
    ("lognormal:6.0:0.5", LogNormal(6.0, 0.5)), ("LogNormal:6:0.5:1:2048", LogNormal(6.0, 0.5, 1, 2048)),
    ("cycle:128,256,512", Cycle((128, 256, 512))), (Uniform(1, 2), Uniform(1, 2)),
])
def test_parse_length(spec, expected):
    assert parse_length(spec) == expected
    assert parse_length(str(expected)) == expected  # str() is the compact form


@pytest.mark.parametrize("spec, expected", [
    ("offline", Offline()), ("batch", Offline()), ("poisson:4.0", Poisson(4.0)), ("poisson:2", Poisson(2.0)),
    ("interval:0.25", FixedInterval(0.25)), (Poisson(1.0), Poisson(1.0)),
])
def test_parse_arrival(spec, expected):
    assert parse_arrival(spec) == expected
    assert parse_arrival(str(expected)) == expected


@pytest.mark.parametrize("spec, message", [
    ("uniform:5:2", "uniform: hi must be an integer >= lo=5, got 2"),
    ("uniform:5", "expected uniform:LO:HI"),
    ("fixed:0", "fixed: length must be a positive integer, got 0"),
    ("fixed:1.5", "'1.5' is not an integer"),
    ("normal:10:-1", "normal: std must be a finite number >= 0, got -1.0"),
    ("normal:10:1:0", "normal.lo: must be a positive integer, got 0"),
    ("lognormal:6:0.5:10:5", "lognormal.hi: must be None or an integer >= lo=10, got 5"),
    ("lognormal:a:1", "'a' is not a number"),
    ("cycle:1,x", "'x' is not an integer"),
    ("cycle:1,0", "cycle: values must be a non-empty list of positive integers"),
    ("zipf:1", "unknown distribution 'zipf:1'"),
    (0, "fixed: length must be a positive integer, got 0"),
    (1.5, "expected a distribution or a string"),
])
def test_bad_lengths_raise(spec, message):
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_length(spec)


@pytest.mark.parametrize("spec, message", [
    ("poisson:0", "poisson: rate must be a finite number of requests/s > 0, got 0.0"),
    ("poisson:inf", "poisson: rate must be a finite number"),
    ("poisson", "expected poisson:RATE"),
    ("interval:-1", "interval: must be a finite number of seconds >= 0, got -1.0"),
    ("offline:3", "expected offline"),
    ("uniform:1:2", "unknown process"),
])
def test_bad_arrivals_raise(spec, message):
    with pytest.raises(SpecError, match=message):
        parse_arrival(spec)


@pytest.mark.parametrize("changes, message", [
    (dict(num_requests=-1), "num_requests"), (dict(vocab_size=0), "vocab_size"), (dict(seed=-1), "seed"),
])
def test_bad_workload_arguments_raise(changes, message):
    kw = dict(num_requests=3, prompt_len=4, output_len=4, vocab_size=10, seed=0) | changes
    with pytest.raises(SpecError, match=message):
        generate_workload(kw.pop("num_requests"), **kw)


@settings(max_examples=50, deadline=None)
@given(lo=st.integers(1, 1000), width=st.integers(0, 1000), seed=st.integers(0, 2**32 - 1))
def test_uniform_round_trips_and_stays_in_bounds(lo, width, seed):
    dist = parse_length(f"uniform:{lo}:{lo + width}")
    assert parse_length(str(dist)) == dist
    x = dist.sample(50, rng(seed))
    assert x.min() >= lo and x.max() <= lo + width


# --- Request --------------------------------------------------------------------------------------------


def test_request_converts_and_validates():
    r = Request(request_id=3, prompt=[1, 2, 3], max_new_tokens=8, arrival_time_s=1.5)
    assert r.prompt == (1, 2, 3) and r.prompt_len == 3
    assert Request(request_id=0, prompt=np.array([4, 5]), max_new_tokens=1).prompt == (4, 5)
    for changes, name in [(dict(prompt=()), "prompt"), (dict(prompt=(1, -2)), "prompt"),
                          (dict(max_new_tokens=0), "max_new_tokens"), (dict(arrival_time_s=-1.0), "arrival_time_s"),
                          (dict(sampling={"top_k": 4}), "sampling"), (dict(request_id="a"), "request_id")]:
        kw = dict(request_id=0, prompt=(1,), max_new_tokens=4) | changes
        with pytest.raises(SpecError, match=f"^{name}: "):
            Request(**kw)


def test_request_params_merge():
    default = SamplingParams(max_new_tokens=100, min_new_tokens=10, top_k=5)
    r = Request(request_id=0, prompt=(1,), max_new_tokens=4)
    assert r.params(default) == SamplingParams(max_new_tokens=4, min_new_tokens=4, top_k=5)
    own = Request(request_id=0, prompt=(1,), max_new_tokens=6, sampling=SamplingParams(do_sample=True))
    assert own.params(default) == SamplingParams(max_new_tokens=6, do_sample=True)
