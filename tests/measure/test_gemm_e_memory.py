"""A CPU weight GEMM's memory efficiency by rows and weight bytes (`gemm_e_memory`, efficiency schemas
6 and 7): parsing and refusal, interpolation, pricing, the calibration's sweep and fit. No timing."""

from __future__ import annotations

import glob
from pathlib import Path

import numpy as np
import pytest

from llmperf.analysis import ForwardModel
from llmperf.analysis.roofline import OpCost
from llmperf.analysis.timemodel import time_model_for
from llmperf.errors import SpecError
from llmperf.measure.calibrate import ComputePoint, Settings
from llmperf.measure.calibrate.fit import fit_gemm_e_memory
from llmperf.specs import HardwareSpec, Precision, load_hardware, load_model
from llmperf.specs.efficiency import GemmBytesCurves, parse_efficiency

MB = 1e6


def _eff(**extra):
    return {"schema_version": 6, "dtypes": {"fp32": {
        "matmul": {"e_compute": 0.5, "e_memory": 0.5, "overhead_s": 2e-6},
        "elementwise": {"e_compute": 1.0, "e_memory": 1.0, "overhead_s": 1e-6}}}, **extra}


def _hw(eff):
    return HardwareSpec(name="local", vendor="cpu", peak_tflops={"fp32": 0.1}, memory_bandwidth_gbps=12,
                        memory_gib=8, efficiency=eff, calibration={"tool": "llmperf calibrate"})


CURVES = {1: [[4 * MB, 0.9], [128 * MB, 0.6]], 16: [[4 * MB, 0.5], [128 * MB, 0.3]]}
PREFILL = {**CURVES, 64: [[4 * MB, 0.2], [128 * MB, 0.1]]}  # swept to a prefill's rows too


def test_the_curves_interpolate_in_log_bytes_then_in_log_rows():
    g = GemmBytesCurves.parse(CURVES, "f")
    assert g(1, 4 * MB) == pytest.approx(0.9) and g(1, 128 * MB) == pytest.approx(0.6)
    assert g(1, 1 * MB) == pytest.approx(0.9) and g(1, 1e9) == pytest.approx(0.6)  # flat outside the sizes
    mid = np.exp((np.log(4 * MB) + np.log(128 * MB)) / 2)
    assert g(1, mid) == pytest.approx(0.75)
    assert g(4, 4 * MB) == pytest.approx(0.7)  # half way between 1 and 16 rows in log(rows)
    assert g(4, mid) == pytest.approx((0.75 + 0.4) / 2)
    assert np.allclose(g(np.array([1.0, 4.0, 16.0]), 4 * MB), [0.9, 0.7, 0.5])
    assert np.allclose(g(1, np.array([4 * MB, 128 * MB])), [0.9, 0.6])
    assert np.allclose(g(np.array([1.0, 16.0]), np.array([4 * MB, 128 * MB])), [0.9, 0.3])
    assert list(g.covers(np.array([1, 16, 17]))) == [True, True, False]
    assert g.to_dict() == CURVES
    assert GemmBytesCurves.parse({"8": [[1, 0.5]]}, "f").max_rows == 8  # a yaml key may come as a string


@pytest.mark.parametrize("raw, message", [
    ({"fp32": {0: [[1, 0.5]]}}, r"f.gemm_e_memory.fp32: rows must be an integer >= 1, got 0"),
    ({"fp32": {1.5: [[1, 0.5]]}}, r"f.gemm_e_memory.fp32: rows must be an integer >= 1, got 1.5"),
    ({"fp32": {"x": [[1, 0.5]]}}, r"f.gemm_e_memory.fp32: rows must be an integer >= 1, got 'x'"),
    ({"fp32": {1: [[0, 0.5]]}}, r"f.gemm_e_memory.fp32.1: bytes must be >= 1, got 0"),
    ({"fp32": {1: [[10, 1.5]]}}, r"f.gemm_e_memory.fp32.1: an efficiency must be in \(0, 1\], got 1.5"),
    ({"fp32": {}}, r"f.gemm_e_memory.fp32: expected a mapping of rows"),
    ({"fp32": [1, 2]}, r"f.gemm_e_memory.fp32: expected a mapping of rows"),
    ([1], r"f.gemm_e_memory: expected a mapping of compute dtype"),
])
def test_bad_terms_are_refused_naming_the_field_and_value(raw, message):
    with pytest.raises(SpecError, match=message):
        parse_efficiency(_eff(gemm_e_memory=raw), "f")


def test_the_term_needs_schema_6_and_older_files_load():
    with pytest.raises(SpecError, match="f.gemm_e_memory: needs schema_version 6, the file says 5"):
        parse_efficiency({**_eff(gemm_e_memory={"fp32": CURVES}), "schema_version": 5}, "f")
    assert parse_efficiency({**_eff(), "schema_version": 3}, "f")["gemm_e_memory"] == {}
    paths = sorted(glob.glob("reports/calibrate/*.yaml"))
    assert paths
    has_term = {path: "gemm_e_memory:" in Path(path).read_text() for path in paths}
    assert not all(has_term.values())  # files from before schema 6 are among them
    for path in paths:  # every committed calibration still loads; those before schema 6 price without the term
        hw = load_hardware(path)
        tm = time_model_for(hw, "calibrated", "fp32")
        assert (tm.gemm_e_memory is not None) == has_term[path], path
        if has_term[path]:  # schema 6 read each point as its whole call, 7 as its weight
            assert tm.gemm_e_memory.reads == ("weight" if hw.efficiency["schema_version"] >= 7 else "call"), path


def test_a_small_weight_is_priced_faster_than_a_big_one_at_the_same_rows():
    hw = _hw(_eff(gemm_e_memory={"fp32": CURVES}))
    tm = time_model_for(hw, "calibrated", "fp32")
    assert tm.gemm_e_memory is not None
    fm = ForwardModel(model=load_model("llama-3.1-8b").scaled(num_layers=2), precision=Precision.uniform("fp32"))
    small = OpCost(name="o_proj", kind="matmul", flops=2 * 1024 * 1024, weight_bytes=4 * MB,
                   act_read_bytes=4096, act_write_bytes=4096, rows=1)
    big = OpCost(name="lm_head", kind="matmul", flops=2 * 32 * MB, weight_bytes=128 * MB,
                 act_read_bytes=4096, act_write_bytes=4096, rows=1)
    e_small, e_big = tm.efficiency(small, hw), tm.efficiency(big, hw)
    assert (e_small.e_memory, e_small.e_compute) == (pytest.approx(0.9), 1.0)
    assert (e_big.e_memory, e_big.e_compute) == (pytest.approx(0.6), 1.0)
    bw = hw.mem_bandwidth_bytes_per_s
    per_byte_small = tm.op_time_s(small, hw, "fp32", 1) / small.bytes_total
    per_byte_big = tm.op_time_s(big, hw, "fp32", 1) / big.bytes_total
    assert per_byte_small < per_byte_big
    assert tm.op_time_s(big, hw, "fp32", 1) == pytest.approx(big.bytes_total / (bw * 0.6) + 2e-6)
    # a cost scaled to L layers is read per call
    assert tm.efficiency(small.scaled(32), hw).e_memory == pytest.approx(0.9)
    # beyond the rows swept (a prefill): the matmul kind's curves; arrays of rows mix the two
    assert tm.efficiency(small, hw, rows=512).e_memory == pytest.approx(0.5)
    both = tm.efficiency(small, hw, rows=np.array([1.0, 512.0]))
    assert np.allclose(both.e_memory, [0.9, 0.5]) and np.allclose(both.e_compute, [1.0, 0.5])
    # weight GEMMs of a real model at decode take the curve; other kinds keep theirs
    for c in fm.forward_ops(4, 1, 100):
        e = tm.efficiency(c, hw)
        if c.kind == "matmul" and c.weight_bytes > 0:
            assert e.e_compute == 1.0
        elif c.kind == "elementwise":
            assert e.e_memory == 1.0
    assert tm.to_dict()["gemm_e_memory"] == CURVES


def test_a_shaped_gemm_is_priced_per_group_and_past_the_swept_rows_at_its_weights_top_flop_rate():
    from llmperf.analysis.gemm import GemmShape

    hw = _hw(_eff(gemm_e_memory={"fp32": PREFILL}))
    tm = time_model_for(hw, "calibrated", "fp32")
    n = k = 1000  # one 4 MB fp32 weight
    bw, peak = hw.mem_bandwidth_bytes_per_s, 0.1e12

    # 32 routed rows over 32 touched experts: each expert's GEMM is 1 row over its own 4 MB weight,
    # not one 128 MB weight at 32 rows (between the 16- and 64-row curves)
    experts = OpCost(name="gate_up_proj", kind="matmul", flops=2 * 32 * n * k, weight_bytes=32 * 4 * MB,
                     act_read_bytes=4 * 32 * k, act_write_bytes=4 * 32 * n, rows=32,
                     gemm=GemmShape(n=n, k=k, groups=32, m_per_row=1 / 32))
    e = tm.efficiency(experts, hw)
    assert (e.e_compute, e.e_memory) == (1.0, pytest.approx(0.9))
    plain = OpCost(name="gate_up_proj", kind="matmul", flops=experts.flops, weight_bytes=experts.weight_bytes,
                   act_read_bytes=experts.act_read_bytes, act_write_bytes=experts.act_write_bytes, rows=32)
    assert tm.efficiency(plain, hw).e_memory == pytest.approx((0.3 + 0.1) / 2)

    def dense(rows):
        return OpCost(name="o_proj", kind="matmul", flops=2 * rows * n * k, weight_bytes=4 * MB,
                      act_read_bytes=4 * rows * k, act_write_bytes=4 * rows * n, rows=rows, gemm=GemmShape(n=n, k=k))

    def t(rows, model=tm):
        return model.op_time_s(dense(rows), hw, "fp32", rows) - 2e-6  # less the matmul kind's overhead

    top = 4 * (n * k + 64 * (n + k)) / (bw * 0.2)  # the 64-row point read back from its e_memory
    assert t(64) == pytest.approx(top)
    # past the sweep the GEMM keeps that point's FLOP rate: continuous at 64 rows, linear in rows after
    assert t(64.00001) == pytest.approx(top, rel=1e-5)
    assert t(256) == pytest.approx(4 * top) and t(4096) == pytest.approx(64 * top)
    e256 = tm.efficiency(dense(256), hw)
    assert e256.e_memory == 1.0 and e256.e_compute == pytest.approx(2 * 64 * n * k / (peak * top))
    both = tm.efficiency(dense(np.array([1.0, 256.0])), hw, rows=np.array([1.0, 256.0]))
    assert np.allclose(both.e_memory, [0.9, 1.0]) and np.allclose(both.e_compute, [1.0, e256.e_compute])
    # curves that stop at decode rows (files from before the prefill rows) leave a prefill to the kind's curves
    old = time_model_for(_hw(_eff(gemm_e_memory={"fp32": CURVES})), "calibrated", "fp32")
    assert old.efficiency(dense(256), hw).e_compute == 0.5
    assert old.efficiency(experts, hw).e_memory == pytest.approx(0.9)


def test_weight_read_curves_price_a_skinny_gemm_by_its_rows_and_weight_alone():
    """Schema 7 reads each point as its weight's stream: a GEMM's time then depends on its rows and
    weight bytes only (the FLOPs are 2 x rows x weight elements whatever the N x K), so a 32-wide router
    over 1000 x 4000 inputs at 64 rows costs what a 1000 x 1000 square of the same rows and weight does,
    inside the sweep and past it. Read as whole calls (schema 6), the router's activations (which
    the square never had) were charged at the square's compute-bound e: 4.5-8.8x slow on gpt-oss."""
    from llmperf.analysis.gemm import GemmShape

    def cost(rows, n, k):
        return OpCost(name="router", kind="matmul", flops=2 * rows * n * k, weight_bytes=4 * n * k,
                      act_read_bytes=4 * rows * k, act_write_bytes=4 * rows * n, rows=rows, gemm=GemmShape(n=n, k=k))

    curves = {r: [[c[0][0], c[0][1]]] for r, c in PREFILL.items()}  # one size: 4 MB
    new = _hw({**_eff(gemm_e_memory={"fp32": curves}), "schema_version": 7})
    old = _hw(_eff(gemm_e_memory={"fp32": curves}))
    tm, tm_old = (time_model_for(h, "calibrated", "fp32") for h in (new, old))
    assert (tm.gemm_e_memory.reads, tm_old.gemm_e_memory.reads) == ("weight", "call")
    assert tm.to_dict()["gemm_e_memory_reads"] == "weight"
    bw = new.mem_bandwidth_bytes_per_s
    for rows in (1, 16, 64, 256, 4096):
        square, skinny = cost(rows, 1000, 1000), cost(rows, 32, 31250)  # both 4 MB of weight
        t_square, t_skinny = (tm.op_time_s(c, new, "fp32", rows) for c in (square, skinny))
        assert t_skinny == pytest.approx(t_square, rel=1e-6), rows
        if rows <= 64:  # inside the sweep: the point's time, its weight at e
            e = tm.gemm_e_memory(rows, 4 * MB)
            assert t_square == pytest.approx(4 * MB / (bw * e) + 2e-6)
    # read as calls, the skinny one's 31250-wide activations cost it far more than the square
    assert tm_old.op_time_s(cost(64, 32, 31250), old, "fp32", 64) > 2 * tm_old.op_time_s(cost(64, 1000, 1000), old,
                                                                                          "fp32", 64)
    # a GEMM whose own bytes exceed what e allows is never priced faster than streaming them all
    e = tm.efficiency(cost(1, 1, 4 * 10**6), new)
    assert e.e_memory <= 1.0


def test_a_dtype_without_the_term_keeps_the_kind_curves():
    eff = _eff(gemm_e_memory={"bf16": CURVES})
    eff["dtypes"]["bf16"] = eff["dtypes"]["fp32"]
    hw = _hw(eff)
    assert time_model_for(hw, "calibrated", "fp32").gemm_e_memory is None
    assert time_model_for(hw, "calibrated", "bf16").gemm_e_memory is not None


def _point(rows, n, k, seconds, elem=4):
    return ComputePoint(op="matmul", dtype="fp32", rows=rows, shape="", seconds=seconds, median_s=seconds,
                        spread_s=0.0, n=5, flops=2.0 * rows * n * k, bytes=float(elem * (n * k + rows * (n + k))))


def test_the_fit_reads_each_point_as_a_weight_stream():
    bw = 10e9
    small, big = _point(1, 1024, 1024, 4 * 1024 * 1024 / 8e9), _point(1, 8192, 4096, 128 * 2**20 / 4e9)
    out = fit_gemm_e_memory([(4 * 2**20, small), (128 * 2**20, big), (4 * 2**20, _point(1, 1024, 1024, 1.0))],
                            bw, 0.0)
    assert list(out) == [1] and [b for b, _ in out[1]] == [4 * 2**20, 128 * 2**20]
    e_small, e_big = (e for _, e in out[1])
    assert e_small == pytest.approx(4 * 2**20 / (bw * small.seconds))  # the best of the two, its weight alone
    assert e_big == pytest.approx(128 * 2**20 / (bw * big.seconds)) and e_big < e_small
    fast = fit_gemm_e_memory([(1, _point(1, 1, 1, 1e-12))], bw, 0.0)
    assert fast == {1: [[1, 1.0]]}  # clipped to 1


def test_a_probed_point_is_read_against_its_own_moments_read():
    """A host whose DRAM ran at 80 GB/s while one point was timed and at 50 while another was: each
    point's efficiency is its call against the read of its own moment, the curve scaled to the probes'
    median over the calibration's bandwidth (never above 1), so a point timed in the fast mode is not
    clipped at 1 and the rows keep their order."""
    from dataclasses import replace

    bw = 50e9
    w = 64 * 2**20
    fast = replace(_point(4, 4096, 4096, w / (0.78 * 80e9)), read_bytes_per_s=80e9)  # 0.78 of an 80 GB/s moment
    slow = replace(_point(1, 4096, 4096, w / (0.95 * 50e9)), read_bytes_per_s=50e9)
    mid = replace(_point(2, 4096, 4096, w / (0.9 * 60e9)), read_bytes_per_s=60e9)
    out = fit_gemm_e_memory([(w, fast), (w, slow), (w, mid)], bw, 0.0)
    assert {r: pts[0][1] for r, pts in out.items()} == pytest.approx({1: 0.95, 2: 0.9, 4: 0.78}, rel=1e-3)
    unprobed = fit_gemm_e_memory([(w, replace(fast, read_bytes_per_s=0.0))], bw, 0.0)
    assert unprobed == {4: [[w, 1.0]]}  # against the calibration's own 50 GB/s: clipped, the shape lost
    # a host whose probes ran below the calibration's bandwidth: every point scaled by median / bw
    low = [(w, replace(p, read_bytes_per_s=40e9, median_s=w / (e * 40e9)))
           for p, e in ((slow, 0.95), (mid, 0.9), (fast, 0.78))]
    scaled = fit_gemm_e_memory(low, bw, 0.0)
    assert {r: pts[0][1] for r, pts in scaled.items()} == pytest.approx(
        {1: 0.95 * 0.8, 2: 0.9 * 0.8, 4: 0.78 * 0.8}, rel=1e-3)


def test_the_sweep_builds_its_shapes_smallest_weight_first(monkeypatch):
    import torch

    from llmperf.measure.calibrate import cpu_gemm_sizes as sizes

    monkeypatch.setattr(sizes, "_gemm_path_edges", lambda dname, device: (8, 9))
    cpu = torch.device("cpu")
    s = Settings.tiny()
    assert s.gemm_sizes and s.gemm_size_rows
    assert sizes.gemm_size_rows_for(s, "fp32", cpu) == (1, 4)  # edges past the largest rows: not swept
    assert sizes.gemm_size_rows_for(Settings(), "fp32", cpu) == (1, 2, 4, 8, 9, 16)
    assert sizes.gemm_size_shapes(s, "fp32", cpu) == [(128, 128, 1), (128, 128, 4), (1024, 256, 1), (1024, 256, 4)]
    assert sizes.gemm_size_shapes(Settings(gemm_sizes=()), "fp32", cpu) == []
    assert Settings.for_device("cuda").gemm_sizes == ()  # CUDA: the GEMM shape model prices by shape


def test_the_sweep_times_the_engine_gemm_within_its_budget(monkeypatch):
    import torch

    from llmperf.measure.calibrate import cpu_gemm_sizes as sizes

    monkeypatch.setattr(sizes, "_gemm_path_edges", lambda dname, device: ())
    s = Settings.tiny(threads=1)
    notes: list[str] = []
    pts = sizes.measure_gemm_sizes(s, torch.device("cpu"), lambda _: None, ["fp32"], notes)
    # the decode rows, then the prefill rows (s.gemm_size_prefill_rows = (32,)), smallest weight first
    assert [(w, p.rows) for w, p in pts] == [(4 * 128 * 128, 1), (4 * 128 * 128, 4),
                                            (4 * 1024 * 256, 1), (4 * 1024 * 256, 4),
                                            (4 * 128 * 128, 32), (4 * 1024 * 256, 32)]
    assert all(p.median_s > 0 and p.bytes > w for w, p in pts)
    # each decode-rows point carries a read of its weight's copies just before it; the prefill rows none
    assert all(p.read_bytes_per_s > 0 for _, p in pts[:4]) and all(p.read_bytes_per_s == 0 for _, p in pts[4:])
    assert [p.flops for _, p in pts[-2:]] == [2.0 * 32 * 128 * 128, 2.0 * 32 * 1024 * 256]
    stopped: list[str] = []
    pts = sizes.measure_gemm_sizes(Settings.tiny(gemm_size_budget_s=0.0), torch.device("cpu"), lambda _: None,
                                   ["fp32"], stopped)
    # (a noisy point adds a "timed again" note before it: the stop is looked for among the notes)
    assert [p.rows for _, p in pts][:1] == [1]
    assert any("gemm sizes fp32: stopped before 128x128 rows=4" in n for n in stopped), stopped
    # the prefill rows have their own budget: past it a point is skipped, noted, and the decode rows stay
    skipped: list[str] = []
    pts = sizes.measure_gemm_sizes(Settings.tiny(gemm_size_prefill_budget_s=0.0), torch.device("cpu"),
                                   lambda _: None, ["fp32"], skipped)
    assert [p.rows for _, p in pts] == [1, 4, 1, 4]
    assert [n.split(" (")[0] for n in skipped if "skipped" in n] == [
        "gemm sizes fp32: skipped 128x128 rows=32", "gemm sizes fp32: skipped 1024x256 rows=32"]


def test_the_prefill_rows_follow_the_weights_smallest_first():
    from llmperf.measure.calibrate import cpu_gemm_sizes as sizes

    s = Settings(gemm_sizes=((4096, 1024), (1024, 1024)), gemm_size_prefill_rows=(256, 64))
    assert sizes.gemm_size_prefill_shapes(s) == [(1024, 1024, 64), (1024, 1024, 256),
                                                 (4096, 1024, 64), (4096, 1024, 256)]
    assert sizes.gemm_size_prefill_shapes(Settings(gemm_size_prefill_rows=())) == []
    assert max(Settings().gemm_size_prefill_rows) >= 1024  # a prompt's projections, not only decode rows


@pytest.mark.parametrize("changes, message", [
    (dict(gemm_sizes=((0, 4),)), "gemm_sizes: must be"), (dict(gemm_size_rows=(0,)), "gemm_size_rows: must be"),
    (dict(gemm_size_prefill_rows=(64, 0)), "gemm_size_prefill_rows: must be rows >= 1, got \\(64, 0\\)")])
def test_bad_sweep_settings_are_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        Settings.tiny(**changes)
