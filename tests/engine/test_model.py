"""The model: equal to Hugging Face `transformers` on the same weights, with and without the KV
cache, under every attention backend and both cache layouts."""

from __future__ import annotations

import pytest
import torch

from llmperf.engine import ContiguousKVCache, PagedKVCache, StepMeta, Transformer, build_model
from llmperf.engine.model import rope_inv_freq

from engine_testing import SPECS, hf_twin, kernels_available, make_model, tiny


@pytest.mark.parametrize("layout", ["in_out", "out_in"])
@pytest.mark.parametrize("kind", list(SPECS))
def test_forward_equals_transformers(kind, layout):
    model = make_model(kind, seed=1, weight_layout=layout)
    assert model.weight_layout == layout
    hf = hf_twin(model)
    tokens = torch.randint(0, model.spec.vocab_size, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model(tokens, all_logits=True)  # (B, T, V)
        ref = hf(tokens).logits
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


def test_last_position_logits_are_the_last_row_of_all_logits(llama_spec):
    model = build_model(llama_spec, seed=0)
    tokens = torch.randint(0, 256, (3, 7))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), model(tokens, all_logits=True)[:, -1])


def test_llama3_rope_scaling_changes_only_low_frequencies(llama_spec):
    plain = rope_inv_freq(llama_spec.scaled(rope_scaling=None))
    scaled = rope_inv_freq(llama_spec)
    assert llama_spec.rope_scaling["rope_type"] == "llama3"
    assert torch.equal(scaled[0], plain[0])  # the highest frequency is untouched
    assert scaled[-1] < plain[-1]  # the lowest is divided by up to `factor`


def _decode_logits(model: Transformer, cache, tokens: list[list[int]], prompt_lens: list[int]) -> list[torch.Tensor]:
    """Prefill each row's prompt alone, then decode the rest of all rows as one ragged batch;
    returns per row the logits predicting tokens[prompt_len:] (rows of different lengths)."""
    out = [[] for _ in tokens]
    for b, (row, n) in enumerate(zip(tokens, prompt_lens)):
        assert cache.allocate(b, n)
        meta = cache.prepare([b], n)
        out[b].append(model(torch.tensor([row[:n]]), meta)[0])
    pos = list(prompt_lens)
    while True:
        live = [b for b in range(len(tokens)) if pos[b] < len(tokens[b])]
        if not live:
            break
        for b in live:
            assert cache.append_slot(b)
        meta = cache.prepare(live, 1)
        logits = model(torch.tensor([[tokens[b][pos[b]]] for b in live]), meta)
        for i, b in enumerate(live):
            out[b].append(logits[i])
            pos[b] += 1
    return [torch.stack(o[:-1]) for o in out]


@pytest.mark.parametrize("cache_kind", ["contiguous", "paged"])
@pytest.mark.parametrize("kind", ["llama", "gpt2", "mixtral"])
def test_decoding_with_the_cache_equals_recomputation(kind, cache_kind):
    model = make_model(kind, seed=2)
    g = torch.Generator().manual_seed(1)
    lengths, prompts = [13, 9, 17], [5, 3, 8]
    tokens = [torch.randint(0, 256, (n,), generator=g).tolist() for n in lengths]
    if cache_kind == "contiguous":
        cache = ContiguousKVCache(model.spec, max_batch=3, max_seq_len=32)
    else:
        cache = PagedKVCache(model.spec, num_blocks=16, block_size=4)
    with torch.no_grad():
        got = _decode_logits(model, cache, tokens, prompts)
        for row, n, logits in zip(tokens, prompts, got):
            full = model(torch.tensor([row]), all_logits=True)[0]  # (T, V), no cache
            torch.testing.assert_close(logits, full[n - 1:-1], rtol=1e-4, atol=1e-5)
            assert torch.equal(logits.argmax(-1), full[n - 1:-1].argmax(-1))


def _run_backends(backend: str, cache_kind: str, dtype=torch.float32) -> list[torch.Tensor]:
    model = make_model("llama", seed=3, dtype=dtype, attention=backend)
    g = torch.Generator().manual_seed(5)
    tokens = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (12, 7, 10)]
    cache = (ContiguousKVCache(model.spec, max_batch=3, max_seq_len=16, dtype=dtype) if cache_kind == "contiguous"
             else PagedKVCache(model.spec, num_blocks=12, block_size=4, dtype=dtype))
    with torch.no_grad():
        return _decode_logits(model, cache, tokens, [4, 4, 6])


@pytest.mark.parametrize("cache_kind", ["contiguous", "paged"])
def test_naive_backend_equals_sdpa(cache_kind):
    for a, b in zip(_run_backends("naive", cache_kind), _run_backends("sdpa", cache_kind)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cache_kind", ["contiguous", "paged"])
def test_triton_backend_equals_sdpa(cache_kind):
    ok, why = kernels_available()
    if not ok:
        pytest.skip(why)
    for a, b in zip(_run_backends("triton", cache_kind), _run_backends("sdpa", cache_kind)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_paged_equals_contiguous():
    for a, b in zip(_run_backends("sdpa", "paged"), _run_backends("sdpa", "contiguous")):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_sdpa_naive_agree_with_the_kernels_torch_references():
    """The engine's attention against `kernels.reference` (an independent implementation)."""
    reference = pytest.importorskip("kernels.reference")
    from llmperf.engine.attention import naive_attention, sdpa_attention
    from llmperf.engine.instrument import NULL_RECORDER

    g = torch.Generator().manual_seed(0)
    B, T, H, H_kv, D = 2, 9, 4, 2, 16
    q, k, v = (torch.randn(B, T, h, D, generator=g) for h in (H, H_kv, H_kv))
    meta = StepMeta.no_cache(B, T, "cpu")
    expected = reference.naive_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
    expected = expected.transpose(1, 2).reshape(B, T, H * D)
    for fn in (naive_attention, sdpa_attention):
        torch.testing.assert_close(fn(0, q, k, v, meta, NULL_RECORDER), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_half_precision_runs_close_to_fp32(dtype):
    spec = SPECS["llama"]()
    ref = build_model(spec, seed=4)
    half = build_model(spec, seed=4, dtype=dtype)
    tokens = torch.randint(0, 256, (2, 8))
    with torch.no_grad():
        a, b = ref(tokens, all_logits=True), half(tokens, all_logits=True)
    assert b.dtype == half.dtype
    assert (a - b.float()).abs().max() < 0.05 * a.abs().max()


def test_seeded_weights_are_reproducible_and_seed_dependent(llama_spec):
    a, b, c = (build_model(llama_spec, seed=s) for s in (0, 0, 1))
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.embed_weight, c.embed_weight)


def test_tied_embeddings_share_one_tensor(gpt2_spec):
    model = build_model(gpt2_spec)
    assert model.lm_head_weight is model.embed_weight
    assert sum(p.numel() for p in model.parameters()) == gpt2_spec.param_count


@pytest.mark.parametrize("kind", list(SPECS))
def test_parameter_count_equals_the_spec(kind):
    model = make_model(kind)
    assert sum(p.numel() for p in model.parameters()) == model.spec.param_count


def test_auto_weight_layout_is_one_layout_everywhere(llama_spec, monkeypatch):
    from llmperf.engine.cpu import kernels as cpu_kernels

    monkeypatch.setenv(cpu_kernels.SWITCH, "0")  # torch's kernels alone: still (out, in) (the ops copy what they need)
    assert Transformer(llama_spec, dtype="fp32").weight_layout == "out_in"
    assert Transformer(llama_spec, dtype="bf16").weight_layout == "out_in"
    with pytest.raises(ValueError, match="weight_layout"):
        Transformer(llama_spec, weight_layout="col_major")


def test_bad_inputs_raise_value_errors_naming_the_field(llama_spec):
    with pytest.raises(ValueError, match="family"):
        Transformer(tiny("opt-13b", num_kv_heads=4))
    with pytest.raises(ValueError, match="rotary_dim"):
        Transformer(llama_spec.scaled(rotary_dim=128))
    # biased experts next to shared experts match no model the engine was checked against
    with pytest.raises(ValueError, match="mlp_bias"):
        Transformer(tiny("mixtral-8x7b", num_experts=4, experts_per_token=2, shared_experts=2, mlp_bias=True))
    with pytest.raises(ValueError, match="dtype"):
        Transformer(llama_spec, dtype="int8")
    with pytest.raises(ValueError, match="attention"):
        Transformer(llama_spec, attention="flash")
    model = build_model(llama_spec)
    with pytest.raises(ValueError, match="tokens"):
        model(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="max_positions"):
        model(torch.zeros(1, llama_spec.max_positions + 1, dtype=torch.long))


def _ragged_extend_logits(backend: str, cache_kind: str) -> torch.Tensor:
    """Prefill three prompts of different lengths alone, then feed 3 more tokens of each in ONE step
    (a multi-token step over ragged cached contexts, as chunked prefill would)."""
    model = make_model("llama", seed=4, attention=backend)
    g = torch.Generator().manual_seed(6)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (5, 9, 2)]
    cache = (ContiguousKVCache(model.spec, max_batch=3, max_seq_len=16) if cache_kind == "contiguous"
             else PagedKVCache(model.spec, num_blocks=12, block_size=4))
    with torch.no_grad():
        for b, row in enumerate(prompts):
            assert cache.allocate(b, len(row))
            model(torch.tensor([row]), cache.prepare([b], len(row)))
        for b in range(3):
            for _ in range(3):
                assert cache.append_slot(b)
        chunk = torch.randint(0, 256, (3, 3), generator=g)
        return model(chunk, cache.prepare([0, 1, 2], 3), all_logits=True)  # (3, 3, V)


@pytest.mark.parametrize("cache_kind", ["contiguous", "paged"])
def test_triton_ragged_multi_token_step_equals_sdpa(cache_kind):
    ok, why = kernels_available()
    if not ok:
        pytest.skip(why)
    torch.testing.assert_close(_ragged_extend_logits("triton", cache_kind), _ragged_extend_logits("sdpa", cache_kind),
                               rtol=1e-4, atol=1e-4)


# ---- GEMMs on packed weights (CPU) -----------------------------------------------------------------


def _forward_both_ways(model, tokens):
    """Logits with the layout's packing policy and with every GEMM on the plain path."""
    rows = model.ops.min_rows
    with torch.no_grad():
        packed = model(tokens, all_logits=True)
        model.ops.min_rows = model._head_ops.min_rows = None
        try:
            plain = model(tokens, all_logits=True)
        finally:
            model.ops.min_rows = model._head_ops.min_rows = rows
    return packed, plain


def test_packing_policy_per_dtype_and_device():
    from llmperf.engine.cpu.ops import packed_min_rows

    cpu = torch.device("cpu")
    assert packed_min_rows(torch.float16, cpu) is None
    assert packed_min_rows(torch.float32, torch.device("cuda")) is None  # CUDA: never packed
    if torch.backends.mkldnn.is_available():
        assert packed_min_rows(torch.float32, cpu) == 2  # one fp32 row: the plain GEMV is faster


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN in this torch build")
@pytest.mark.parametrize("layout", ["in_out", "out_in"])
@pytest.mark.parametrize("kind", ["llama", "gpt2", "mixtral"])
def test_packed_gemms_equal_the_plain_path(kind, layout):
    model = make_model(kind, seed=2, weight_layout=layout)
    assert model.ops.min_rows == 2
    tokens = torch.randint(0, model.spec.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    packed, plain = _forward_both_ways(model, tokens)
    torch.testing.assert_close(packed, plain, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN in this torch build")
def test_packed_weights_follow_a_weight_changed_after_packing(llama_spec):
    model = build_model(llama_spec, seed=0)
    tokens = torch.randint(0, 256, (2, 5), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        model(tokens)  # packs every matrix
        model.layers[0].qkv_weight.mul_(2.0)  # in place: the version counter moves
        model.layers[1].up_weight.data = model.layers[1].up_weight.data * 0.5  # new storage
    packed, plain = _forward_both_ways(model, tokens)
    torch.testing.assert_close(packed, plain, rtol=1e-5, atol=1e-5)


def test_flop_counter_sees_the_packed_gemms(llama_spec):
    from torch.utils.flop_counter import FlopCounterMode

    model = build_model(llama_spec, seed=0)
    tokens = torch.randint(0, 256, (2, 5), generator=torch.Generator().manual_seed(3))
    counts = []
    for rows in (model.ops.min_rows, None):
        model.ops.min_rows = rows
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(tokens)
        counts.append(counter.get_total_flops())
    assert counts[0] == counts[1] > 0


def test_bf16_packed_gemv_is_the_plain_math():
    """bf16 runs every GEMM packed (one row too): same logits as the plain bf16 path, to bf16 rounding."""
    from llmperf.engine.cpu.ops import packed_min_rows

    if packed_min_rows(torch.bfloat16, torch.device("cpu")) is None:
        pytest.skip("no oneDNN bf16 on this CPU")
    model = make_model("llama", seed=3, dtype="bf16")
    assert model.ops.min_rows == 1
    tokens = torch.randint(0, model.spec.vocab_size, (1, 1), generator=torch.Generator().manual_seed(4))
    packed, plain = _forward_both_ways(model, tokens)
    torch.testing.assert_close(packed.float(), plain.float(), rtol=2e-2, atol=2e-2)
