"""Which kernel runs each GEMM (`engine.paths`), asked of the code, never assumed of this CPU: the
engine's paths, calibrate's sweep and dispatch rows and engine_bench's header and targets change
together when the CPU does. An AVX2-only CPU is faked (its AVX-512 / AMX features reported absent,
oneDNN without native bf16), whatever machine runs the test."""

from __future__ import annotations

import pytest
import torch

from llmperf.engine import Engine, SamplingParams, paths
from llmperf.engine.cpu import kernels as cpu_kernels
from llmperf.engine.cpu import ops as cpu_ops
from llmperf.engine.paths import GemmPath

from engine_testing import make_model

AVX2_FLAGS = {"sse4_2", "avx", "avx2", "fma", "f16c"}  # an AMD EPYC of the Zen 2/3 kind


@pytest.fixture
def avx2_only(monkeypatch):
    """This process sees an AVX2-only CPU: no AVX-512, AVX512_BF16 or AMX, oneDNN without native bf16."""
    monkeypatch.setattr(cpu_kernels, "_state", cpu_kernels._State())
    monkeypatch.setattr(cpu_kernels, "_proc_cpu_flags", lambda: set(AVX2_FLAGS))
    monkeypatch.setattr(cpu_ops, "onednn_bf16", lambda: False)
    monkeypatch.delenv(cpu_kernels.MAX_ISA, raising=False)  # the faked CPU, not a cap on it


def _rows_of(ps: tuple[GemmPath, ...]) -> list[tuple[int, int | None, str]]:
    return [(p.first, p.last, p.kernel) for p in ps]


def test_paths_cover_every_row_count_once_and_edges_are_their_seams():
    """Whatever this CPU is: the paths start at one row, follow each other without a gap, the last is
    open-ended, and the edges are the rows on both sides of each seam."""
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        ps = paths.gemm_paths(dtype)
        assert ps[0].first == 1 and ps[-1].last is None and all(p.kernel in paths.KERNELS for p in ps)
        assert all(a.last + 1 == b.first for a, b in zip(ps, ps[1:])) and all(p.last >= p.first for p in ps[:-1])
        assert paths.gemm_path_edges(dtype) == tuple(r for p in ps[:-1] for r in (p.last, p.last + 1))
    assert _rows_of(paths.gemm_paths(torch.float32, "cuda")) == [(1, None, "torch")]  # cuBLAS, nothing packed


def test_paths_follow_what_this_cpu_has():
    """The answer for this machine, from what it reports (the kernels' status, AMX, oneDNN's bf16)."""
    fp32, bf16 = paths.gemm_paths(torch.float32), paths.gemm_paths(torch.bfloat16)
    if cpu_kernels.available():
        assert _rows_of(fp32) == [(1, 8, "stream"), (9, None, "packed")]
        if cpu_kernels.amx_available():
            assert _rows_of(bf16) == [(1, 2, "stream"), (3, 16, "amx"), (17, None, "packed")]
        else:
            assert _rows_of(bf16) == [(1, 4, "stream"), (5, None, "packed")]
    else:
        assert _rows_of(fp32) == [(1, 1, "gemv"), (2, None, "packed")]
        assert _rows_of(bf16) == [(1, None, "packed" if cpu_ops.onednn_bf16() else "torch")]


def test_an_avx2_machine_changes_the_engine_calibrate_and_the_benchmark_together(avx2_only):
    from llmperf.measure import engine_bench
    from llmperf.measure.calibrate import Settings, gemm_dispatch_rows, gemm_sweep_rows, measure_gemm

    # the engine: torch's kernels, fp32's GEMV on a transposed copy, bf16 on torch's converting F.linear
    assert not cpu_kernels.available() and not cpu_kernels.amx_available()
    assert cpu_kernels.status() == "off (the CPU lacks avx512f, avx512bw, avx512_bf16)"
    assert _rows_of(paths.gemm_paths(torch.float32)) == [(1, 1, "gemv"), (2, None, "packed")]
    assert _rows_of(paths.gemm_paths(torch.bfloat16)) == [(1, None, "torch")]
    found = paths.engine_paths()
    assert found.absent == ("avx512f", "avx512bw", "avx512_bf16", "amx_tile", "amx_bf16")
    assert found.features == ("avx2", "fma") and not found.native_bf16
    assert found.one_call == {"fp32": 0, "bf16": 0} and found.decode_attention == "torch SDPA"
    line = found.line()
    for needle in ("absent: avx512f avx512bw avx512_bf16 amx_tile amx_bf16", "fp32 torch-GEMV 1, oneDNN 2+",
                   "bf16 torch 1+", "bf16 EMULATED", "decode layers in one call: off", "llmperf kernels off"):
        assert needle in line, (needle, line)
    for dtype in ("fp32", "bf16"):
        m = make_model("llama", dtype=dtype)
        assert m.weight_layout == "out_in" and m.ops.min_rows == (2 if dtype == "fp32" else None)
        out = Engine(m, cache="paged").generate([[1, 2, 3], [4, 5]], SamplingParams(max_new_tokens=3))
        assert [len(o.tokens) for o in out] == [3, 3]
    # calibrate: fp32 steps at (1, 2) (the GEMV, then packed); bf16 has one path, nothing extra
    cpu = torch.device("cpu")
    assert gemm_dispatch_rows("fp32", cpu) == (1, 2) and gemm_dispatch_rows("bf16", cpu) == (1, 2)
    tiny = Settings.tiny()
    assert gemm_sweep_rows(tiny, "fp32", cpu) == (1, 2, 8, 64) and gemm_sweep_rows(tiny, "bf16", cpu) == (1, 8, 64)
    gemm, notes = measure_gemm(Settings.tiny(dtypes=("bf16",), threads=1), cpu, lambda m: None)
    assert [p.rows for p in gemm] == [1, 8, 64] and notes[0].startswith("gemm bf16: no native kernel on this CPU (no")
    assert not [n for n in notes if "stopped" in n]  # the tiny sweep fits its budget
    assert not paths.native_kernel(torch.bfloat16) and paths.native_kernel(torch.float32)
    # the benchmark: bf16 at batch 1 and 8 only, without a target; no own-kernel or one-call figures
    plan = engine_bench.plan_for(found)
    assert plan.memory_limit == (("fp32", 1), ("fp32", 2), ("fp32", 4), ("fp32", 8), ("bf16", 1), ("bf16", 8))
    assert not plan.kernels and "(fp32)" in plan.targets and "bf16" not in plan.targets
    assert any("bf16 is emulated" in n for n in plan.notes) and any("kernels are off" in n for n in plan.notes)


def test_this_machine_and_the_avx2_machine_differ_where_the_cpu_does(monkeypatch):
    """The same questions on this CPU and on the faked AVX2 one: where this CPU runs llmperf's kernels,
    every answer changes; each answer matches the paths of the machine it was asked on."""
    from llmperf.measure import engine_bench
    from llmperf.measure.calibrate import gemm_dispatch_rows

    def answers():
        found = paths.engine_paths()
        return (paths.gemm_path_edges(torch.float32), gemm_dispatch_rows("fp32", torch.device("cpu")),
                engine_bench.plan_for(found).kernels, found.line())

    here = answers()
    assert set(here[0]) <= set(here[1])
    monkeypatch.setattr(cpu_kernels, "_state", cpu_kernels._State())
    monkeypatch.setattr(cpu_kernels, "_proc_cpu_flags", lambda: set(AVX2_FLAGS))
    monkeypatch.setattr(cpu_ops, "onednn_bf16", lambda: False)
    avx2 = answers()
    assert avx2[:3] == ((1, 2), (1, 2), False)
    monkeypatch.undo()
    if cpu_kernels.available():
        assert here[0] == (8, 9) and here[2] and all(a != b for a, b in zip(here, avx2))


def test_the_machine_line_names_the_cpu_and_every_path(capsys):
    line = paths.machine_line()
    assert line.startswith("machine: ") and "GEMM rows fp32 " in line and "; bf16 " in line
    assert "\n" not in line
    for p in paths.gemm_paths(torch.float32):
        assert str(p) in line
