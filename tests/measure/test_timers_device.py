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
