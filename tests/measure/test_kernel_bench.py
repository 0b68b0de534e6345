"""The pure-Python parts of `python -m llmperf.measure.kernel_bench`, with fake timings (the timing itself
needs a GPU)."""

from __future__ import annotations

import csv
import json
import math

import pytest
import torch

from llmperf.analysis import attention_cost, roofline_time_s
from llmperf.measure import kernel_bench as bench
from llmperf.specs import load_hardware

H100 = load_hardware("h100-sxm")


def test_shapes_cover_the_brief():
    cs = bench.cases()
    assert {c.op for c in cs} == {"prefill", "decode", "paged", "mla"}
    assert min(c.context for c in cs) == 512 and max(c.context for c in cs) == 32768
    assert min(c.batch for c in cs) == 1 and max(c.batch for c in cs) == 64
    assert any(c.lens for c in cs)
    assert any(c.op == "decode" and c.tokens >= bench.DECODE_TARGET_TOKENS for c in cs)
    assert len(bench.cases(quick=True)) < len(cs)


def test_ops_picks_one_kernels_shapes_and_refuses_an_unknown_name(capsys):
    # the full MLA set alone (a lease's step: the batches the --quick set lacks), listed without a GPU
    assert {c.op for c in bench.cases()} == set(bench.OPS)
    assert bench.main(["--dry-run", "--ops", "mla"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == sum(c.op == "mla" for c in bench.cases()) and all(ln.startswith("mla ") for ln in lines)
    assert any("B=64" in ln for ln in lines)
    assert bench.main(["--dry-run", "--quick", "--ops", "decode, paged"]) == 0
    assert {ln.split()[0] for ln in capsys.readouterr().out.splitlines()} == {"decode", "paged"}
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(["--ops", "mla,bogus"])
    assert exc.value.code == 2 and "unknown kernel bogus" in capsys.readouterr().err


def test_local_shapes_are_todays_models():
    """gpt-oss's sliding layers (window 128, sinks, 64 / 8 heads of 64); Llama 4's chunked ones (8192, 40 / 8
    heads of 128)."""
    local = [c for c in bench.cases() if c.features]
    oss = [c for c in local if c.model == "gpt-oss"]
    scout = [c for c in local if c.model == "llama-4"]
    assert {c.op for c in oss} == {c.op for c in scout} == {"prefill", "decode", "paged"}
    assert all((c.heads, c.kv_heads, c.head_dim, c.sinks, c.chunk) == (64, 8, 64, True, None) for c in oss)
    assert {c.window for c in oss} == {128, None}  # sliding layers, and the full ones with sinks alone
    assert all((c.heads, c.kv_heads, c.head_dim, c.chunk, c.window, c.sinks) == (40, 8, 128, 8192, None, False)
               for c in scout)
    assert all(c.context > 8192 for c in scout)  # past one chunk, where chunking matters
    assert {c.model for c in bench.local_cases(quick=True)} == {"gpt-oss", "llama-4"}


def test_local_costs_come_from_analysis():
    kw = dict(num_heads=64, num_kv_heads=8, head_dim=64, act_bytes=2, kv_bytes=2, causal=True, window=128,
              sinks=True)
    dec = bench.Case(op="decode", batch=3, context=4096, window=128, **bench.GPT_OSS)
    assert bench.case_cost(dec, "fused", 2).bytes_total == pytest.approx(
        3 * attention_cost(1, 1, 4096, impl="fused", **kw).bytes_total)
    pre = bench.Case(op="prefill", batch=1, context=16384, **bench.LLAMA_4)
    assert bench.case_cost(pre, "fused", 2).flops == attention_cost(
        1, 16384, 16384, num_heads=40, num_kv_heads=8, head_dim=128, impl="fused", chunk=8192).flops
    # the window caps what decode reads: 128 keys, not 4096
    assert bench.case_cost(dec, "fused", 2).kv_read_bytes == pytest.approx(3 * 128 * 2 * 8 * 64 * 2)


def test_ragged_lens():
    lens = bench.ragged_lens(32, 4096)
    assert len(lens) == 32 and max(lens) == 4096 and min(lens) >= 2048


def test_costs_come_from_analysis():
    pre = bench.Case(op="prefill", batch=2, context=4096)
    kw = dict(num_heads=32, num_kv_heads=8, head_dim=128, act_bytes=2, kv_bytes=2, causal=True)
    assert bench.case_cost(pre, "fused", 2).flops == attention_cost(2, 4096, 4096, impl="fused", **kw).flops
    lens = (100, 300, 50)
    dec = bench.Case(op="decode", batch=3, context=300, lens=lens)
    summed = sum(attention_cost(1, 1, n, impl="fused", **kw).bytes_total for n in lens)
    assert bench.case_cost(dec, "fused", 2).bytes_total == pytest.approx(summed)
    uniform = bench.Case(op="paged", batch=4, context=512)
    assert bench.case_cost(uniform, "naive", 2).flops == pytest.approx(
        attention_cost(4, 1, 512, impl="naive", **kw).flops)


def test_mla_shapes_and_costs_come_from_the_deepseek_v3_spec():
    """MLA shapes: H=128 on one GPU and 16 at TP 8, batch 1..64, context 1k..32k; their FLOPs and bytes are
    `ForwardModel.attention_ops` of DeepSeek-V3 in the absorbed form (one 576-wide latent read per token,
    2 H (2R + Dr) FLOPs per token)."""
    from llmperf.analysis import ForwardModel
    from llmperf.specs import Precision, load_model

    ms = [c for c in bench.cases() if c.op == "mla"]
    assert {c.tp for c in ms} == {1, 8}
    assert {c.batch for c in ms} == {1, 8, 32, 64} and {c.context for c in ms} == {1024, 4096, 32768}
    case = bench.Case(op="mla", batch=2, context=4096, lens=(4096, 1000), tp=8)
    fm = ForwardModel(model=load_model("deepseek-v3"), precision=Precision.uniform("bf16"), tp=8,
                      mla_mode="absorbed")
    (one,) = fm.attention_ops(1, 1, 1000)
    cost = bench.case_cost(case, "fused", 2)
    assert cost.kv_read_bytes == pytest.approx(5096 * 576 * 2)
    assert cost.flops == pytest.approx(one.flops * 5096 / 1000)
    assert one.flops == pytest.approx(2 * 16 * (2 * 512 + 64) * 1000)
    naive = bench.case_cost(case, "naive", 2)
    assert naive.bytes_total > cost.bytes_total and naive.flops > cost.flops  # S and P in memory, the softmax


def test_row_fractions_with_fake_timing():
    case = bench.Case(op="decode", batch=64, context=4096)
    cost = bench.case_cost(case, "fused", 2)
    t = float(roofline_time_s(cost, H100, "bf16"))
    row = bench.make_row(case, "flash_decoding", cost, t, H100, "bf16", copy_bytes_per_s=3.0e12)
    assert row.roofline_fraction == pytest.approx(1.0)
    assert row.bandwidth_fraction == pytest.approx(1.0)  # decode is memory-bound: the roofline is bandwidth
    assert row.gb_per_s == pytest.approx(cost.bytes_total / t / 1e9)
    assert row.copy_fraction == pytest.approx(3350 / 3000)
    assert row.tokens == 64 * 4096
    unknown = bench.make_row(case, "flash_decoding", cost, t, None, "bf16", copy_bytes_per_s=0.0)
    assert math.isnan(unknown.peak_fraction) and math.isnan(unknown.copy_fraction)


def _fake_rows():
    pre = bench.Case(op="prefill", batch=1, context=4096)
    dec = bench.Case(op="decode", batch=64, context=4096)
    pc, dc = bench.case_cost(pre, "fused", 2), bench.case_cost(dec, "fused", 2)
    return [
        bench.make_row(pre, "flash_attention", pc, pc.flops / 450e12, H100, "bf16", 3e12, max_rel_error=2e-3),
        bench.make_row(pre, "sdpa", pc, pc.flops / 400e12, H100, "bf16", 3e12),
        bench.skipped_row(pre, "naive", bench.case_cost(pre, "naive", 2), "naive skipped"),
        bench.make_row(dec, "flash_decoding", dc, dc.bytes_total / 2.4e12, H100, "bf16", 3e12),
    ]


def test_targets_report():
    lines = bench.targets(_fake_rows())
    assert any(line.startswith("met  flash_attention") and "1.12x SDPA" in line for line in lines)
    assert any(line.startswith("met  flash_decoding") and "80% of copy" in line for line in lines)


def _meta():
    return bench.Meta(device="NVIDIA H100 80GB HBM3", hardware="h100-sxm", dtype="bf16", torch="2.x", triton="3.x",
                      cuda="12.x", date="2025-01-01T00:00:00+00:00", copy_gb_per_s=3000.0)


def test_table_renders():
    from rich.console import Console

    console = Console(record=True, width=220)
    console.print(bench.render_table(_fake_rows(), _meta()))
    text = console.export_text()
    assert "flash_attention" in text and "naive skipped" in text and "H100" in text


def test_save_json_and_csv(tmp_path):
    json_path, csv_path = bench.save(_fake_rows(), _meta(), tmp_path / "out")
    data = json.loads(json_path.read_text())
    assert data["meta"]["device"].startswith("NVIDIA H100") and len(data["rows"]) == 4
    assert data["rows"][2]["time_s"] is None  # NaN is written as null
    with csv_path.open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 and {"device", "torch", "triton", "cuda", "date", "impl", "time_s"} <= set(rows[0])
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["kernels.csv", "kernels.json"]


def test_dry_run_lists_shapes(capsys):
    assert bench.main(["--dry-run", "--quick"]) == 0
    assert "prefill B=1 T=4096" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU exit")
def test_without_cuda_exits_2_with_one_line(capsys):
    assert bench.main([]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no CUDA device" in err


@pytest.mark.parametrize("case", [
    bench.Case(op="prefill", batch=1, context=40),
    bench.Case(op="decode", batch=2, context=48, lens=(48, 30)),
    bench.Case(op="paged", batch=1, context=64),
], ids=lambda c: c.op)
def test_bench_case_end_to_end_with_fake_timer(case, device, monkeypatch):
    """Inputs, every implementation and the error check run for real (interpreter on CPU); only the timer is fake."""
    pytest.importorskip("triton")
    monkeypatch.setattr(bench, "_bench_ms", lambda fn: (fn(), 1.0)[1])
    monkeypatch.setattr(bench, "_naive_fits", lambda case, elem_bytes: (True, ""))
    rows = bench.bench_case(case, "fp16", H100, 3e12, device)
    expected = {"prefill": {"flash_attention", "sdpa", "naive"}, "decode": {"flash_decoding", "sdpa", "naive"},
                "paged": {"paged_attention", "gather+sdpa"}}[case.op]
    assert {r.impl for r in rows} == expected
    for r in rows:
        assert r.time_s == 1e-3 and r.max_rel_error < 1e-2, r


LOCAL = dict(model="tiny", heads=4, kv_heads=2, head_dim=16)


@pytest.mark.parametrize("case, impls", [
    (bench.Case(op="prefill", batch=1, context=40, window=8, sinks=True, **LOCAL), {"flash_attention", "naive"}),
    (bench.Case(op="decode", batch=2, context=48, lens=(48, 30), chunk=16, **LOCAL),
     {"flash_decoding", "sdpa", "naive"}),
    (bench.Case(op="paged", batch=1, context=64, window=20, sinks=True, **LOCAL), {"paged_attention", "gather+naive"}),
], ids=["prefill-window-sinks", "decode-chunk", "paged-window-sinks"])
def test_bench_local_case_end_to_end_with_fake_timer(case, impls, device, monkeypatch):
    """Window, chunk and sinks reach every implementation; SDPA (no sinks) gives way to naive."""
    pytest.importorskip("triton")
    monkeypatch.setattr(bench, "_bench_ms", lambda fn: (fn(), 1.0)[1])
    monkeypatch.setattr(bench, "_naive_fits", lambda case, elem_bytes: (True, ""))
    rows = bench.bench_case(case, "fp16", H100, 3e12, device)
    assert {r.impl for r in rows} == impls
    for r in rows:
        assert r.features == case.features and r.max_rel_error < 1e-2, r


@pytest.mark.parametrize("tp", [1, 8])
def test_mla_bench_case_end_to_end_with_fake_timer(tp, device, monkeypatch):
    """DeepSeek-V3's MLA widths through mla_decode and the torch reference (interpreter on CPU), fake timer."""
    pytest.importorskip("triton")
    monkeypatch.setattr(bench, "_bench_ms", lambda fn: (fn(), 1.0)[1])
    rows = bench.bench_case(bench.Case(op="mla", batch=1, context=40, tp=tp), "fp16", H100, 3e12, device)
    assert [r.impl for r in rows] == ["mla_decode", "torch"]
    for r in rows:
        assert r.time_s == 1e-3 and r.max_rel_error < 1e-2 and r.tp == tp, r


def test_reads_the_committed_h100_run():
    """The moved benchmark still reads the format of the H100 run committed before the move."""
    from pathlib import Path

    folder = Path(__file__).resolve().parents[2] / "reports" / "kernels" / "2026-11-23-h100"
    rows, meta = bench.load(folder)
    assert meta.hardware == "h100-sxm" and meta.copy_gb_per_s > 2500
    assert {r.impl for r in rows} >= {"flash_attention", "flash_decoding", "paged_attention"}
    assert all(r.time_s > 0 for r in rows if r.impl == "flash_decoding")


def test_save_then_load_round_trips(tmp_path):
    rows, meta = _fake_rows(), _meta()
    bench.save(rows, meta, tmp_path)
    back, meta2 = bench.load(tmp_path)
    assert meta2 == meta and len(back) == len(rows)
    assert math.isnan(back[2].time_s) and back[0].time_s == rows[0].time_s
