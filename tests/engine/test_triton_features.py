"""The triton backend on layers with a sliding window, chunked attention and sinks, against the sdpa
backend (which computes them with masks and an eager softmax): prefill, ragged decode and a ragged
multi-token step, on both caches. Gemma 2's soft-capped scores have no kernel and are refused by name.
"""

from __future__ import annotations

import pytest
import torch

from llmperf.engine import ContiguousKVCache, PagedKVCache, build_model

from engine_testing import kernels_available, tiny

# Windows and chunks shorter than the prompts below, so they matter in prefill and in decode.
SPECS = {
    "window+sinks": lambda: tiny("llama-3.1-8b", attn_sinks=True, sliding_window=5, layer_types=("sliding", "full")),
    "chunk": lambda: tiny("llama-3.1-8b", attention_chunk_size=6, layer_types=("chunked", "full")),
    "window+sinks everywhere": lambda: tiny("mistral-7b", sliding_window=4, attn_sinks=True),
}


@pytest.fixture(autouse=True)
def _needs_kernels():
    ok, why = kernels_available()
    if not ok:
        pytest.skip(why)


def _model(kind: str, backend: str):
    model = build_model(SPECS[kind](), seed=7, attention=backend)
    g = torch.Generator().manual_seed(8)
    with torch.no_grad():
        for block in model.layers:
            if getattr(block, "sinks", None) is not None:
                block.sinks.copy_(torch.randn(block.sinks.shape, generator=g) * 2)  # both signs, some large
    return model


def _cache(model, cache_kind: str):
    if cache_kind == "contiguous":
        return ContiguousKVCache(model.spec, max_batch=3, max_seq_len=20)
    return PagedKVCache(model.spec, num_blocks=16, block_size=4)


def _logits(kind: str, backend: str, cache_kind: str) -> list[torch.Tensor]:
    """Prefill prompts of 9, 3 and 7 tokens alone; one ragged step of 2 more tokens each (extend);
    then 3 ragged decode steps. Every step's logits, in order."""
    model = _model(kind, backend)
    cache = _cache(model, cache_kind)
    g = torch.Generator().manual_seed(9)
    out = []
    with torch.no_grad():
        for b, n in enumerate((9, 3, 7)):
            assert cache.allocate(b, n)
            out.append(model(torch.randint(0, 256, (1, n), generator=g), cache.prepare([b], n), all_logits=True))
        for T in (2, 1, 1, 1):
            for b in range(3):
                for _ in range(T):
                    assert cache.append_slot(b)
            out.append(model(torch.randint(0, 256, (3, T), generator=g), cache.prepare([0, 1, 2], T),
                             all_logits=True))
    return out


@pytest.mark.parametrize("cache_kind", ["contiguous", "paged"])
@pytest.mark.parametrize("kind", list(SPECS))
def test_triton_equals_sdpa(kind, cache_kind):
    for got, want in zip(_logits(kind, "triton", cache_kind), _logits(kind, "sdpa", cache_kind)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_triton_refuses_soft_capping():
    model = build_model(tiny("gemma-2-9b", sliding_window=4), seed=1, attention="triton")
    with torch.no_grad(), pytest.raises(ValueError, match="^attn_softcap: the triton backend has no soft-capping"):
        model(torch.randint(0, 256, (1, 6)))
