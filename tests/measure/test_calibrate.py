"""`llmperf calibrate` on this CPU with small sizes: positive, plausible, ordered figures; the fit
reproduces a synthetic device; the YAML round-trips as `local`; corrupt and foreign files are refused."""

from __future__ import annotations

import pytest
import yaml

from llmperf.analysis.timemodel import KindTerms, time_model_for
from llmperf.errors import SpecError
from llmperf.measure.calibrate import ComputePoint, Settings, calibrate, fit_curves, write_yaml
from llmperf.specs import load_hardware
from llmperf.specs.local import load_calibrated, local_path


@pytest.fixture(scope="module")
def cal():
    # 256 KiB fits the L2 of any current CPU; 96 MiB exceeds its last-level cache: DRAM
    # one thread: on a shared machine a second OpenMP thread waits for a descheduled peer
    return calibrate(Settings.tiny(stream_sizes=(256 * 1024, 96 * 2**20), threads=1))


def test_figures_are_positive_and_in_their_units(cal):
    """Structure, not speed (no test depends on how fast or busy this machine is): every figure is
    positive and finite, in bytes/s and FLOP/s (bounds six orders of magnitude wide catch a unit slip,
    never a slow machine), each stream size and kind measured once. How fast the caches are against
    DRAM, or bf16 against fp32, is what `llmperf calibrate` prints, not a pass/fail test."""
    import math

    assert all(p.seconds > 0 and p.bytes_per_s > 0 for p in cal.streams)
    assert all(p.seconds > 0 and p.flops_per_s > 0 for p in cal.compute)
    assert 1e6 < cal.memory_bytes_per_s() < 1e14  # 1 MB/s .. 100 TB/s
    for d in ("fp32", "bf16"):
        assert 1e6 < cal.peak_flops_per_s(d) < 1e18
    assert set(cal.overhead_s) == {"matmul", "attention", "elementwise", "norm", "embedding"}
    assert all(0 < v < 1 and math.isfinite(v) for v in cal.overhead_s.values())  # seconds, not microseconds
    assert cal.device["threads"] >= 1 and cal.versions["torch"]
    kinds = [(p.kind, p.size_bytes) for p in cal.streams]
    assert len(kinds) == len(set(kinds)) and {s for _, s in kinds} == {256 * 1024, 96 * 2**20}


def test_efficiencies_are_valid_and_spec_loads(cal, tmp_path):
    mapping = cal.to_mapping()
    for dtype, kinds in mapping["efficiency"]["dtypes"].items():
        for kind, terms in kinds.items():
            KindTerms.parse(terms, f"{dtype}.{kind}")  # every efficiency in (0, 1], overhead >= 0
    path = write_yaml(mapping, tmp_path / "dev.yaml")
    spec = load_hardware(str(path))
    assert spec.name == "local" and spec.memory_bandwidth_gbps > 0 and set(spec.peak_tflops) == {"fp32", "bf16"}
    tm = time_model_for(spec, "calibrated", "fp32")
    assert tm.name == "calibrated" and tm.terms("matmul").overhead_s > 0
    assert spec.calibration["datasheet"] is None and spec.calibration["threads"] >= 1


def test_local_is_read_from_the_cache_dir(cal, tmp_path, monkeypatch):
    monkeypatch.delenv("LLMPERF_CACHE_DIR", raising=False)  # then the XDG folder
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(SpecError, match="run `llmperf calibrate` first"):
        load_hardware("local")
    write_yaml(cal.to_mapping(), local_path())
    assert local_path() == tmp_path / "llmperf" / "local.yaml"
    assert load_hardware("local").efficiency["model"] == "calibrated"


@pytest.mark.parametrize("mutate, message", [
    (lambda text, m: "peak_tflops: [unclosed\n", "not valid YAML"),
    (lambda text, m: yaml.safe_dump({k: v for k, v in m.items() if k != "calibration"}), "not a calibration file"),
    (lambda text, m: yaml.safe_dump({**m, "calibration": {**m["calibration"], "tool": "other-tool"}}), "foreign"),
    (lambda text, m: yaml.safe_dump({**m, "calibration": {**m["calibration"], "schema_version": 99}}),
     "schema_version"),
    (lambda text, m: yaml.safe_dump({**m, "efficiency": {**m["efficiency"], "dtypes": {
        "fp32": {"matmul": {"e_compute": 3.0}}}}}), "in \\(0, 1\\]"),
    (lambda text, m: yaml.safe_dump({**m, "memory_bandwidth_gbps": -1}), "memory_bandwidth_gbps"),
])
def test_corrupt_or_foreign_calibration_is_named_and_refused(cal, fresh_cache, mutate, message):
    mapping = cal.to_mapping()
    path = local_path()
    write_yaml(mapping, path)
    path.write_text(mutate(path.read_text(), mapping))
    with pytest.raises(SpecError, match=message) as err:
        load_hardware("local")
    assert str(path) in str(err.value)
    with pytest.raises(SpecError, match=message):
        load_calibrated(path)


def test_fit_reproduces_a_synthetic_device():
    """A device with known peak, bandwidth, efficiencies and overhead: the fitted curves give back
    every calibration point and interpolate between them (memory-bound rows stay memory-bound)."""
    peak, bw, oh, K, N = 1e11, 1e10, 5e-6, 4096, 8192

    def truth(r):
        c, m = 2.0 * r * K * N, 4.0 * (K * N + r * K + r * N)
        return c, m, max(c / (peak * 0.6), m / (bw * 0.8)) + oh

    pts = [ComputePoint(op="matmul", dtype="fp32", rows=r, shape="", seconds=truth(r)[2], spread_s=0.0, n=1,
                        flops=truth(r)[0], bytes=truth(r)[1]) for r in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
    terms = KindTerms.parse(fit_curves(pts, peak, bw, oh), "fit")
    for r in (1, 3, 6, 24, 48, 100, 256, 1000):
        c, m, t = truth(r)
        pred = max(c / (peak * terms.e_compute(r)), m / (bw * terms.e_memory(r))) + oh
        assert pred == pytest.approx(t, rel=2e-3), r


def test_fit_is_on_the_typical_call_and_the_ceiling_on_the_fastest():
    """The efficiencies reproduce each point's median call (what a prediction is compared with), not
    its fastest one; a point without a median falls back to its fastest call (regression: fitting on
    the fastest call made every calibrated prediction optimistic by the run-to-run spread)."""
    peak, bw, K, N = 1e11, 1e10, 4096, 8192
    pts = []
    for r in (1, 4, 16, 64, 256):
        c, m = 2.0 * r * K * N, 4.0 * (K * N + r * K + r * N)
        fastest = max(c / peak, m / bw)  # the roofline itself
        pts.append(ComputePoint(op="matmul", dtype="fp32", rows=r, shape="", seconds=fastest, median_s=1.5 * fastest,
                                spread_s=0.0, n=5, flops=c, bytes=m))
    terms = KindTerms.parse(fit_curves(pts, peak, bw, 0.0), "fit")
    for p in pts:
        pred = max(p.flops / (peak * terms.e_compute(p.rows)), p.bytes / (bw * terms.e_memory(p.rows)))
        assert pred == pytest.approx(p.median_s, rel=2e-3), p.rows
    no_median = [ComputePoint(**{**p.__dict__, "median_s": 0.0}) for p in pts]
    terms0 = KindTerms.parse(fit_curves(no_median, peak, bw, 0.0), "fit")
    assert terms0.e_memory(1) == pytest.approx(1.0) and terms.e_memory(1) == pytest.approx(1 / 1.5, rel=1e-3)


def test_per_operator_overheads_from_the_tiny_model(cal, tmp_path):
    """Tiny settings still measure every engine operator's dispatch per backend (sdpa, naive; no Triton
    on CPU), named by the shared vocabulary, and write them (schema 2, mode add on CPU) so that the
    calibrated time model of each backend uses them."""
    from llmperf.analysis.timemodel import time_model_for
    from llmperf.analysis.vocabulary import OP_NAMES

    assert set(cal.op_overhead_s) == {"sdpa", "naive"}
    for backend, ops in cal.op_overhead_s.items():
        assert set(ops) <= set(OP_NAMES)
        assert {"attn_norm", "qkv_proj", "rope", "kv_write", "o_proj", "gate_up_proj", "down_proj",
                "lm_head"} <= set(ops)
        assert all(0 < v < 1 for v in ops.values()), ops  # seconds per call (a unit check, not a speed)
    assert "attention" in cal.op_overhead_s["sdpa"]
    assert {"attn_score", "attn_softmax", "attn_value"} <= set(cal.op_overhead_s["naive"])
    eff = cal.to_mapping()["efficiency"]
    # 7: its GEMMs by weight size, 8: one by one, 9: decode attention by group
    assert eff["schema_version"] == 9 and eff["overhead_mode"] == "add"
    # a CPU measures them warm too, for models whose weights fit the private caches
    assert set(cal.op_overhead_warm_s) == {"sdpa", "naive"} and eff["warm_below_bytes"] > 0
    path = write_yaml(cal.to_mapping(), tmp_path / "cal.yaml")
    hw = load_calibrated(path)
    tm = time_model_for(hw, "calibrated", "fp32", backend="naive")
    assert tm.op_overhead_s["attn_softmax"] == pytest.approx(cal.op_overhead_s["naive"]["attn_softmax"], rel=1e-3)
    assert cal.provenance()["op_overhead_model"]["hidden_size"] == 64


def test_overlap_mode_on_cuda_fits_device_time_without_subtracting_the_launch(cal):
    """On CUDA the micro-benchmark times are the device's own (events over back-to-back calls) and the
    overhead overlaps: the fit must not subtract it, and the block says `overlap`."""
    from dataclasses import replace as dc_replace

    gpu = dc_replace(cal, device={**cal.device, "kind": "cuda"})
    gpu.overhead_s = {**cal.overhead_s, "matmul": 1e-3}  # absurdly large: subtracting it would show
    eff = gpu.fit_terms()
    assert eff["overhead_mode"] == "overlap"
    fp32 = eff["dtypes"]["fp32"]["matmul"]
    cpu_fit = cal.fit_terms()["dtypes"]["fp32"]["matmul"]
    assert fp32["overhead_s"] == pytest.approx(1e-3)
    assert fp32["e_memory"][0][1] <= cpu_fit["e_memory"][0][1] + 1e-9  # t' = t: never a faster fit


def test_cuda_device_floors_are_written_as_schema_4_and_priced(cal):
    """On CUDA calibrate measures each vector kind's device floor (a CUDA graph's replay): the block
    becomes schema 4 with `floor_s` per kind, and the calibrated time model takes it as the floor."""
    from dataclasses import replace as dc_replace

    from llmperf.analysis.roofline import OpCost
    from llmperf.analysis.timemodel import parse_efficiency

    gpu = dc_replace(cal, device={**cal.device, "kind": "cuda"}, floor_s={"norm": 5e-6, "elementwise": 1.5e-6})
    eff = gpu.fit_terms()
    assert eff["schema_version"] == 4
    fp32 = eff["dtypes"]["fp32"]
    assert fp32["norm"]["floor_s"] == pytest.approx(5e-6) and fp32["elementwise"]["floor_s"] == pytest.approx(1.5e-6)
    assert "floor_s" not in fp32["embedding"]
    parsed = parse_efficiency(eff, "local")
    assert parsed["dtypes"]["fp32"]["norm"].floor_s == pytest.approx(5e-6)
    assert gpu.provenance()["floor_s"] == {"norm": 5e-6, "elementwise": 1.5e-6}
    assert "floor_s" not in cal.fit_terms()["dtypes"]["fp32"]["norm"]  # a CPU calibration measures none
    tiny = OpCost(name="attn_norm", kind="norm", act_read_bytes=8.0, rows=1)
    from llmperf.analysis.timemodel import _from_parsed

    tm = _from_parsed("calibrated", parsed, "fp32", "local", "sdpa")
    assert tm.floor_for(tiny) == pytest.approx(5e-6)


def test_cuda_gemm_shapes_fit_the_shape_model_against_the_measured_ceilings(cal):
    """On CUDA calibrate times GEMMs over real shapes and fits the shape model's terms against its own
    ceilings: points made by the model itself give back its terms, the block is schema 5 with `gemm`,
    and the calibrated time model prices a shaped GEMM with them."""
    from dataclasses import replace as dc_replace

    from llmperf.analysis.gemm import GemmParams, GemmShape, gemm_time_s
    from llmperf.analysis.roofline import OpCost
    from llmperf.analysis.timemodel import _from_parsed, parse_efficiency
    from llmperf.measure.calibrate import GEMM_SHAPE_NK, GEMM_SHAPE_ROWS, fit_gemm_shapes

    # no host dispatch: this CPU's measured figures (38 us for the tiny model's o_proj on an AVX2-only one)
    # would exceed the device time the test compares
    gpu = dc_replace(cal, device={**cal.device, "kind": "cuda", "sms": 132}, floor_s={"norm": 5e-6}, overhead_s={},
                     op_overhead_s={}, op_overhead_rows_s={})
    truth = GemmParams(e_peak=0.8, e_memory=0.85, latency_s=5e-6, feed_flop_per_byte=40.0)
    peak, bw = 800e12, 3.0e12  # a GPU's ceilings (the fixture measured a CPU's)
    gpu.peak_flops_per_s, gpu.memory_bytes_per_s = (lambda d: peak), (lambda: bw)
    gpu.gemm_shapes = [("bf16", m, n, k, float(gemm_time_s(m, n, k, peak_flops_per_s=peak, bandwidth_bytes_per_s=bw,
                                                           num_sms=132, params=truth)))
                       for n, k in GEMM_SHAPE_NK for m in GEMM_SHAPE_ROWS]
    gpu.gemm = fit_gemm_shapes(gpu)
    for f in ("e_peak", "e_memory"):
        assert gpu.gemm[f] == pytest.approx(getattr(truth, f), rel=0.1)
    eff = gpu.fit_terms()
    assert eff["schema_version"] == 5 and eff["gemm"]["e_peak"] == gpu.gemm["e_peak"]
    parsed = parse_efficiency(eff, "local")
    tm = _from_parsed("calibrated", parsed, "bf16", "local", "sdpa")
    assert tm.gemm is not None
    hw = gpu.to_spec()
    gemv = OpCost(name="o_proj", kind="matmul", flops=2.0 * 4096 * 4096, weight_bytes=2.0 * 4096 * 4096, rows=1,
                  gemm=GemmShape(n=4096, k=4096))
    want = gemm_time_s(1, 4096, 4096, peak_flops_per_s=hw.peak_flops_per_s("bf16"),
                       bandwidth_bytes_per_s=hw.mem_bandwidth_bytes_per_s, num_sms=hw.num_sms, params=truth)
    assert float(tm.op_time_s(gemv, hw, "bf16", 1)) == pytest.approx(float(want), rel=0.15)
    assert fit_gemm_shapes(cal) is None  # a CPU calibration times no shapes


def test_cuda_attention_shapes_fit_the_attention_model_against_the_measured_ceilings(cal):
    """On CUDA calibrate times SDPA over shapes and fits the fused-attention model's terms against its
    own ceilings: points made by the model itself give back its memory terms, the block is schema 5
    with `attention_eff`, and the calibrated time model prices a shaped attention with it."""
    from dataclasses import replace as dc_replace

    from llmperf.analysis.attention_eff import AttentionEfficiency, AttnShape
    from llmperf.analysis.timemodel import _from_parsed, parse_efficiency
    from llmperf.measure.calibrate import fit_attention_shapes
    from llmperf.measure.fit_attention import sweep_frame

    gpu = dc_replace(cal, device={**cal.device, "kind": "cuda", "sms": 132})
    peak, bw = 800e12, 3.0e12
    gpu.peak_flops_per_s, gpu.memory_bytes_per_s = (lambda d: peak), (lambda: bw)
    truth = AttentionEfficiency(e_compute=0.8, head_dim_half=40.0, mma_rows=64.0, cta_half=0.5, e_memory=0.9,
                                kv_half=0.03, latency_s=1.2e-5, wave_s=1e-7)
    rows = [dict(phase=ph, batch=b, q_len=c if ph == "prefill" else 1, context=c, heads=32, kv_heads=kv, head_dim=hd,
                 dtype="bf16", impl="sdpa", time_s=1.0)
            for hd in (64, 128) for kv in (32, 8)
            for ph, b, c in [("prefill", 1, c) for c in (512, 2048, 8192)]
            + [("decode", b, c) for b in (1, 8, 64) for c in (512, 4096, 32768)]]
    df = sweep_frame(__import__("pandas").DataFrame(rows))
    shape = AttnShape(batch=df["batch"].to_numpy(), q_len=df["q_len"].to_numpy(), context=df["context"].to_numpy(),
                      heads=df["heads"].to_numpy(), kv_heads=df["kv_heads"].to_numpy(),
                      head_dim=df["head_dim"].to_numpy())
    times = truth.time_s(df["flops"].to_numpy(), df["bytes"].to_numpy(), shape, peak, bw, 132)
    gpu.attention_shapes = [dict(r, time_s=float(t)) for r, t in zip(rows, times)]
    gpu.attention_eff = fit_attention_shapes(gpu)
    assert gpu.attention_eff["e_memory"] == pytest.approx(truth.e_memory, rel=0.15)
    assert gpu.attention_eff["latency_s"] == pytest.approx(truth.latency_s, rel=0.3)
    eff = gpu.fit_terms()
    assert eff["schema_version"] == 5 and "calibrate" in eff["attention_eff"]["default"]["source"]
    tm = _from_parsed("calibrated", parse_efficiency(eff, "local"), "bf16", "local", "sdpa")
    assert tm.attention_eff is not None and tm.attention_eff.e_memory == gpu.attention_eff["e_memory"]
    assert fit_attention_shapes(cal) is None  # a CPU calibration times no shapes


def test_a_schema_1_calibration_file_still_loads(cal, tmp_path):
    """Calibrations written before per-operator overheads (efficiency schema 1) load and fall back to
    the per-kind overheads, added to the device time as before."""
    from llmperf.analysis.timemodel import time_model_for

    mapping = cal.to_mapping()
    newer = ("op_overhead_s", "overhead_mode", "op_overhead_warm_s", "warm_below_bytes", "op_e_memory",
             "op_overhead_rows_s", "gemm_e_memory", "op_overhead_rows_by_op_s", "one_call", "op_overhead_rows_expert_s",
             "decode_attention")
    eff = {k: v for k, v in mapping["efficiency"].items() if k not in newer}
    path = write_yaml({**mapping, "efficiency": {**eff, "schema_version": 1}}, tmp_path / "old.yaml")
    tm = time_model_for(load_calibrated(path), "calibrated", "fp32", backend="sdpa")
    assert tm.op_overhead_s == {} and tm.overhead_mode == "add"
    assert tm.terms("norm").overhead_s == pytest.approx(cal.overhead_s["norm"], rel=1e-3)


def test_a_decode_attention_point_is_memory_bound_however_slow():
    """Regression: a batch-4 decode over a KV cache larger than the last-level cache streamed slower
    than the batch-1 one (which the cache partly held), so the fit called it compute-bound and gave
    attention at 4 rows an e_compute of 0.03; every decode attention was then priced by its FLOPs.
    Marked memory-bound, its slowness goes to e_memory and e_compute comes from the prefill points."""
    peak, bw, H, D = 1e11, 4e10, 16, 128

    def point(batch, q, kv, seconds, decode):
        c = 4.0 * batch * H * q * kv * D
        m = 4.0 * 2 * batch * H * kv * D + 2 * 4.0 * batch * H * q * D
        return ComputePoint(op="attention", dtype="fp32", rows=batch * q, shape="", seconds=seconds, median_s=seconds,
                            spread_s=0.0, n=5, flops=c, bytes=m, memory_bound=decode)

    b1 = point(1, 1, 4096, 67.2e6 / (0.7 * bw), True)  # 70% of the roof
    b4 = point(4, 1, 4096, 4 * 67.2e6 / (0.5 * bw), True)  # DRAM: 50% of the roof
    pre = point(1, 1024, 1024, 4.0 * 16 * 1024 * 1024 * 128 / (0.3 * peak), False)
    terms = KindTerms.parse(fit_curves([b1, b4, pre], peak, bw, 0.0), "fit")
    assert terms.e_memory(4) == pytest.approx(0.5, rel=0.02)
    assert terms.e_compute(4) == pytest.approx(0.3, rel=0.02)  # the prefill's, not flops / (peak t)
    unmarked = [ComputePoint(**{**p.__dict__, "memory_bound": False}) for p in (b1, b4, pre)]
    old = KindTerms.parse(fit_curves(unmarked, peak, bw, 0.0), "fit")
    assert old.e_compute(4) < 0.15  # the old misfit: FLOPs / (peak t)


def test_the_working_set_fills_twice_the_largest_cache(monkeypatch):
    """On CPU a micro-benchmark's big operand cycles through copies filling twice the largest cache
    (at least 512 MiB, at most an eighth of memory); set explicitly it is taken as is; 0 on CUDA."""
    import llmperf.measure.device as dev
    from llmperf.measure.calibrate import WORKING_SET_MIN, _in_turn, copies_for, working_set_for

    monkeypatch.setattr(dev, "cpu_caches", lambda: {"L1d": 48 << 10, "L2": 2 << 20, "L3": 480 << 20})
    monkeypatch.setattr(dev, "_total_memory_bytes", lambda: 24 << 30)
    assert working_set_for(Settings(), "cpu") == 960 << 20
    monkeypatch.setattr(dev, "cpu_caches", lambda: {"L2": 1 << 20})
    assert working_set_for(Settings(), "cpu") == WORKING_SET_MIN
    monkeypatch.setattr(dev, "_total_memory_bytes", lambda: 2 << 30)
    assert working_set_for(Settings(), "cpu") == 256 << 20
    assert working_set_for(Settings(working_set_bytes=123), "cpu") == 123
    assert working_set_for(Settings(), "cuda") == 0
    assert copies_for(67 << 20, 960 << 20) == 15 and copies_for(1 << 30, 960 << 20) == 1
    assert copies_for(1, 1 << 30) == 64 and copies_for(0, 1 << 30) == 1
    calls = []
    fn = _in_turn([lambda i=i: calls.append(i) for i in range(3)])
    for _ in range(7):
        fn()
    assert calls == [0, 1, 2, 0, 1, 2, 0]


def test_gemm_and_decode_attention_cycle_through_their_copies():
    """With a working set, each GEMM and decode-attention point names how many copies it used, and
    the decode points are marked memory-bound (the prefill ones are not)."""
    import torch

    from llmperf.measure.calibrate import gemm_sweep_rows, measure_attention, measure_gemm

    s = Settings.tiny(dtypes=("fp32",), gemm_rows=(1, 8), working_set_bytes=4 << 20, threads=1)
    gemm, _ = measure_gemm(s, torch.device("cpu"), lambda m: None)
    # 1 and 8, and both sides of an edge between the engine's GEMM paths below 8 (1, 2 on torch's alone)
    assert [p.rows for p in gemm] == list(gemm_sweep_rows(s, "fp32", torch.device("cpu")))
    assert {1, 8} <= {p.rows for p in gemm} and all(" x8 in turn" in p.shape for p in gemm)  # 512 KiB each
    att = measure_attention(s, torch.device("cpu"), lambda m: None)
    # decode at the settings' group, then again at each of `attn_decode_groups` over the same copies
    assert [(p.memory_bound, p.group) for p in att] == [(True, 2), (True, 1), (False, 2)]
    assert "in turn" in att[0].shape and "in turn" in att[1].shape and "in turn" not in att[2].shape
    assert att[0].bytes == pytest.approx(att[1].bytes, rel=0.01) and att[0].flops == 2 * att[1].flops


def test_the_gemm_ceilings_are_timed_in_plain_torch_not_through_the_engine(monkeypatch):
    """Where the engine's GEMM is its own (a CPU in fp32 or bf16), the ceilings are `F.linear` calls:
    the GEMV through the sweep's cold copies and the sweep's largest rows; the engine's GEMM is never
    called. Where the engine's GEMM is plain torch (fp16 here), nothing more is timed and a note says
    the sweep is the ceiling."""
    import torch

    from llmperf.engine.cpu.ops import CpuOps
    from llmperf.measure.calibrate import measure_torch_gemm

    def engine_linear(*args, **kwargs):
        raise AssertionError("a ceiling went through the engine's GEMM")

    plain_calls = []
    real_linear = torch.nn.functional.linear

    def counted(*args, **kwargs):
        plain_calls.append(args[0].shape[0])
        return real_linear(*args, **kwargs)

    monkeypatch.setattr(CpuOps, "linear", engine_linear)
    monkeypatch.setattr(torch.nn.functional, "linear", counted)
    s = Settings.tiny(dtypes=("fp32", "fp16"), working_set_bytes=2 << 20, threads=1)
    sweep = [ComputePoint(op="matmul", dtype=d, rows=r, shape="", seconds=1e-3, spread_s=0.0, n=1, flops=1.0,
                          bytes=1.0) for d in ("fp32", "fp16") for r in (1, 8, 64)]
    pts, notes = measure_torch_gemm(s, torch.device("cpu"), lambda m: None, sweep)
    assert [(p.dtype, p.rows) for p in pts] == [("fp32", 1), ("fp32", 64)]
    assert "plain torch x4 in turn" in pts[0].shape and "in turn" not in pts[1].shape  # 512 KiB a copy
    assert {1, 64} <= set(plain_calls)
    assert all(p.seconds > 0 and p.flops == 2.0 * p.rows * s.gemm_k * s.gemm_n for p in pts)
    assert any(n.startswith("ceilings fp16: the engine's GEMM on cpu is plain torch's") for n in notes)


def _matmul(dtype, rows, gflops, gbps=None):
    flops, nbytes = 2.0 * rows * 4096 * 4096, 4.0 * 4096 * 4096
    seconds = max(flops / (gflops * 1e9), nbytes / (gbps * 1e9) if gbps else 0.0)
    return ComputePoint(op="matmul", dtype=dtype, rows=rows, shape="", seconds=seconds, spread_s=0.0, n=1,
                        flops=flops, bytes=nbytes)


def test_the_peak_is_the_better_of_plain_torch_and_the_engine():
    """An engine faster than plain torch (llmperf's CPU GEMV) sets the peak, so its efficiencies stay
    <= 1 and the roofline stays a bound; a plain torch faster than the engine sets it instead; a dtype
    whose engine GEMM is plain torch takes its sweep as the ceiling. The YAML says which set each."""
    from llmperf.measure.calibrate import Calibration

    cal = Calibration(device={"kind": "cpu", "name": "test"}, versions={}, created="now",
                      settings=Settings.tiny(dtypes=("fp32", "bf16", "fp16")),
                      compute=[_matmul("fp32", 1, 30, 60), _matmul("fp32", 256, 480),
                               _matmul("bf16", 1, 30, 40), _matmul("bf16", 256, 500),
                               _matmul("fp16", 1, 5, 10), _matmul("fp16", 256, 50)],
                      torch_gemm=[_matmul("fp32", 1, 20, 25), _matmul("fp32", 256, 220),
                                  _matmul("bf16", 1, 30, 40), _matmul("bf16", 256, 900)],
                      plain_torch_dtypes=["fp16"])
    assert cal.peak_flops_per_s("fp32") == pytest.approx(480e9) and cal.peak_flops_per_s("bf16") == pytest.approx(900e9)
    assert cal.peak_flops_per_s("fp16") == pytest.approx(cal.torch_peak_flops_per_s("fp16"))
    assert cal.gemv_bytes_per_s("fp32") == pytest.approx(60e9)
    assert cal.gemv_bytes_per_s("fp32", plain=True) == pytest.approx(25e9)
    ceilings = cal.device_ceilings()
    assert ceilings["fp32"]["peak_set_by"] == "engine" and ceilings["bf16"]["peak_set_by"] == "plain torch"
    assert ceilings["fp32"]["plain_torch"] == {"peak_tflops": 0.22, "gemv_gbps": 25.0}
    assert ceilings["fp16"]["plain_torch"] == ceilings["fp16"]["engine"]


def test_a_cpu_calibration_records_plain_torch_ceilings_beside_the_engines(cal, tmp_path):
    """The real (tiny) calibration: plain torch's GEMV and largest GEMM per dtype the engine runs itself,
    in the YAML's provenance with the engine's beside them; the spec's peak is the better of the two and
    every fitted efficiency stays in (0, 1]."""
    assert {(p.dtype, p.rows) for p in cal.torch_gemm} <= {(d, r) for d in ("fp32", "bf16") for r in (1, 64)}
    assert ("fp32", 1) in {(p.dtype, p.rows) for p in cal.torch_gemm}
    path = tmp_path / "local.yaml"
    write_yaml(cal.to_mapping(), path)
    doc = yaml.safe_load(path.read_text())
    gemm = doc["calibration"]["ceilings"]["gemm"]
    for d in cal.measured_dtypes():
        assert doc["peak_tflops"][d] == pytest.approx(max(gemm[d]["plain_torch"]["peak_tflops"],
                                                          gemm[d]["engine"]["peak_tflops"]), rel=1e-3)
        assert gemm[d]["peak_set_by"] in ("plain torch", "engine")
    assert all("plain torch" in row["shape"] for row in doc["calibration"]["torch_gemm"])
    for kinds in doc["efficiency"]["dtypes"].values():
        for curve in (kinds["matmul"]["e_compute"], kinds["matmul"]["e_memory"]):
            assert all(0 < e <= 1 for _, e in curve)


def test_vector_operator_efficiency_is_fitted_per_byte_count():
    """`e = bytes / (bw (t - overhead))`; a call its dispatch explains gets 1; repeated byte counts keep
    the best point; the tiny calibration writes curves the time model reads back for its dtype."""
    from llmperf.measure.calibrate import fit_op_e_memory

    bw = 1e10
    samples = [(1e6, 1e-4 + 1e6 / (0.5 * bw)), (1e8, 1e-4 + 1e8 / (0.1 * bw)), (1e8, 1e-4 + 1e8 / (0.2 * bw)),
               (1e3, 5e-5)]
    fit = fit_op_e_memory({"act": samples}, bw, {"act": 1e-4})
    assert fit["act"][0] == [1000, 1.0]  # faster than its overhead: the dispatch explains it
    assert fit["act"][1][0] == 1_000_000 and fit["act"][1][1] == pytest.approx(0.5)
    assert fit["act"][2][0] == 100_000_000 and fit["act"][2][1] == pytest.approx(0.2)


def test_calibration_writes_vector_operator_curves(cal):
    terms = cal.fit_terms()
    assert terms["schema_version"] == 9 and set(terms["op_e_memory"]) == {"fp32", "bf16"}
    assert {"attn_norm", "qk_norm", "rope", "act", "mlp_residual"} <= set(terms["op_e_memory"]["fp32"])
    tm = time_model_for(cal.to_spec(), "calibrated", "bf16")
    assert tm.op_e_memory and all(0 < v <= 1 for c in tm.op_e_memory.values() for _, v in c.points)
    assert cal.provenance()["op_e_memory_model"]["prefills"] == [[1, 8], [2, 32]]


def test_cpu_calibration_measures_dispatch_per_dtype_and_rows(cal):
    """On CPU the cold per-operator dispatch is measured per compute dtype at 1 and 2 rows, the weight
    GEMMs also on both sides of each edge between the engine's GEMM paths (its own kernel, oneDNN's
    packed GEMM dispatch differently), and written so each dtype's time model uses its own."""
    import torch

    from llmperf.engine.cpu import kernels as cpu_kernels
    from llmperf.measure.calibrate import gemm_dispatch_rows

    terms = cal.fit_terms()
    table = terms["op_overhead_rows_s"]
    assert set(table) == {"fp32", "bf16"} and set(table["fp32"]) == {"sdpa", "naive"}
    bf16 = [1, 2, 3, 16, 17] if cpu_kernels.amx_available() else [1, 2, 4, 5]  # AMX from 3 rows to 16
    edges = ({"fp32": [1, 2, 8, 9], "bf16": bf16} if cpu_kernels.available()
             else {"fp32": [1, 2], "bf16": [1, 2]})
    for dtype in table:
        assert list(gemm_dispatch_rows(dtype, torch.device("cpu"))) == edges[dtype]
        ops = table[dtype]["sdpa"]
        assert {"qkv_proj", "o_proj", "gate_up_proj", "down_proj", "attn_norm"} <= set(ops)
        for op, pts in ops.items():
            rows = edges[dtype] if op in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head") else [1, 2]
            assert [r for r, _ in pts] == rows and all(0 < v < 1 for _, v in pts), (dtype, op)
    assert table["fp32"]["sdpa"]["qkv_proj"][0][1] == pytest.approx(cal.op_overhead_s["sdpa"]["qkv_proj"], rel=1e-3)
    tm = time_model_for(cal.to_spec(), "calibrated", "bf16")
    assert tm.op_overhead_rows and tm.backend == "sdpa"


def test_operators_without_weights_take_their_dispatch_in_situ(cal):
    """On CPU the weight GEMMs keep the tiny model's cold dispatch (a GEMV before each), every other
    operator takes the one measured in a real layer's decode (`dispatch_spec`), and the per-operator
    fallback is the fp32 one-row column of that same table."""
    from llmperf.analysis.timemodel import time_model_for
    from llmperf.measure.calibrate import MOE_DISPATCH_OPS, dispatch_moe_spec, dispatch_spec, in_situ

    cold = {"sdpa": {"qkv_proj": 1e-4, "lm_head": 2e-4, "rope": 9e-5, "attn_norm": 8e-5}}
    situ = {"sdpa": {"qkv_proj": 5e-3, "rope": 4e-5}}  # a GEMM's in-situ time is its weight stream
    assert in_situ(cold, situ) == {"sdpa": {"qkv_proj": 1e-4, "lm_head": 2e-4, "rope": 4e-5, "attn_norm": 8e-5}}
    assert in_situ(cold, {}) == cold
    # a MoE layer's own operators, which the tiny model never ran, come in from the in-situ run alone
    moe = {"sdpa": {"moe_route": 2e-4, "moe_sum": 3e-5, "router": 7e-5}}
    assert in_situ(cold, moe)["sdpa"] == {**cold["sdpa"], "moe_route": 2e-4, "moe_sum": 3e-5}
    spec = dispatch_spec(2048)  # Llama 3.2 1B's layer shapes
    assert (spec["num_heads"], spec["num_kv_heads"], spec["ffn_size"], spec["num_layers"]) == (32, 8, 8192, 2)
    moe_spec = dispatch_moe_spec(2048)
    assert (moe_spec["num_experts"], moe_spec["experts_per_token"], moe_spec["moe_ffn_size"]) == (8, 2, 512)
    prov = cal.provenance()["op_overhead_model"]
    assert prov["in_situ"]["hidden_size"] == cal.settings.dispatch_hidden == 128
    assert prov["in_situ"]["moe"]["ops"] == "moe_route, moe_sum"
    for dtype, table in cal.op_overhead_rows_s.items():  # measured in situ at one and two rows, priced by them
        for backend, ops in table.items():
            for op in MOE_DISPATCH_OPS:
                assert [r for r, _ in ops[op]] == [1, 2] and ops[op][0][1] > 0, (dtype, backend, op)
    tm = time_model_for(cal.to_spec(), "calibrated", "fp32")
    assert {"moe_route", "moe_sum"} <= set(tm.op_overhead_rows)
    for backend, ops in cal.op_overhead_rows_s["fp32"].items():
        assert cal.op_overhead_s[backend] == {op: pts[0][1] for op, pts in ops.items()}


def test_a_cpu_calibration_times_the_operators_one_by_one_beside_the_one_call(cal):
    """Schema 8: beside the rows table (a Llama-shaped decode, in one call where the kernels run), every
    operator that reads no weights timed in `dispatch_by_op_spec`'s decode with each operator called
    from Python (its QK norm, sandwich norms and embedding scale too), at one and two rows per dtype
    and backend; `one_call` says where this machine's engine runs the one call; the provenance names
    the model, which does not run in one call."""
    import torch

    from llmperf.engine.cpu import kernels as cpu_kernels
    from llmperf.measure.calibrate import OVERHEAD_ROWS, WEIGHT_OPS, dispatch_by_op_spec
    from llmperf.specs import ModelSpec

    eff = cal.to_mapping()["efficiency"]
    assert eff["schema_version"] == 9  # 8 with the operators one by one, 9 with decode attention by group
    by_op = eff["op_overhead_rows_by_op_s"]
    assert set(by_op) == {"fp32", "bf16"}
    for dtype, backends in by_op.items():
        assert set(backends) == {"sdpa", "naive"}
        for backend, ops in backends.items():
            assert {"attn_norm", "qk_norm", "rope", "kv_write", "act", "post_attn_norm", "post_mlp_norm",
                    "embed_scale", "mlp_residual"} <= set(ops), (dtype, backend)
            assert not set(ops) & WEIGHT_OPS
            assert all([r for r, _ in pts] == list(OVERHEAD_ROWS) and all(0 < v < 1 for _, v in pts)
                       for pts in ops.values())
    on = cpu_kernels.available()
    assert eff["one_call"] == {"max_head_dim": cpu_kernels.MAX_HEAD_DIM if on else 0,
                               "rows": {"fp32": cpu_kernels.rows_for(torch.float32) if on else 0,
                                        "bf16": cpu_kernels.rows_for(torch.bfloat16) if on else 0}}
    prov = cal.provenance()["op_overhead_model"]["in_situ"]["by_op"]
    assert prov["name"] == "calibrate-dispatch-by-op" and prov["hidden_size"] == cal.settings.dispatch_hidden
    assert not ModelSpec(**dispatch_by_op_spec(2048)).one_call_layers
    tm = time_model_for(cal.to_spec(), "calibrated", "fp32")
    assert tm.op_overhead_rows_by_op and tm.one_call_rows == eff["one_call"]["rows"]["fp32"]
    # a routed expert's activation, from the in-situ MoE model's decode (one call each)
    experts = eff["op_overhead_rows_expert_s"]
    assert {d: {b: sorted(ops) for b, ops in t.items()} for d, t in experts.items()} == {
        d: {"sdpa": ["act"], "naive": ["act"]} for d in ("fp32", "bf16")}
    assert all([r for r, _ in pts] == list(OVERHEAD_ROWS) and all(0 < v < 1 for _, v in pts)
               for t in experts.values() for ops in t.values() for pts in ops.values())
    assert set(tm.op_overhead_rows_expert) == {"act"}


def test_in_situ_dispatch_can_be_switched_off():
    """`dispatch_hidden=0`: every operator keeps the cold tiny-model figure, and the provenance says
    no in-situ model was run."""
    c = calibrate(Settings.tiny(dtypes=("fp32",), stream_sizes=(256 * 1024,), gemm_rows=(1, 8), vector_prefills=(),
                                dispatch_hidden=0, threads=1))
    assert c.provenance()["op_overhead_model"]["in_situ"] is None
    assert set(c.op_overhead_rows_s["fp32"]) == {"sdpa", "naive"}
    assert c.op_overhead_rows_by_op_s == {} and "one_call" not in c.fit_terms()


def test_a_disturbed_point_is_timed_again(monkeypatch):
    """A point whose median call is over 1.5x its fastest is timed again (at most twice) and the
    steadiest timing kept; a steady one is timed once."""
    import llmperf.measure.calibrate.ceilings as calmod
    from llmperf.measure.timers import Timing

    def fake(timings):
        it = iter(timings)
        monkeypatch.setattr(calmod, "time_fn", lambda *a, **k: next(it))

    notes: list[str] = []
    fake([Timing(median_s=2.0, spread_s=1.0, n=5, min_s=1.0), Timing(median_s=1.1, spread_s=0.1, n=5, min_s=1.0)])
    t = calmod._time_steady(lambda: None, "cpu", reps=5, warmup=1, notes=notes, what="gemm fp32 rows=4")
    assert t.median_s == 1.1 and len(notes) == 1 and "gemm fp32 rows=4: timed again" in notes[0]
    notes.clear()
    fake([Timing(median_s=1.2, spread_s=0.1, n=5, min_s=1.0)])
    assert calmod._time_steady(lambda: None, "cpu", reps=5, warmup=1, notes=notes, what="x").median_s == 1.2
    assert notes == []
    disturbed = [Timing(median_s=3.0, spread_s=1.0, n=5, min_s=1.0), Timing(median_s=2.0, spread_s=1.0, n=5, min_s=1.0),
                 Timing(median_s=4.0, spread_s=1.0, n=5, min_s=1.0)]
    fake(disturbed)
    assert calmod._time_steady(lambda: None, "cpu", reps=5, warmup=1, notes=notes, what="x").median_s == 2.0
    assert len(notes) == 2  # RETRIES, then it gives up with the steadiest


def test_rounds_pool_into_one_point():
    """Interleaved rounds of one GEMM pool into one timing: median of the medians, fastest call,
    widest spread, every call counted."""
    from llmperf.measure.timers import Timing
    from llmperf.measure.timers import pooled as _pooled

    ts = [Timing(median_s=m, spread_s=s, n=5, threads=2, min_s=lo) for m, s, lo in
          ((5.0, 0.1, 4.8), (6.0, 0.3, 4.7), (5.5, 0.2, 5.0))]
    t = _pooled(ts)
    assert (t.median_s, t.spread_s, t.n, t.threads, t.min_s) == (5.5, 0.3, 15, 2, 4.7)
    assert _pooled(ts[:1]) is ts[0]


def test_memory_bound_gemm_points_are_timed_in_rounds(cal):
    """On CPU every fast (memory-bound) GEMM point is the pool of `gemm_rounds` rounds."""
    for p in cal.compute:
        if p.op == "matmul" and p.typical_s < 0.02:
            assert p.n >= cal.settings.gemm_rounds * cal.settings.reps, p


@pytest.mark.parametrize("changes, message", [
    (dict(attn_heads=16, attn_group=3), r"attn_group: must divide attn_heads=16, got 3"),
    (dict(attn_group=0), r"attn_group: must divide attn_heads=16, got 0"),
    (dict(dispatch_hidden=100), r"dispatch_hidden: must be 0 or a multiple of 64 \(heads of 64\), got 100"),
    (dict(dispatch_hidden=-64), r"dispatch_hidden: must be 0 or a multiple of 64"),
    (dict(gemm_rounds=0), r"gemm_rounds: must be >= 1, got 0"),
])
def test_settings_that_cannot_be_measured_are_refused_up_front(changes, message):
    with pytest.raises(ValueError, match=message):
        Settings(**changes)


def test_a_dispatch_model_that_cannot_be_built_keeps_the_cold_figures(monkeypatch):
    """If the in-situ model cannot be built (memory, a dtype this build lacks), the calibration still
    completes: every operator keeps the cold tiny-model figure and the notes say why; if only the one
    with experts cannot, the dense model's figures stand and the MoE operators keep the per-kind ones."""
    import llmperf.engine as engine

    real = engine.build_model

    def calibrate_without(model: str, why: str):  # noqa: ANN202
        def build(spec, *a, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
            if spec.name == model:
                raise MemoryError(why)
            return real(spec, *a, **kw)

        monkeypatch.setattr(engine, "build_model", build)
        return calibrate(Settings.tiny(dtypes=("fp32",), stream_sizes=(256 * 1024,), gemm_rows=(1, 8),
                                       vector_prefills=(), threads=1))

    c = calibrate_without("calibrate-dispatch", "no room for the dispatch model")
    assert any("in-situ dispatch fp32 (calibrate-dispatch): not measured (MemoryError: no room for the dispatch "
               "model); every operator keeps the cold figure" in n for n in c.notes)
    assert set(c.op_overhead_rows_s["fp32"]) == {"sdpa", "naive"}
    assert "moe_route" not in c.op_overhead_rows_s["fp32"]["sdpa"]  # not measured: the per-kind figure prices it
    c = calibrate_without("calibrate-dispatch-moe", "no room for the experts")
    assert any("in-situ dispatch fp32 (calibrate-dispatch-moe): not measured (MemoryError: no room for the experts); "
               "the per-kind figures price them" in n for n in c.notes)
    sdpa = c.op_overhead_rows_s["fp32"]["sdpa"]
    assert "moe_route" not in sdpa and "rope" in sdpa
    assert c.op_overhead_rows_expert_s == {}  # nor a routed expert's own
    c = calibrate_without("calibrate-dispatch-by-op", "no room for it")
    assert any("operators one by one fp32 (calibrate-dispatch-by-op): not measured (MemoryError: no room for it); "
               "the rows table prices every model" in n for n in c.notes)
    assert c.op_overhead_rows_by_op_s == {} and {"op_overhead_rows_by_op_s", "one_call"}.isdisjoint(c.fit_terms())


def test_the_gemm_sweep_steps_where_the_engine_changes_kernel():
    """The efficiency curve gets both sides of each edge between the engine's GEMM paths, so the rows
    between two sweep points are not priced as a blend of two kernels."""
    import torch

    from llmperf.engine.cpu import kernels as cpu_kernels
    from llmperf.measure.calibrate import gemm_sweep_rows

    cpu = torch.device("cpu")
    default = Settings()
    if cpu_kernels.available():
        assert gemm_sweep_rows(default, "fp32", cpu) == (1, 2, 4, 8, 9, 16, 32, 64, 128, 256, 512)
        if cpu_kernels.amx_available():  # VDPBF16PS to 2 rows, AMX 3-16, oneDNN from 17
            assert gemm_sweep_rows(default, "bf16", cpu) == (1, 2, 3, 4, 8, 16, 17, 32, 64, 128, 256, 512)
            assert gemm_sweep_rows(Settings.tiny(), "bf16", cpu) == (1, 2, 3, 8, 16, 17, 64)
        else:
            assert gemm_sweep_rows(default, "bf16", cpu) == (1, 2, 4, 5, 8, 16, 32, 64, 128, 256, 512)
            assert gemm_sweep_rows(Settings.tiny(), "bf16", cpu) == (1, 4, 5, 8, 64)
    else:
        assert gemm_sweep_rows(default, "fp32", cpu) == (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    assert gemm_sweep_rows(default, "fp16", cpu) == default.gemm_rows  # one path at every row count


def test_calibrate_times_the_engine_with_the_garbage_collector_paused_as_profile_does(monkeypatch):
    """The in-situ operator timings are what profile compares against: both run with the collector off."""
    import gc

    import torch

    from llmperf.engine import Engine
    from llmperf.measure.calibrate import measure_op_overheads, measure_step_overhead

    seen = []
    real = Engine.generate
    monkeypatch.setattr(Engine, "generate", lambda self, *a, **k: seen.append(
        (k.get("recorder") is not None, gc.isenabled())) or real(self, *a, **k))
    measure_op_overheads(Settings.tiny(), torch.device("cpu"), lambda _: None, cold=False)
    measure_step_overhead(torch.device("cpu"), lambda _: None)
    timed = [enabled for recorded, enabled in seen if recorded]
    assert timed and not any(timed) and gc.isenabled()


def _op(step, op, seconds, phase="decode"):
    from llmperf.engine.instrument import OpRecord
    return OpRecord(phase=phase, step=step, layer=0, op=op, seconds=seconds, batch=1, q_len=1, kv_len=4)


def _step(step, forward, phase="decode"):
    from llmperf.engine.instrument import StepRecord
    return StepRecord(phase=phase, step=step, batch=1, q_len=1, kv_len=4, tokens_in_cache=4, seconds=forward,
                      forward_seconds=forward)


def test_the_recorder_share_is_what_recording_adds_to_each_call_of_a_decode_step():
    """Three calls a step recorded at 30 + 20 + 10 us (prefill ignored); the unrecorded forward pass
    takes 45 us: each call carries 5 us of recording. Glue between operators that costs more than
    recording adds gives a negative share; no decode steps give none."""
    from llmperf.engine.instrument import Trace
    from llmperf.measure.calibrate.operators import recorder_share

    recorded = Trace(ops=[_op(0, "prefill_only", 1.0, "prefill")]
                     + [_op(i, op, t) for i in range(3) for op, t in (("a", 30e-6), ("b", 20e-6), ("c", 10e-6))])
    bare = Trace(steps=[_step(0, 1.0, "prefill")] + [_step(i, t) for i, t in enumerate((44e-6, 45e-6, 46e-6))])
    share, calls, summed, forward = recorder_share(recorded, bare)
    assert calls == 3 and summed == pytest.approx(60e-6) and forward == pytest.approx(45e-6)
    assert share == pytest.approx(5e-6)
    slow_glue = Trace(steps=[_step(0, 75e-6)])
    assert recorder_share(recorded, slow_glue)[0] == pytest.approx(-5e-6)
    assert recorder_share(recorded, Trace()) == (0.0, 0, 0.0, 0.0)
    assert recorder_share(Trace(), bare) == (0.0, 0, 0.0, 0.0)


def test_op_overheads_measured_against_an_unrecorded_run_move_by_the_recorder_share_and_say_so(monkeypatch):
    """What calibrate does on CUDA (forced here on the CPU): the same generation again unrecorded, each
    call's figure less the share, never below zero (a share of 1 s: every figure 0; of -1 s: every
    figure over 1 s), and a note naming the share and both times. Without `unrecorded` (a CPU's
    default) neither the figures nor the notes change."""
    import torch

    from llmperf.measure.calibrate import operators

    s, cpu = Settings.tiny(), torch.device("cpu")
    monkeypatch.setattr(operators, "op_overhead_backends", lambda device: ("sdpa",))
    for share, check in ((1.0, lambda v: v == 0.0), (-1.0, lambda v: v > 1.0)):
        monkeypatch.setattr(operators, "recorder_share", lambda recorded, bare, share=share: (share, 5, 1e-3, 0.99e-3))
        notes: list[str] = []
        figures = operators.measure_op_overheads(s, cpu, lambda _: None, cold=False, unrecorded=True, notes=notes)
        assert figures["sdpa"] and all(check(v) for v in figures["sdpa"].values())
        assert len(notes) == 1 and f"each call {share * 1e6:+.2f} us less, the recorder's share" in notes[0]
        assert "its 5 calls a decode step add up to 1.000 ms recorded" in notes[0] and "takes 0.990 ms" in notes[0]
    notes = []
    figures = operators.measure_op_overheads(s, cpu, lambda _: None, cold=False, notes=notes)
    assert not notes and all(0.0 < v < 1.0 for v in figures["sdpa"].values())


def test_the_recorder_share_is_the_median_of_interleaved_pairs_of_runs(monkeypatch):
    """One recorded and one unrecorded run read a moving host's drift as the recorder's share (the
    2026-11-27m H100: -7.9 to +24.6 us a call for one engine); calibrate interleaves `SHARE_PAIRS` of
    them and moves every figure by the median share (here -2 s of -1, -3, -2: every figure between 2 and
    3 s), naming each pair's share in its note; the recorded runs' calls pool into the figures."""
    import torch

    from llmperf.measure.calibrate import operators

    s, cpu = Settings.tiny(), torch.device("cpu")
    monkeypatch.setattr(operators, "op_overhead_backends", lambda device: ("sdpa",))
    shares = iter((-1.0, -3.0, -2.0))
    seen: list[tuple[object, object]] = []

    def fake_share(recorded, bare):
        seen.append((recorded, bare))
        return next(shares), 5, 1e-3, 0.99e-3

    monkeypatch.setattr(operators, "recorder_share", fake_share)
    notes: list[str] = []
    figures = operators.measure_op_overheads(s, cpu, lambda _: None, cold=False, unrecorded=True, notes=notes)
    assert operators.SHARE_PAIRS == 3 and len(seen) == 3
    assert len({id(r) for r, _ in seen}) == 3 and len({id(b) for _, b in seen}) == 3  # three distinct pairs
    assert figures["sdpa"] and all(2.0 < v < 3.0 for v in figures["sdpa"].values())
    assert len(notes) == 1 and "each call -2000000.00 us less" in notes[0]
    assert "median of 3 interleaved pairs of runs: -1000000.00, -3000000.00, -2000000.00 us" in notes[0]


def test_a_gpu_calibration_times_the_operators_of_todays_families_on_their_tiny_models(monkeypatch):
    """What calibrate runs on CUDA (here on the CPU): beside the Llama-shaped tiny model's figures, the
    operators only today's families run, each from its own tiny model's recorded decode (the router's
    choice and the experts' sum; the QK and sandwich norms and the embedding scale; MLA's projections,
    norms and absorptions), one figure per call and backend, nothing else; the tiny models differ from
    the Llama-shaped one only where their family does; a backend that cannot run one is noted and keeps
    the per-kind figures for its operators; the provenance names the models that gave figures."""
    from dataclasses import replace as dc_replace

    import torch

    from llmperf.measure.calibrate import FAMILY_DISPATCH, TINY_SPEC, measure_family_dispatch, operators

    for _what, spec, _keep in FAMILY_DISPATCH:  # each one Llama-shaped tiny model plus its family's fields
        assert all(spec.get(k) == v for k, v in TINY_SPEC.items() if k not in ("name", "num_kv_heads", "head_dim"))
    notes: list[str] = []
    figures = measure_family_dispatch(Settings.tiny(), torch.device("cpu"), lambda _: None, notes)
    assert set(figures) == {"sdpa", "naive"} and not notes
    decode_mla = {"q_a_proj", "q_a_norm", "q_b_proj", "kv_a_proj", "kv_a_norm", "q_absorb", "v_absorb"}
    for ops in figures.values():
        assert {"moe_route", "moe_sum", "qk_norm", "post_attn_norm", "post_mlp_norm", "embed_scale"} | decode_mla \
            <= set(ops) <= {op for _w, _s, keep in FAMILY_DISPATCH for op in keep}
        assert all(v > 0 for v in ops.values())
    monkeypatch.setattr(operators, "op_overhead_backends", lambda device: ("sdpa", "triton"))
    monkeypatch.setattr(operators, "measure_op_overheads", lambda *a, **k: {"sdpa": dict(figures["sdpa"], act=1.0)})
    assert measure_family_dispatch(Settings.tiny(), torch.device("cpu"), lambda _: None, notes) == {
        "sdpa": figures["sdpa"]}
    assert notes[0] == "MoE dispatch (moe_route, moe_sum) not measured for triton: the per-kind figures price them"
    assert len(notes) == len(FAMILY_DISPATCH) and all("not measured for triton" in n for n in notes)
    cal = calibrate(Settings.tiny(dtypes=("fp32",), stream_sizes=(256 * 1024,), gemm_rows=(1, 8), vector_prefills=(),
                                  dispatch_hidden=0, threads=1))
    gpu = dc_replace(cal, device={**cal.device, "kind": "cuda"}, op_overhead_s={"sdpa": figures["sdpa"]})
    names = [m["name"] for m in gpu.provenance()["op_overhead_model"]["families"]]
    assert names == ["calibrate-tiny-moe", "calibrate-tiny-norms", "calibrate-tiny-mla"]
    assert cal.provenance()["op_overhead_model"]["families"] is None  # a CPU times them in situ


@pytest.mark.parametrize("spent, nxt, budget, call, call_budget, fits", [
    (0.0, 5.0, 10.0, 0.1, 0.8, True), (6.0, 4.0, 10.0, 0.1, 0.8, True),  # exactly at the budget: measured
    (6.0, 4.1, 10.0, 0.1, 0.8, False), (0.0, 1.0, 10.0, 0.9, 0.8, False), (0.0, 0.0, 0.0, 0.0, 0.0, True)])
def test_a_sweep_measures_a_point_only_within_its_budget(spent, nxt, budget, call, call_budget, fits):
    from llmperf.measure.calibrate import sweep_fits

    assert sweep_fits(spent, nxt, budget, call, call_budget) is fits


def test_a_sweep_over_its_budget_stops_and_says_so_in_the_yaml(tmp_path):
    """A budget of 0 s: each sweep measures its first point (what sizes the rest), then stops before
    the next, and the calibration's notes (written to the YAML) name where and why."""
    import torch

    from llmperf.measure.calibrate import measure_gemm, measure_op_e_memory

    s = Settings.tiny(dtypes=("fp32",), gemm_sweep_budget_s=0.0, vector_budget_s=0.0, threads=1)
    assert Settings.tiny(emulated_budget_s=0.0).emulated_budget_s == 0.0
    gemm, notes = measure_gemm(s, torch.device("cpu"), lambda m: None)
    assert [p.rows for p in gemm] == [1]
    stops = [n for n in notes if "stopped" in n]  # (a busy machine may also add "timed again" notes)
    assert len(stops) == 1 and stops[0].startswith("gemm fp32: stopped before rows=")
    assert "of the sweep's 0 s" in stops[0]
    vec_notes: list[str] = []
    curves = measure_op_e_memory(s, torch.device("cpu"), lambda m: None, ["fp32"], 1e10, {}, vec_notes)
    assert curves["fp32"] and all(len(pts) == 1 for pts in curves["fp32"].values())  # the first prefill only
    assert len(vec_notes) == 1 and vec_notes[0].startswith("vector operators fp32: stopped before 2x32")


def test_a_cpu_calibration_writes_weight_gemm_curves_by_size_as_schema_7(cal, tmp_path):
    """The engine GEMMs timed at several weight sizes become `gemm_e_memory` (with the GEMM sweep's own
    shape at the same rows where the sizes' points were not probed: the prefill rows), each point read
    as its weight's stream: the file says schema 7 (9 with the operators one by one and decode attention
    by group, as here), and the
    calibrated model prices weight GEMMs by it."""
    from dataclasses import replace as dc_replace

    import torch

    from llmperf.analysis.timemodel import time_model_for
    from llmperf.measure.calibrate.cpu_gemm_sizes import gemm_size_rows_for

    s = cal.settings
    assert {p.dtype for _, p in cal.gemm_sizes} == set(cal.measured_dtypes())
    eff = cal.to_mapping()["efficiency"]
    assert eff["schema_version"] == 9 and eff["op_overhead_rows_by_op_s"]
    sweep_bytes = 4 * s.gemm_n * s.gemm_k
    # the decode rows swept: the settings' and each side of an edge between the engine's GEMM paths below
    # their largest (fp32 1, 2 where llmperf's kernels do not run, e.g. an AVX2-only CPU)
    decode_rows = {d: gemm_size_rows_for(s, d, torch.device("cpu")) for d in cal.measured_dtypes()}
    for rows, pts in eff["gemm_e_memory"]["fp32"].items():
        sizes = [b for b, _ in pts]
        assert sizes == sorted(sizes) and all(0 < e <= 1 for _, e in pts)
        probed = rows in decode_rows["fp32"]  # each decode-rows point read against its own read of the host
        assert 4 * 128 * 128 in sizes and (sweep_bytes in sizes) == (rows in s.gemm_rows and not probed)
    assert all(("read_gb_per_s" in r) == (r["rows"] in decode_rows[r["dtype"]])
               for r in cal.to_mapping()["calibration"]["gemm_sizes"])
    gpu = dc_replace(cal, device={**cal.device, "kind": "cuda"})
    assert "gemm_e_memory" not in gpu.fit_terms()  # CUDA: the GEMM shape model's
    assert cal.to_mapping()["calibration"]["gemm_sizes"]
    path = write_yaml(cal.to_mapping(), tmp_path / "local.yaml")
    tm = time_model_for(load_calibrated(path), "calibrated", "fp32", backend="sdpa")
    assert tm.gemm_e_memory is not None and tm.gemm_e_memory.reads == "weight"
    assert tm.gemm_e_memory.max_rows == max(s.gemm_size_rows + s.gemm_size_prefill_rows)


def test_a_cpu_calibration_fits_decode_attention_by_group_as_schema_9(cal, tmp_path):
    """The tiny calibration times decode attention at its group and at `attn_decode_groups` over the same
    KV heads and cache (the same bytes within the query and output, the FLOPs in proportion to the
    group) and writes, per measured dtype, the additive terms (`fit_decode_groups`), which the
    calibrated time model reads back. Structure only: the figures of a tiny run mean nothing."""
    from llmperf.analysis.timemodel import time_model_for

    s = cal.settings
    assert s.decode_groups == (s.attn_group, 1)
    for dtype in cal.measured_dtypes():
        dec = [p for p in cal.compute if p.op == "attention" and p.dtype == dtype and p.memory_bound]
        assert sorted(p.group for p in dec) == sorted(s.decode_groups * len(s.attn_decode))
        by_group = {p.group: p for p in dec}
        assert by_group[2].flops == 2 * by_group[1].flops
    eff = cal.to_mapping()["efficiency"]
    assert eff["schema_version"] == 9 and set(eff["decode_attention"]) == set(cal.measured_dtypes())
    for terms in eff["decode_attention"].values():
        assert terms["groups"] == [1, 2] and terms["s_per_byte"] >= 0 and terms["s_per_byte_per_group"] >= 0
        assert terms["s_per_byte"] + terms["s_per_byte_per_group"] > 0
    tm = time_model_for(load_calibrated(write_yaml(cal.to_mapping(), tmp_path / "local.yaml")), "calibrated", "fp32")
    assert tm.decode_attention is not None and tm.decode_attention.groups == (1, 2)
