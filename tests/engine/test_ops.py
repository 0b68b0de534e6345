"""The ops seam (`llmperf.engine.ops`): the model knows nothing of the CPU (no kernels, CPU features,
packed layouts or one-call decode in `model.py`), `ops_for` is the one place that picks the CPU fast
path, and plain torch ops and the CPU ops give the same logits and tokens on the same weights."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

from llmperf.engine import ContiguousKVCache, Engine, SamplingParams
from llmperf.engine.cpu.ops import CpuOps
from llmperf.engine.ops import TorchOps, ops_for

from engine_testing import make_model

MODEL = Path(__file__).resolve().parents[2] / "llmperf" / "engine" / "model.py"


def test_the_model_imports_nothing_cpu_specific():
    source = MODEL.read_text()
    assert not re.findall(r"cpu_kernels|cpuinfo|\bamx\b|mkldnn|onednn|avx|engine\.cpu\b|packed", source, re.I)
    imported = {n.module for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ImportFrom)}
    assert not [m for m in imported if m and m.startswith("llmperf.engine.cpu")]
    assert len(source.splitlines()) < 460


def test_ops_for_is_the_one_choice():
    assert type(ops_for("cpu", torch.float32)) is CpuOps and type(ops_for("cpu", torch.bfloat16)) is CpuOps
    assert type(ops_for("cpu", torch.float16)) is TorchOps  # nothing faster for fp16 here
    assert type(ops_for("cuda", torch.bfloat16)) is TorchOps  # cuBLAS reads the weights as they are
    assert ops_for("cpu", torch.float32, in_out=True).in_out
    model = make_model("llama")
    assert type(model.ops) is CpuOps and all(layer.ops is model.ops for layer in model.layers)
    with pytest.raises(ValueError, match="ops"):
        model.set_ops(TorchOps(in_out=True))


def _decode_logits(model, ops, steps: int = 4) -> torch.Tensor:
    """A ragged prefill then `steps` decode steps of three sequences, on `ops`: the stacked logits."""
    model.set_ops(ops)
    g = torch.Generator().manual_seed(0)
    lens = [5, 9, 3]
    tokens = torch.randint(0, model.spec.vocab_size, (3, max(lens) + steps), generator=g)
    cache = ContiguousKVCache(model.spec, max_batch=3, max_seq_len=32, dtype=model.dtype)
    out = []
    with torch.no_grad():
        for s, n in enumerate(lens):
            assert cache.allocate(s, n)
            out.append(model(tokens[s:s + 1, :n], cache.prepare([s], n))[0])
        for t in range(steps):
            for s in range(3):
                assert cache.append_slot(s)
            out += list(model(tokens[:, max(lens) + t:max(lens) + t + 1], cache.prepare([0, 1, 2], 1)))
    return torch.stack(out)


@pytest.mark.parametrize("kind", ["llama", "gpt2", "mixtral"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_torch_ops_and_cpu_ops_give_the_same_logits(kind, dtype):
    """Whatever runs on this CPU (llmperf's kernels and the one-call decode, oneDNN, or torch alone):
    fp32 to rounding, bf16 to bf16 rounding; the same greedy tokens through the engine."""
    model = make_model(kind, dtype=dtype)
    cpu = model.ops
    ours, theirs = _decode_logits(model, cpu), _decode_logits(model, TorchOps())
    tol = 1e-4 if dtype == "fp32" else 5e-2
    torch.testing.assert_close(ours.float(), theirs.float(), rtol=tol, atol=tol)
    if dtype == "fp32":
        prompts, params = [[1, 2, 3, 4], [5, 6]], SamplingParams(max_new_tokens=6)
        model.set_ops(TorchOps())
        plain = [o.tokens for o in Engine(model).generate(prompts, params)]
        model.set_ops(cpu)
        assert [o.tokens for o in Engine(model).generate(prompts, params)] == plain


def test_the_transposed_copy_is_private_and_follows_its_weight():
    """fp32 at one row without llmperf's GEMM reads a transposed copy (torch's faster GEMV); the
    parameter keeps its `(out, in)` layout, and a weight changed in place is read, not a stale copy."""
    from llmperf.engine.cpu import kernels

    model = make_model("llama")
    spec = model.spec
    tokens = torch.tensor([[3]])
    with kernels.disabled(), torch.no_grad():
        model(tokens)
        assert any(kind == "t" for kind, _ in model.ops._packs)
        model.layers[0].qkv_weight.mul_(2.0)
        ours = model(tokens)
        model.set_ops(TorchOps())
        theirs = model(tokens)
    assert model.layers[0].qkv_weight.shape == (spec.q_size + 2 * spec.kv_size, spec.hidden_size)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("ops", "dtype"), [(TorchOps(), torch.float32), (TorchOps(), torch.bfloat16),
                                            (CpuOps(torch.float32), torch.float32),
                                            (CpuOps(torch.bfloat16), torch.bfloat16)])
@pytest.mark.parametrize("offset", [False, True])  # Qwen3's q/k norms; Gemma 3's (1 + weight)
def test_q_and_k_norms_write_into_the_qkv_output_what_the_norm_computes(ops, dtype, offset):
    """`Norm.heads_` (the layer's `qk_norm`) on the q and the k heads of a QKV output `(N, H + 2 H_kv, D)`:
    in place, bit for bit `forward` on the same heads, the v heads untouched; on any ops (CpuOps: the
    kernels' in-place path where they run, torch's otherwise)."""
    from llmperf.engine.parts import Norm

    g = torch.Generator().manual_seed(5)
    qkv = (torch.randn(7, 4 + 2 * 2, 32, generator=g) * 2).to(dtype)
    before = qkv.clone()
    norms = [Norm("rmsnorm", 32, eps=1e-6, ops=ops, offset=offset, dtype=dtype) for _ in range(2)]
    for n in norms:
        n.weight.data = torch.randn(32, generator=g).to(dtype)
    with torch.no_grad():
        for norm, heads in zip(norms, (slice(0, 4), slice(4, 6))):
            out = norm.heads_(qkv[:, heads])
            assert out.data_ptr() == qkv[:, heads].data_ptr()
            assert torch.equal(qkv[:, heads], norm.forward(before[:, heads].contiguous()))
    assert torch.equal(qkv[:, 6:], before[:, 6:])
