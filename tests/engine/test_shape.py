"""Issue 8's shape, checked: the step's metadata is one module that `attention` and `cache` both
import (no cycle between them); backends dispatch on what the step carries, not on the cache's
class; nothing outside the cache reaches into its block manager."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from llmperf.engine import ContiguousKVCache, PagedKVCache, StepMeta, build_model

from engine_testing import SPECS, kernels_available

ENGINE = Path(__file__).resolve().parents[2] / "llmperf" / "engine"


def _engine_imports(module: str) -> set[str]:
    """The engine modules `module` imports (`from llmperf.engine import x` names `llmperf.engine.x`)."""
    tree = ast.parse((ENGINE / f"{module}.py").read_text())
    found = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("llmperf.engine"):
            package = ENGINE.parent.parent.joinpath(*n.module.split("."))  # a package: its modules by name
            found |= {f"{n.module}.{a.name}" if (package / f"{a.name}.py").is_file() else n.module for a in n.names}
    return found


def test_attention_and_cache_share_the_step_module_without_a_cycle():
    # attention also runs llmperf's CPU decode kernel: a leaf module, like step
    assert _engine_imports("attention") == {"llmperf.engine.step", "llmperf.engine.cpu.kernels"}
    assert _engine_imports("cache") == {"llmperf.engine.step"}
    assert not [m for m in _engine_imports("step")], "the step module imports nothing of the engine"
    assert not [m for m in _engine_imports("cpu/kernels")], "the kernels import nothing of the engine"


def test_no_backend_dispatches_on_the_cache_class():
    tree = ast.parse((ENGINE / "attention.py").read_text())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert not names & {"PagedKVCache", "ContiguousKVCache", "KVCache"}
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "isinstance"]
    assert not calls


def test_nothing_outside_the_cache_reaches_into_its_manager():
    root = ENGINE.parents[1]
    offenders = []
    for f in [*root.joinpath("llmperf").rglob("*.py"), *root.joinpath("tests", "engine").rglob("*.py"),
              *root.joinpath("notebooks").rglob("*.py")]:
        if f == ENGINE / "cache.py" or f == Path(__file__).resolve():
            continue
        tree = ast.parse(f.read_text())
        offenders += [f"{f.relative_to(root)}:{n.lineno}" for n in ast.walk(tree)
                      if isinstance(n, ast.Attribute) and n.attr == "manager"
                      and isinstance(n.value, ast.Attribute) and n.value.attr == "cache"]
    assert not offenders


class _Store:
    """A duck-typed `KVStore` wrapping a real cache: only the tensor side, and not a KVCache."""

    def __init__(self, cache):
        self._c = cache

    def write(self, layer, k, v, meta):
        self._c.write(layer, k, v, meta)

    def gather(self, layer, meta):
        return self._c.gather(layer, meta)

    def pools(self, layer):
        return self._c.pools(layer)

    def rows_of(self, layer, meta):
        return self._c.rows_of(layer, meta)

    def blocks(self, layer):
        return self._c.blocks(layer)


@pytest.mark.parametrize("backend", ["sdpa", "naive", "triton"])
@pytest.mark.parametrize("kind", ["contiguous", "paged"])
def test_backends_read_what_the_step_carries(backend, kind):
    if backend == "triton" and not kernels_available()[0]:
        pytest.skip(kernels_available()[1])
    spec = SPECS["llama"]()
    model = build_model(spec, seed=1)
    from llmperf.engine.attention import get_backend

    attend = get_backend(backend)
    prompt = torch.randint(0, spec.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))

    def decode_logits(wrap: bool) -> torch.Tensor:
        cache = (ContiguousKVCache(spec, max_batch=2, max_seq_len=16) if kind == "contiguous"
                 else PagedKVCache(spec, num_blocks=8, block_size=4))
        for s in (0, 1):
            cache.allocate(s, 7)
        meta = cache.prepare([0, 1], 7)
        if wrap:
            meta.store = _Store(cache)
        model(prompt, meta, attend=attend)
        for s in (0, 1):
            cache.append_slot(s)
        meta = cache.prepare([0, 1], 1)
        assert meta.paged == (kind == "paged") and meta.contiguous == (kind == "contiguous")
        if wrap:
            meta.store = _Store(cache)
        return model(prompt[:, -1:], meta, attend=attend)

    with torch.no_grad():
        torch.testing.assert_close(decode_logits(True), decode_logits(False), rtol=0, atol=0)
    assert StepMeta.no_cache(1, 2, "cpu").store is None


@pytest.mark.parametrize("sinks", [False, True])
def test_a_sliding_prompt_past_twice_its_window_runs_in_blocks_equal_to_the_masked_square(sinks):
    """A fresh prompt of a sliding layer longer than twice its window runs on SDPA in blocks of W queries,
    each over its own keys (about 2 T W scores, not T^2): the same output as the materialised
    attention, with and without learned sinks, GQA and a ragged last block included."""
    import math

    from llmperf.engine import attention as att
    from llmperf.engine.step import LayerAttn, StepMeta

    torch.manual_seed(0)
    B, T, H, H_kv, D, W = 2, 45, 4, 2, 16, 8
    q = torch.randn(B, T, H, D, dtype=torch.float64)
    K, V = torch.randn(B, H_kv, T, D, dtype=torch.float64), torch.randn(B, H_kv, T, D, dtype=torch.float64)
    p = LayerAttn(scale=1 / math.sqrt(D), window=W, sinks=torch.randn(H, dtype=torch.float64) if sinks else None)
    meta = StepMeta.no_cache(B, T, "cpu")
    assert att._windowed(meta, p, T, T) and not att._windowed(meta, p, 2 * W, 2 * W)
    blocks = att._window_blocks(T, W, q.device)
    assert [(q0, q1, k0) for q0, q1, k0, _ in blocks][:3] == [(0, 8, 0), (8, 16, 1), (16, 24, 9)]
    assert blocks[-1][:3] == (40, 45, 33) and blocks[-1][3].shape == (1, 1, 5, 12)
    if sinks and att._LSE_SDPA is None:
        pytest.skip("this torch has no CPU flash attention returning the log-sum-exp")
    got = att.sdpa_core(q, K, V, meta, p).view(B, T, H, D)
    qt, mask = q.transpose(1, 2), meta.mask(T, p)  # the one masked square over every key, as before
    if sinks:
        square = att._sinks_call(qt, K, V, mask, False, p)
    else:
        square = torch.nn.functional.scaled_dot_product_attention(qt, K, V, attn_mask=mask, enable_gqa=True,
                                                                  scale=p.scale).transpose(1, 2)
    assert torch.allclose(got, square, atol=1e-12, rtol=1e-12)
    # and the materialised math (its softmax in fp32, as transformers' eager attention)
    assert torch.allclose(got, att._eager(q, K, V, meta, p), atol=1e-6)
