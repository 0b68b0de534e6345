"""llmperf's own CPU kernels (`llmperf.engine.cpu.kernels`): the weight-streaming GEMM exact against a
float64 reference at every row count, shape tail and dtype; the RMSNorm rounding where Hugging Face
rounds (bf16) and torch's up to the order of a sum (fp32); the RoPE bit for bit torch's; SwiGLU's
activation within its exp's ulps of torch's; decode attention as close to float64 as SDPA, with ragged
lengths, windows and strided operands; refused input named; used by the engine exactly where the
measurement says; and when they cannot be built, the engine keeps torch's operators and says why,
leaving nothing half-written."""

from __future__ import annotations

import os
import platform
import shutil

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from llmperf.engine import Engine, SamplingParams
from llmperf.engine.cpu import kernels as cpu_kernels
from llmperf.engine.rope import apply_rope

from engine_testing import make_model

needs_kernel = pytest.mark.skipif(not cpu_kernels.available(), reason=f"cpu_kernels: {cpu_kernels.status()}")


def hf_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """`transformers`' LlamaRMSNorm.forward, verbatim."""
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return w * h.to(x.dtype)


def bf16_steps_apart(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How many representable bf16 values lie between a and b (same sign assumed where they differ)."""
    ia, ib = a.view(torch.int16).int(), b.view(torch.int16).int()
    return (ia - ib).abs()


def reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return x.double() @ w.double().t() + (0 if b is None else b.double())


def within_rounding(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> bool:
    """fp32 accumulation over K terms, then one rounding to the storage dtype."""
    ref = reference(x, w, b)
    scale = x.double().abs() @ w.double().abs().t() + (0 if b is None else b.double().abs())
    accumulate = x.shape[-1] * 2.0 ** -23 * scale
    store = ref.abs() * (2.0 ** -8 if y.dtype == torch.bfloat16 else 2.0 ** -23)
    return bool(((y.double() - ref).abs() <= accumulate + store + 1e-30).all())


@needs_kernel
@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, cpu_kernels.MAX_ROWS), n=st.integers(1, 70), k=st.integers(1, 300),
       bf16=st.booleans(), bias=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_the_kernel_is_exact_up_to_fp32_accumulation_at_every_row_count_and_tail(rows, n, k, bf16, bias, seed):
    g = torch.Generator().manual_seed(seed)
    dtype = torch.bfloat16 if bf16 else torch.float32
    x, w = torch.randn(rows, k, generator=g).to(dtype), torch.randn(n, k, generator=g).to(dtype)
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    y = cpu_kernels.small_gemm(x, w, b)
    assert y.shape == (rows, n) and y.dtype == dtype
    assert within_rounding(y, x, w, b)


@needs_kernel
def test_batched_and_strided_activations_give_the_same_result_as_contiguous_rows():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(40, 96, generator=g).to(torch.bfloat16)
    x = torch.randn(3, 2, 192, generator=g).to(torch.bfloat16)[..., ::2]  # (3, 2, 96), not contiguous
    y = cpu_kernels.small_gemm(x, w, None)
    assert y.shape == (3, 2, 40)
    assert torch.equal(y, cpu_kernels.small_gemm(x.contiguous().view(6, 96), w, None).view(3, 2, 40))


@needs_kernel
def test_flop_counter_counts_what_runs():
    x, w = torch.randn(2, 64), torch.randn(48, 64)
    with FlopCounterMode(display=False) as counter:
        cpu_kernels.small_gemm(x, w, None)
    assert counter.get_total_flops() == 2 * 2 * 64 * 48


needs_amx = pytest.mark.skipif(not cpu_kernels.amx_available(),
                               reason=f"AMX GEMM: {cpu_kernels._state.amx_reason or cpu_kernels.status()}")


@needs_amx
@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, cpu_kernels.AMX_ROWS), n=st.integers(1, 200), k=st.integers(1, 300), bias=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_the_amx_gemm_is_exact_up_to_fp32_accumulation_at_every_row_count_and_tail(rows, n, k, bias, seed):
    """Outputs past a 64-wide panel and inputs past a 32-wide block are zero-padded in the packed copy;
    x is padded per call."""
    g = torch.Generator().manual_seed(seed)
    x, w = (torch.randn(rows, k, generator=g).to(torch.bfloat16), torch.randn(n, k, generator=g).to(torch.bfloat16))
    b = torch.randn(n, generator=g).to(torch.bfloat16) if bias else None
    y = cpu_kernels.amx_gemm(x, cpu_kernels.amx_pack(w), n, b)
    assert y.shape == (rows, n) and y.dtype == torch.bfloat16
    assert within_rounding(y, x, w, b)


@needs_amx
def test_the_amx_gemm_takes_batched_strided_rows_and_is_counted_by_the_flop_counter():
    g = torch.Generator().manual_seed(2)
    w = torch.randn(130, 96, generator=g).to(torch.bfloat16)
    packed = cpu_kernels.amx_pack(w)
    x = torch.randn(3, 4, 192, generator=g).to(torch.bfloat16)[..., ::2]  # (3, 4, 96), not contiguous
    y = cpu_kernels.amx_gemm(x, packed, 130)
    assert y.shape == (3, 4, 130)
    assert torch.equal(y, cpu_kernels.amx_gemm(x.contiguous().view(12, 96), packed, 130).view(3, 4, 130))
    with FlopCounterMode(display=False) as counter:
        cpu_kernels.amx_gemm(x, packed, 130)
    assert counter.get_total_flops() == 2 * 12 * 96 * 130


@needs_amx
@pytest.mark.parametrize(("rows", "n", "packed_for", "needle"), [
    (17, 8, (8, 32), "1-16 rows"),
    (2, 8, (65, 32), "for 8 outputs"),
    (2, 8, (8, 33), "for 8 outputs"),
])
def test_bad_amx_operands_are_refused_by_name(rows, n, packed_for, needle):
    packed = cpu_kernels.amx_pack(torch.randn(*packed_for).to(torch.bfloat16))
    with pytest.raises(ValueError, match=f"amx_gemm: .*{needle}"):
        cpu_kernels.amx_gemm(torch.randn(rows, 32).to(torch.bfloat16), packed, n)
    with pytest.raises(ValueError, match="amx_pack: w must be"):
        cpu_kernels.amx_pack(torch.randn(4, 8))


@needs_amx
def test_the_engine_repacks_for_amx_when_a_weight_changes():
    """Weights loaded in place after the first step: the next steps read them, not a stale packed copy."""
    model = make_model("llama", dtype="bf16")
    engine = Engine(model, cache="contiguous")
    prompts = [[1, 2, 3, 4]] * 4  # decode steps of 4 rows: the AMX GEMM
    engine.generate(prompts, SamplingParams(max_new_tokens=3))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(-1.0)
    fresh = Engine(make_model("llama", dtype="bf16"), cache="contiguous")
    with torch.no_grad():
        for p in fresh.model.parameters():
            p.mul_(-1.0)
    ours, theirs = (e.generate(prompts, SamplingParams(max_new_tokens=4)) for e in (engine, fresh))
    assert [o.tokens for o in ours] == [o.tokens for o in theirs]


@pytest.mark.parametrize(("x", "w", "b", "needle"), [
    (torch.randn(9, 8), torch.randn(4, 8), None, "rows must be 1-8, got 9"),
    (torch.randn(1, 8), torch.randn(4, 7), None, "do not fit"),
    (torch.randn(1, 8), torch.randn(4, 8), torch.randn(5), "do not fit"),
    (torch.randn(1, 8), torch.randn(4, 8).to(torch.bfloat16), None, "dtypes"),
    (torch.randn(1, 8).double(), torch.randn(4, 8).double(), None, "dtypes"),
])
def test_bad_operands_are_refused_by_name(x, w, b, needle):
    with pytest.raises(ValueError, match=needle):
        cpu_kernels.small_gemm(x, w, b)


def _gemm_calls(monkeypatch) -> list[tuple[str, int]]:
    """(kernel, rows) of each GEMM the engine runs on llmperf's kernels from now on."""
    calls = []
    stream, amx = cpu_kernels.small_gemm, cpu_kernels.amx_gemm
    monkeypatch.setattr(cpu_kernels, "small_gemm",
                        lambda x, w, b: calls.append(("stream", x.numel() // x.shape[-1])) or stream(x, w, b))
    monkeypatch.setattr(cpu_kernels, "amx_gemm",
                        lambda x, p, n, b: calls.append(("amx", x.numel() // x.shape[-1])) or amx(x, p, n, b))
    return calls


def _expected_kernel(dtype: str, rows: int) -> str | None:
    if dtype == "bf16" and cpu_kernels.amx_available():
        return None if rows > cpu_kernels.AMX_ROWS else "amx" if rows >= cpu_kernels.AMX_MIN_ROWS else "stream"
    return "stream" if rows <= cpu_kernels.ROWS[{"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]] else None


@needs_kernel
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_the_engine_runs_each_gemm_on_the_kernel_its_rows_call_for_and_the_rest_packed(monkeypatch, dtype):
    """fp32 up to 8 rows on the weight-streaming kernel; bf16 up to 4 there, or where AMX runs 1-2 there
    and 3-16 on AMX tiles; a prefill of more rows and a bigger batch run packed for oneDNN. (Operators
    one by one: `test_decode_layers` checks the one-call decode picks the same kernels.)"""
    calls = _gemm_calls(monkeypatch)
    most = cpu_kernels.rows_for({"bf16": torch.bfloat16, "fp32": torch.float32}[dtype])

    def per_operator_model():
        model = make_model("llama", dtype=dtype)
        model.decode_in_one_call = False
        return model

    for batch in sorted({1, 2, 3, 4, most, most + 1}):
        calls.clear()
        engine = Engine(per_operator_model(), cache="contiguous")
        engine.generate([list(range(1, 19))] * batch, SamplingParams(max_new_tokens=3))
        # every decode step's GEMMs and the prefill's head (the last position of each prompt), not
        # the prefill's other GEMMs (18 rows per prompt)
        kernel = _expected_kernel(dtype, batch)
        assert set(calls) == (set() if kernel is None else {(kernel, batch)}), (dtype, batch)
    # a 3-token prefill (3 rows; its head reads the last position only) and two decode steps, each
    # 2 layers x (qkv, o, gate_up, down) + the head
    calls.clear()
    engine = Engine(per_operator_model(), cache="contiguous")
    engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=3))
    assert calls == [(_expected_kernel(dtype, 3), 3)] * 8 + [("stream", 1)] + [("stream", 1)] * 18


def test_fp32_weights_are_stored_out_in_whatever_the_cpu(llama_spec, monkeypatch):
    """One layout everywhere: the kernels' absence changes what runs, never how weights are stored."""
    from llmperf.engine import Transformer

    assert Transformer(llama_spec, dtype="fp32").weight_layout == "out_in"
    monkeypatch.setenv(cpu_kernels.SWITCH, "0")
    assert Transformer(llama_spec, dtype="fp32").weight_layout == "out_in"


@needs_kernel
def test_bf16_logits_on_the_kernel_are_as_close_to_fp32_as_the_library_s():
    """The same bf16 weights, one decode row: the kernel's logits are no further from the fp32 model's
    than oneDNN's are (both accumulate in fp32; they differ only in order)."""
    model, exact = make_model("llama", dtype="bf16"), make_model("llama", dtype="bf16")
    exact = exact.float()
    exact.dtype = torch.float32
    tokens = torch.tensor([[5, 9, 13, 2, 7, 11]])
    ref = exact(tokens)
    own = model(tokens[:, -1:], None).float()  # one row: the kernel
    with cpu_kernels.disabled():
        lib = model(tokens[:, -1:], None).float()
    one_row_ref = exact(tokens[:, -1:])
    assert ref.shape == own.shape
    err_own, err_lib = (own - one_row_ref).abs().max().item(), (lib - one_row_ref).abs().max().item()
    assert err_own <= 1.5 * err_lib + 1e-3, (err_own, err_lib)


def test_an_unavailable_kernel_leaves_the_library_gemms_and_says_why(monkeypatch):
    state = cpu_kernels._State()
    monkeypatch.setattr(cpu_kernels, "_state", state)
    monkeypatch.setattr(cpu_kernels, "_proc_cpu_flags", lambda: {"avx2", "fma"})
    monkeypatch.delenv(cpu_kernels.MAX_ISA, raising=False)  # the faked CPU, not a cap on it
    assert not cpu_kernels.available()
    assert cpu_kernels.status() == "off (the CPU lacks avx512f, avx512bw, avx512_bf16)"
    assert not cpu_kernels.gemm_kernel(torch.randn(1, 8).to(torch.bfloat16), torch.randn(4, 8).to(torch.bfloat16))
    out = Engine(make_model("llama", dtype="bf16"), cache="contiguous").generate([[1, 2, 3]],
                                                                                   SamplingParams(max_new_tokens=3))
    assert len(out[0].tokens) == 3


def test_the_switch_turns_it_off(monkeypatch):
    monkeypatch.setenv(cpu_kernels.SWITCH, "0")
    assert not cpu_kernels.available()
    assert cpu_kernels.status() == f"off ({cpu_kernels.SWITCH}=0)"


@pytest.mark.parametrize("level,hidden", [("avx2", {"avx512f", "avx512_bf16", "amx_tile"}), ("avx512", {"amx_tile"}),
                                          ("native", set()), ("", set())])
def test_the_isa_cap_hides_the_features_above_it(monkeypatch, level, hidden):
    """`LLMPERF_MAX_CPU_ISA` makes the kernels see a smaller CPU (to measure here what one runs)."""
    every = {"avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "amx_tile", "amx_bf16"}
    monkeypatch.setattr(cpu_kernels, "_proc_cpu_flags", lambda: set(every))
    monkeypatch.setenv(cpu_kernels.MAX_ISA, level)
    assert cpu_kernels.cpu_features() & {"avx512f", "avx512_bf16", "amx_tile"} == {"avx512f", "avx512_bf16",
                                                                                    "amx_tile"} - hidden
    assert {"avx2", "fma"} <= cpu_kernels.cpu_features()
    monkeypatch.setattr(cpu_kernels, "_state", cpu_kernels._State())
    if level == "avx2":
        assert cpu_kernels.status() == ("off (the CPU lacks avx512f, avx512bw, avx512_bf16; "
                                        f"{cpu_kernels.MAX_ISA}=avx2)")


def test_a_bad_isa_cap_is_named_and_turns_the_kernels_off(monkeypatch):
    monkeypatch.setattr(cpu_kernels, "_state", cpu_kernels._State())
    monkeypatch.setenv(cpu_kernels.MAX_ISA, "avx1024")
    assert not cpu_kernels.available()
    assert cpu_kernels.status() == (f"off ({cpu_kernels.MAX_ISA}: must be one of avx2, avx512, native, "
                                    "got 'avx1024')")


needs_compiler = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or shutil.which(os.environ.get("CXX", "c++")) is None,
    reason=f"the kernels target x86-64 (this is {platform.machine()}) with a C++ compiler ($CXX or c++)")


@needs_compiler
def test_the_kernels_build_and_link_on_any_x86_host(monkeypatch, tmp_path):
    """Built here even where this CPU cannot run them (the compiler targets AVX-512 and AMX on an AVX2
    host), so a syntax or link error fails on every machine: every entry point is in the library, and
    an undefined symbol fails the link (`-Wl,-z,defs`)."""
    import ctypes

    monkeypatch.setenv("LLMPERF_CACHE_DIR", str(tmp_path))
    lib = ctypes.CDLL(str(cpu_kernels.build()))  # loading runs none of its instructions
    state = cpu_kernels._State()
    cpu_kernels._bind(lib, state)
    assert set(state.fns) == set(state.layer_fns) == {torch.float32, torch.bfloat16} and state.amx_fns
    assert "-Wl,-z,defs" in cpu_kernels.FLAGS


@needs_compiler
def test_a_failed_build_names_the_compiler_and_leaves_nothing_behind(monkeypatch, tmp_path):
    monkeypatch.setattr(cpu_kernels, "_state", cpu_kernels._State())
    monkeypatch.setattr(cpu_kernels, "_proc_cpu_flags", lambda: {"avx2", "fma", *cpu_kernels.ISA})
    monkeypatch.delenv(cpu_kernels.MAX_ISA, raising=False)
    monkeypatch.setenv("LLMPERF_CACHE_DIR", str(tmp_path))
    fake = tmp_path / "fake-cxx"
    fake.write_text("#!/bin/sh\necho 'fake-cxx: error: no such thing' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    assert not cpu_kernels.available()
    assert "fake-cxx failed on kernels.cpp: fake-cxx: error: no such thing" in cpu_kernels.status()
    assert [p.name for p in tmp_path.iterdir()] == ["fake-cxx"]
    with pytest.raises(RuntimeError, match="fake-cxx failed"):
        cpu_kernels.build()
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-cxx"))
    with pytest.raises(RuntimeError, match="no C[+][+] compiler"):
        cpu_kernels.build()


@needs_compiler
def test_a_build_is_cached_by_source_and_flags(monkeypatch, tmp_path):
    monkeypatch.setenv("LLMPERF_CACHE_DIR", str(tmp_path))
    first = cpu_kernels.build()
    built = sorted(tmp_path.iterdir())
    assert built == [first] and first.name.startswith("cpu_kernels-") and first.suffix == ".so"
    stamp = os.stat(first).st_mtime_ns
    assert cpu_kernels.build() == first and sorted(tmp_path.iterdir()) == built
    assert os.stat(first).st_mtime_ns == stamp


@needs_kernel
@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 300), n=st.integers(1, 1100), scale=st.floats(1e-3, 1e3), eps=st.sampled_from([1e-6, 1e-5]),
       seed=st.integers(0, 2**31 - 1))
def test_the_bf16_rms_norm_rounds_where_hugging_face_rounds(rows, n, scale, eps, seed):
    """Only the fp32 sum of squares runs in another order: the normalised value may move one bf16 step,
    rarely, and the scaled output then one or two."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, n, generator=g) * scale).to(torch.bfloat16)
    w = torch.randn(n, generator=g).to(torch.bfloat16)
    ours, theirs = cpu_kernels.rms_norm(x, w, eps), hf_rms_norm(x, w, eps)
    steps = bf16_steps_apart(ours, theirs)
    assert int(steps.max()) <= 2
    assert int((steps > 0).sum()) <= max(2, ours.numel() // 1000)


@needs_kernel
def test_the_bf16_rms_norm_takes_any_leading_shape_and_strides():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 5, 256, generator=g).to(torch.bfloat16)[:, ::2, ::2]  # (2, 3, 128), not contiguous
    w = torch.randn(128, generator=g).to(torch.bfloat16)
    y = cpu_kernels.rms_norm(x, w, 1e-5)
    assert y.shape == x.shape and y.dtype == torch.bfloat16
    assert torch.equal(y, cpu_kernels.rms_norm(x.contiguous().view(6, 128), w, 1e-5).view(2, 3, 128))
    assert cpu_kernels.rms_norm(x[:0], w, 1e-5).shape == (0, 3, 128)


@pytest.mark.parametrize(("x", "w"), [
    (torch.randn(2, 8).half(), torch.randn(8).half()),  # fp16
    (torch.randn(2, 8).to(torch.bfloat16), torch.randn(7).to(torch.bfloat16)),
    (torch.randn(2, 8).to(torch.bfloat16), torch.randn(8)),
])
def test_bad_norm_operands_are_refused_by_name(x, w):
    with pytest.raises(ValueError, match="rms_norm: x"):
        cpu_kernels.rms_norm(x, w, 1e-5)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("tokens", "heads", "kv_heads", "d"), [(1, 1, 1, 16), (37, 8, 2, 128), (5, 3, 3, 40)])
def test_the_rms_norm_of_heads_in_place_is_the_rms_norm_of_each_head_bit_for_bit(dtype, tokens, heads, kv_heads, d):
    """q and k heads of a fused QKV output `(N, H + 2 H_kv, D)` normalised where they lie: the same bits as
    the contiguous kernel, the v heads and the other group untouched, the view itself returned."""
    g = torch.Generator().manual_seed(tokens * heads + d)
    qkv = (torch.randn(tokens, heads + 2 * kv_heads, d, generator=g) * 3).to(dtype)
    wq, wk = (torch.randn(d, generator=g).to(dtype) for _ in range(2))
    before = qkv.clone()
    q = cpu_kernels.rms_norm_heads_(qkv[:, :heads], wq, 1e-6)
    assert q.data_ptr() == qkv.data_ptr() and q.shape == (tokens, heads, d)
    assert torch.equal(qkv[:, :heads], cpu_kernels.rms_norm(before[:, :heads].contiguous(), wq, 1e-6))
    assert torch.equal(qkv[:, heads:], before[:, heads:])
    cpu_kernels.rms_norm_heads_(qkv[:, heads:heads + kv_heads], wk, 1e-6)
    assert torch.equal(qkv[:, heads:heads + kv_heads],
                       cpu_kernels.rms_norm(before[:, heads:heads + kv_heads].contiguous(), wk, 1e-6))
    assert torch.equal(qkv[:, heads + kv_heads:], before[:, heads + kv_heads:])
    assert cpu_kernels.rms_norm_heads_(qkv[:0, :heads], wq, 1e-6).shape == (0, heads, d)


@pytest.mark.parametrize("x", [torch.randn(4, 6, 8)[:, :, ::2],  # features not contiguous
                               torch.randn(4, 6, 8)[:, ::2],  # heads not adjacent
                               torch.randn(4, 8)])  # not (tokens, heads, n)
def test_the_rms_norm_of_heads_refuses_other_layouts_by_name(x):
    with pytest.raises(ValueError, match="rms_norm_heads_: x"):
        cpu_kernels.rms_norm_heads_(x, torch.ones(x.shape[-1]), 1e-6)


@needs_kernel
@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 40), n=st.integers(1, 1100), scale=st.floats(1e-3, 1e3), seed=st.integers(0, 2**31 - 1))
def test_the_fp32_rms_norm_is_torch_s_up_to_the_order_of_the_sum(rows, n, scale, seed):
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(rows, n, generator=g) * scale, torch.randn(n, generator=g)
    ref = (x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5)) * w.double()
    ours, theirs = cpu_kernels.rms_norm(x, w, 1e-5), torch.nn.functional.rms_norm(x, (n,), w, 1e-5)
    # both within a few fp32 roundings of the float64 value, and of each other
    assert torch.allclose(ours.double(), ref, rtol=4e-6, atol=1e-30)
    assert torch.allclose(ours, theirs, rtol=8e-6, atol=0)


@needs_kernel
def test_the_engine_runs_its_rms_norms_and_swiglu_on_the_kernels_in_fp32_and_bf16(monkeypatch):
    calls = []
    real_norm, real_silu = cpu_kernels.rms_norm, cpu_kernels.silu_mul
    monkeypatch.setattr(cpu_kernels, "rms_norm", lambda x, w, eps: calls.append("norm") or real_norm(x, w, eps))
    monkeypatch.setattr(cpu_kernels, "silu_mul", lambda gu: calls.append("silu") or real_silu(gu))
    for dtype, expected in (("bf16", {"norm", "silu"}), ("fp32", {"norm", "silu"}), ("fp16", set())):
        calls.clear()
        Engine(make_model("llama", dtype=dtype), cache="contiguous").generate([[1, 2, 3, 4]],
                                                                             SamplingParams(max_new_tokens=2))
        assert set(calls) == expected, dtype
    calls.clear()
    with cpu_kernels.disabled():
        Engine(make_model("llama", dtype="bf16"), cache="contiguous").generate([[1, 2, 3]],
                                                                              SamplingParams(max_new_tokens=2))
    Engine(make_model("gpt2"), cache="contiguous").generate([[1, 2, 3]], SamplingParams(max_new_tokens=2))
    assert not calls  # torch's operators when switched off; GPT-2 (LayerNorm, GELU) never runs them


def silu_reference(gate_up: torch.Tensor) -> torch.Tensor:
    g, u = gate_up.double().chunk(2, -1)
    return g / (1 + torch.exp(-g)) * u


@needs_kernel
@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 40), f=st.integers(1, 700), scale=st.floats(1e-2, 60), bf16=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_swiglu_s_activation_is_torch_s_up_to_its_exp(rows, f, scale, bf16, seed):
    """fp32: within 5 fp32 ulps of the float64 value, as torch is; bf16: rounded where torch rounds
    (silu, then the product), so at most one bf16 step from torch where the two exps round apart."""
    g = torch.Generator().manual_seed(seed)
    dtype = torch.bfloat16 if bf16 else torch.float32
    gate_up = (torch.randn(rows, 2 * f, generator=g) * scale).to(dtype)
    ours = cpu_kernels.silu_mul(gate_up)
    gate, up = gate_up.chunk(2, -1)
    theirs = torch.nn.functional.silu(gate) * up
    assert ours.shape == theirs.shape == (rows, f) and ours.dtype == dtype
    if bf16:
        steps = bf16_steps_apart(ours, theirs)
        assert int(steps.max()) <= 1 and int((steps > 0).sum()) <= max(2, ours.numel() // 500)
    else:
        ref = silu_reference(gate_up)
        # silu's relative error, then one rounding of the product: 5 ulps cover both (below 1e-30,
        # where exp(-g) overflows fp32, torch's silu is 0 too)
        assert bool(((ours.double() - ref).abs() <= 5 * 2.0 ** -23 * ref.abs() + 1e-30).all())


@needs_kernel
def test_swiglu_s_activation_takes_any_leading_shape_and_extreme_gates():
    gate = torch.tensor([-1e4, -100.0, -88.0, -20.0, -0.0, 0.0, 1e-30, 20.0, 88.0, 100.0, 1e4, float("inf"),
                         float("-inf"), float("nan")])
    up = torch.full_like(gate, 2.0)
    ours = cpu_kernels.silu_mul(torch.cat((gate, up))[None, None])
    theirs = torch.nn.functional.silu(gate) * up
    assert ours.shape == (1, 1, gate.numel())
    torch.testing.assert_close(ours[0, 0], theirs, rtol=4e-7, atol=0, equal_nan=True)
    x = torch.randn(2, 3, 10).to(torch.bfloat16)[:, :, ::1]
    assert torch.equal(cpu_kernels.silu_mul(x), cpu_kernels.silu_mul(x.reshape(6, 10)).view(2, 3, 5))


@pytest.mark.parametrize("gate_up", [torch.randn(2, 8).half(), torch.randn(2, 7), torch.randn(0)])
def test_bad_swiglu_operands_are_refused_by_name(gate_up):
    with pytest.raises(ValueError, match="silu_mul: gate_up must be"):
        cpu_kernels.silu_mul(gate_up)


@needs_kernel
@settings(max_examples=40, deadline=None)
@given(tokens=st.integers(0, 70), heads=st.integers(1, 6), kv=st.integers(0, 3), half=st.integers(1, 40),
       extra=st.integers(0, 9), bf16=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_rope_is_bit_for_bit_the_engines_torch_rope(tokens, heads, kv, half, extra, bf16, seed):
    """Every product and the sum rounded where torch rounds them; partial rotary copies the rest. In
    place over qkv's heads, the same bits, the v heads untouched."""
    g = torch.Generator().manual_seed(seed)
    dtype = torch.bfloat16 if bf16 else torch.float32
    D = 2 * half + 2 * (extra // 2)
    qkv = (torch.randn(tokens, heads + 2 * kv, D, generator=g) * 8).to(dtype)
    angles = torch.randn(tokens, half, generator=g) * 50
    table = torch.cat((angles, angles), -1)
    cos, sin = table.cos().to(dtype)[None, :, None], table.sin().to(dtype)[None, :, None]
    ours = cpu_kernels.rope(qkv, heads + kv, cos, sin)
    assert torch.equal(ours, apply_rope(qkv[None, :, :heads + kv], cos, sin)[0])
    over = qkv.clone()
    view = cpu_kernels.rope(over, heads + kv, cos, sin, in_place=True)
    assert view.data_ptr() == over.data_ptr() and view.shape == ours.shape and torch.equal(view, ours)
    assert torch.equal(over[:, heads + kv:], qkv[:, heads + kv:])


@needs_kernel
def test_rope_of_many_tokens_runs_threaded_and_reads_strided_heads():
    g = torch.Generator().manual_seed(5)
    wide = torch.randn(2048, 12, 128, generator=g)
    qkv = wide[:, ::2]  # heads two apart: copied to the contiguous layout the kernel reads
    table = torch.randn(2048, 64, generator=g)
    cos, sin = torch.cat((table, table), -1).cos(), torch.cat((table, table), -1).sin()
    assert torch.equal(cpu_kernels.rope(qkv, 4, cos, sin), apply_rope(qkv[None, :, :4], cos[None, :, None],
                                                                      sin[None, :, None])[0])


@pytest.mark.parametrize(("qkv", "heads", "table", "needle"), [
    (torch.randn(4, 3, 8).half(), 2, torch.randn(4, 8).half(), "rope: qkv must be"),
    (torch.randn(4, 3, 8), 4, torch.randn(4, 8), "rope: qkv must be"),
    (torch.randn(4, 3, 8), 2, torch.randn(3, 8), "do not fit 4 tokens"),
    (torch.randn(4, 3, 8), 2, torch.randn(4, 10), "do not fit"),
    (torch.randn(4, 3, 8), 2, torch.randn(4, 8).to(torch.bfloat16), "do not fit"),
])
def test_bad_rope_operands_are_refused_by_name(qkv, heads, table, needle):
    with pytest.raises(ValueError, match=needle):
        cpu_kernels.rope(qkv, heads, table, table)


def test_rope_in_place_refuses_heads_that_are_not_adjacent():
    with pytest.raises(ValueError, match="rope: in place needs qkv"):
        cpu_kernels.rope(torch.randn(4, 6, 8)[:, ::2], 2, torch.randn(4, 8), torch.randn(4, 8), in_place=True)


@needs_kernel
@pytest.mark.parametrize(("dtype", "expected"), [("fp32", True), ("bf16", True), ("fp16", False)])
def test_the_engine_runs_its_cpu_rope_on_the_kernel(monkeypatch, dtype, expected):
    calls = []
    real = cpu_kernels.rope
    monkeypatch.setattr(cpu_kernels, "rope", lambda *a, **kw: calls.append(a[0].shape) or real(*a, **kw))
    Engine(make_model("llama", dtype=dtype), cache="contiguous").generate([[1, 2, 3, 4]],
                                                                         SamplingParams(max_new_tokens=2))
    assert bool(calls) is expected


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: torch.Tensor, scale: float,
                        window: int | None) -> torch.Tensor:
    """float64 softmax(scale q k^T) v of each sequence's visible keys, `(B, H * D)`."""
    B, H, D = q.shape
    G = H // k.shape[1]
    out = torch.empty(B, H, D, dtype=torch.float64)
    for b in range(B):
        hi = int(lens[b])
        lo = max(0, hi - window) if window else 0
        kk, vv = (t[b, :, lo:hi].double().repeat_interleave(G, 0) for t in (k, v))  # (H, n, D)
        p = torch.softmax(torch.einsum("hd,hnd->hn", q[b].double(), kk) * scale, -1)
        out[b] = torch.einsum("hn,hnd->hd", p, vv)
    return out.view(B, H * D)


@needs_kernel
@settings(max_examples=50, deadline=None)
@given(batch=st.integers(1, 5), kv_heads=st.integers(1, 4), group=st.integers(1, 5), d=st.integers(1, 128),
       s=st.integers(1, 70), window=st.one_of(st.none(), st.integers(1, 40)), bf16=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_decode_attention_is_as_close_to_float64_as_sdpa(batch, kv_heads, group, d, s, window, bf16, seed):
    """Ragged lengths, sliding windows, every head dim up to 128 (tails of 16 lanes), grouped heads; keys
    past a sequence's length hold junk that must not leak in."""
    g = torch.Generator().manual_seed(seed)
    dtype = torch.bfloat16 if bf16 else torch.float32
    H = kv_heads * group
    q = (torch.randn(batch, H, d, generator=g) * 2).to(dtype)
    k, v = ((torch.randn(batch, kv_heads, s, d, generator=g) * 2).to(dtype) for _ in range(2))
    lens = torch.randint(1, s + 1, (batch,), generator=g, dtype=torch.int32)
    scale = d ** -0.5
    ours = cpu_kernels.decode_attention(q, k, v, lens, scale, window)
    ref = attention_reference(q, k, v, lens, scale, window)
    visible = torch.arange(s)[None, :] < lens[:, None].long()
    if window:
        visible &= torch.arange(s)[None, :] >= (lens[:, None].long() - window)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q.view(batch, kv_heads, group, d), k, v,
                                                            attn_mask=visible[:, None, None], scale=scale)
    sdpa_err = (sdpa.reshape(batch, H * d).double() - ref).abs().max()
    step = 2.0 ** -8 if bf16 else 2.0 ** -23
    assert ours.shape == (batch, H * d) and ours.dtype == dtype
    assert float((ours.double() - ref).abs().max()) <= max(2 * float(sdpa_err), 8 * step * float(ref.abs().max()))


@needs_kernel
def test_decode_attention_reads_strided_cache_rows_and_queries():
    """The engine passes q as a slice of the RoPE output and K/V as views of the cache's rows."""
    g = torch.Generator().manual_seed(11)
    cache = torch.randn(2, 6, 2, 40, 64, generator=g)  # (k|v, rows, H_kv, S_max, D)
    qkv = torch.randn(3, 8 + 2 * 2, 64, generator=g)  # (B, H + 2 H_kv, D): q is its first 8 heads
    q, k, v = qkv[:, :8], cache[0, 1:4, :, :30], cache[1, 1:4, :, :30]
    lens = torch.tensor([30, 7, 19], dtype=torch.int32)
    ours = cpu_kernels.decode_attention(q, k, v, lens, 0.125)
    assert torch.allclose(ours.double(), attention_reference(q, k, v, lens, 0.125, None), atol=2e-6, rtol=0)
    assert torch.equal(ours, cpu_kernels.decode_attention(q.contiguous(), k.contiguous(), v.contiguous(), lens, 0.125))


@pytest.mark.parametrize(("q", "k", "lens", "needle"), [
    (torch.randn(2, 4, 8).half(), torch.randn(2, 2, 5, 8).half(), torch.tensor([5, 5], dtype=torch.int32),
     "do not fit"),
    (torch.randn(2, 4, 8), torch.randn(2, 3, 5, 8), torch.tensor([5, 5], dtype=torch.int32), "do not fit"),
    (torch.randn(2, 4, 8), torch.randn(1, 2, 5, 8), torch.tensor([5], dtype=torch.int32), "do not fit"),
    (torch.randn(1, 2, 160), torch.randn(1, 2, 5, 160), torch.tensor([5], dtype=torch.int32), "D <= 128"),
    (torch.randn(2, 4, 8), torch.randn(2, 2, 5, 8), torch.tensor([5, 5]), "seq_lens must be"),
    (torch.randn(2, 4, 8), torch.randn(2, 2, 5, 8), torch.tensor([5], dtype=torch.int32), "seq_lens must be"),
])
def test_bad_decode_attention_operands_are_refused_by_name(q, k, lens, needle):
    with pytest.raises(ValueError, match=f"decode_attention: .*{needle}"):
        cpu_kernels.decode_attention(q, k, k, lens, 0.125)


@needs_kernel
@pytest.mark.parametrize("cache", ["contiguous", "paged"])
def test_the_engine_decodes_on_the_kernel_with_the_same_tokens_as_sdpa(monkeypatch, cache):
    """fp32 greedy decode of ragged prompts (a mask) with a sliding window smaller than the context."""
    calls = []
    real = cpu_kernels.decode_attention
    monkeypatch.setattr(cpu_kernels, "decode_attention",
                        lambda *a: calls.append((a[0].shape, len(a) > 6 and a[6] is not None)) or real(*a))
    model = make_model("mistral")  # sliding_window 6
    model.decode_in_one_call = False  # attention as an operator of its own (test_decode_layers: in one call)
    prompts = [[5, 9, 2, 7, 1, 3, 8, 4, 6, 2, 9], [3, 1, 4], [2, 7, 1, 8, 2, 8]]
    params = SamplingParams(max_new_tokens=6)
    ours = [o.tokens for o in Engine(model, cache=cache).generate(prompts, params)]
    assert calls and all(shape[0] in (1, 2, 3) for shape, _ in calls)
    assert {paged for _, paged in calls} == {cache == "paged"}  # a paged cache's blocks are read in place
    with cpu_kernels.disabled():
        theirs = [o.tokens for o in Engine(model, cache=cache).generate(prompts, params)]
    assert ours == theirs


@needs_kernel
@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 4), kv_heads=st.integers(1, 3), group=st.integers(1, 3), d=st.integers(1, 128),
       block=st.integers(1, 20), window=st.one_of(st.none(), st.integers(1, 30)), bf16=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_paged_decode_attention_reads_the_blocks_in_place_as_the_gathered_rows(batch, kv_heads, group, d, block,
                                                                               window, bf16, seed):
    """Blocks in a random order of the pool: bit for bit the result on the same keys gathered into rows."""
    g = torch.Generator().manual_seed(seed)
    dtype = torch.bfloat16 if bf16 else torch.float32
    max_blocks = 5
    pools = [(torch.randn(batch * max_blocks + 3, block, kv_heads, d, generator=g) * 2).to(dtype) for _ in range(2)]
    tables = torch.randperm(pools[0].shape[0], generator=g)[:batch * max_blocks].view(batch, max_blocks).int()
    lens = torch.randint(1, max_blocks * block + 1, (batch,), generator=g, dtype=torch.int32)
    q = (torch.randn(batch, kv_heads * group, d, generator=g) * 2).to(dtype)
    # (B, H_kv, S, D) rows: pool[table[b, s // P], s % P]
    k, v = (p[tables.long()].reshape(batch, max_blocks * block, kv_heads, d).transpose(1, 2) for p in pools)
    paged = cpu_kernels.decode_attention(q, *pools, lens, d ** -0.5, window, tables)
    assert torch.equal(paged, cpu_kernels.decode_attention(q, k, v, lens, d ** -0.5, window))


@needs_kernel
def test_paged_decode_attention_refuses_a_table_outside_the_pools():
    pools = torch.randn(4, 8, 2, 16)
    lens = torch.tensor([10], dtype=torch.int32)
    with pytest.raises(ValueError, match="decode_attention: block_tables name a block outside the 4"):
        cpu_kernels.decode_attention(torch.randn(1, 2, 16), pools, pools, lens, 0.25, None,
                                     torch.tensor([[1, 4]], dtype=torch.int32))
    with pytest.raises(ValueError, match="decode_attention: block_tables must be"):
        cpu_kernels.decode_attention(torch.randn(1, 2, 16), pools, pools, lens, 0.25, None, torch.tensor([[1, 2]]))
