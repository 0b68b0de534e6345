"""Timers (median and spread) and the device description."""

from __future__ import annotations

import pytest

from llmperf.measure import device, timers


def test_summarize_golden():
    t = timers.summarize([5.0, 1.0, 3.0, 2.0, 4.0], threads=2)
    assert t.median_s == 3.0 and t.n == 5 and t.threads == 2
    assert t.spread_s == pytest.approx((4.6 - 1.4))  # p90 - p10, linearly interpolated


def test_summarize_refuses_nothing():
    with pytest.raises(ValueError, match="samples"):
        timers.summarize([])
    with pytest.raises(ValueError, match="median_s"):
        timers.Timing(median_s=0.0, spread_s=0.0, n=1)


def test_time_cpu_counts_and_threads():
    import torch

    calls = []
    t = timers.time_cpu(lambda: calls.append(1), warmup=2, reps=4)
    assert t.n >= 4 and len(calls) == t.n + 2 and t.median_s > 0 and t.spread_s >= 0
    assert t.threads == torch.get_num_threads()


def test_describe_cpu_has_the_facts():
    d = device.describe("cpu")
    assert d["kind"] == "cpu" and d["cores"] >= 1 and d["threads"] >= 1 and d["name"]
    assert isinstance(d["isa"], list) and isinstance(d["caches"], dict)
    v = device.versions()
    assert {"python", "torch", "numpy", "triton", "llmperf"} <= set(v) and all(isinstance(x, str) for x in v.values())
    assert device.available_memory_bytes("cpu") > 0


def test_time_cpu_stops_a_long_call_after_two():
    import time

    t = timers.time_cpu(lambda: time.sleep(0.02), warmup=0, reps=10, max_time_s=0.01)
    assert t.n == 2 and t.min_s >= 0.02


def test_gc_paused_keeps_the_collector_off_inside_and_restores_it_as_it_was():
    import gc

    from llmperf.measure.timers import gc_paused

    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), gc_paused():  # restored after an error too
        raise RuntimeError("boom")
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # it was off: left off
    finally:
        gc.enable()


def test_the_engine_benchmark_times_generations_with_the_collector_paused(monkeypatch):
    import gc

    from llmperf.engine import Engine
    from llmperf.measure import engine_bench

    seen = []
    real = Engine.generate
    monkeypatch.setattr(Engine, "generate", lambda self, *a, **k: seen.append(gc.isenabled()) or real(self, *a, **k))
    engine_bench.memory_limit_fractions(engine_bench.bench_spec(hidden=64, layers=1, vocab=256), "fp32", 1,
                                        prompt_len=4, new_tokens=3, reps=1, bandwidth=1e10)
    assert seen == [False, False]  # warm-up and the timed repeat
