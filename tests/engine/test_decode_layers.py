"""A decode step's layers in one call of llmperf's CPU kernels (`cpu.kernels.decode_layers`, run by
`cpu.ops.CpuOps.decode_layers`): bit for bit the logits of the same layers run operator by operator
(either cache, fp32 / bf16, every GEMM kernel, biases, GQA, partial rotary, a sliding window, ragged
lengths), every operator still recorded under its name, the same kernel per GEMM, the per-operator path
wherever the one call does not apply, and a bad block table refused before anything is written."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from llmperf.engine import Engine, Recorder, SamplingParams, build_model
from llmperf.engine.cache import ContiguousKVCache, PagedKVCache
from llmperf.engine.cpu import kernels as cpu_kernels

from engine_testing import make_model, tiny

needs_kernel = pytest.mark.skipif(not cpu_kernels.available(), reason=f"cpu_kernels: {cpu_kernels.status()}")


@pytest.fixture
def one_calls(monkeypatch) -> list[tuple[int, bool]]:
    """(rows, amx) of each `decode_layers` call from now on."""
    calls = []
    real = cpu_kernels.decode_layers
    monkeypatch.setattr(cpu_kernels, "decode_layers",
                        lambda x, *a, **k: calls.append((x.shape[0], k["amx"])) or real(x, *a, **k))
    return calls


def _cache(spec, kind: str, dtype: torch.dtype, block: int = 4):
    if kind == "contiguous":
        return ContiguousKVCache(spec, max_batch=16, max_seq_len=48, dtype=dtype)
    return PagedKVCache(spec, num_blocks=16 * 48 // block + 1, block_size=block, dtype=dtype)


def _decode_logits(model, kind: str, prompt_lens: list[int], steps: int, one_call: bool, block: int = 4,
                   seed: int = 0) -> torch.Tensor:
    """Prefill each sequence alone (ragged lengths), then `steps` decode steps of the whole batch:
    the stacked decode logits."""
    model.decode_in_one_call = one_call
    B = len(prompt_lens)
    tokens = torch.randint(0, model.spec.vocab_size, (B, max(prompt_lens) + steps),
                           generator=torch.Generator().manual_seed(seed))
    cache = _cache(model.spec, kind, model.dtype, block)
    for s, n in enumerate(prompt_lens):
        assert cache.allocate(s, n)
        model(tokens[s:s + 1, :n], cache.prepare([s], n))
    out = []
    for t in range(steps):
        for s in range(B):
            assert cache.append_slot(s)
        out.append(model(tokens[:, max(prompt_lens) + t:max(prompt_lens) + t + 1], cache.prepare(list(range(B)), 1)))
    model.decode_in_one_call = True
    return torch.stack(out)


@needs_kernel
@pytest.mark.parametrize("kind", ["contiguous", "paged"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("model_kind", ["llama", "qwen2", "mistral"])  # llama3 rope; q/k/v biases; window 6
def test_one_call_gives_the_logits_of_the_operators_one_by_one(one_calls, kind, dtype, model_kind):
    model = make_model(model_kind, dtype=dtype)
    most = cpu_kernels.rows_for(model.dtype)
    for lens in ([9], [3, 11, 7], [5 + i % 4 for i in range(most)]):
        one_calls.clear()
        ours = _decode_logits(model, kind, lens, 4, True)
        assert len(one_calls) == 4 and {rows for rows, _ in one_calls} == {len(lens)}
        theirs = _decode_logits(model, kind, lens, 4, False)
        assert len(one_calls) == 4  # the per-operator run made none
        assert torch.equal(ours, theirs), (kind, dtype, model_kind, lens)


@needs_kernel
@settings(max_examples=12, deadline=None)
@given(kv_heads=st.integers(1, 3), group=st.integers(1, 3), head_dim=st.sampled_from([8, 16, 24, 64, 128]),
       partial=st.booleans(), ffn=st.integers(1, 5).map(lambda n: 24 * n), batch=st.integers(1, 5),
       window=st.one_of(st.none(), st.integers(1, 12)), block=st.integers(1, 7), bias=st.booleans(),
       bf16=st.booleans(), paged=st.booleans(), seed=st.integers(0, 2**16))
def test_one_call_matches_the_operators_on_random_shapes(kv_heads, group, head_dim, partial, ffn, batch, window,
                                                         block, bias, bf16, paged, seed):
    heads = kv_heads * group
    spec = tiny("llama-3.1-8b", hidden_size=48, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                ffn_size=ffn, rotary_dim=head_dim // 2 if partial and head_dim % 4 == 0 else head_dim,
                sliding_window=window, qkv_bias=bias, out_bias=bias, mlp_bias=bias)
    model = build_model(spec, seed=seed, dtype="bf16" if bf16 else "fp32")
    lens = [1 + (seed + 5 * i) % 13 for i in range(batch)]
    kind = "paged" if paged else "contiguous"
    calls = []
    real = cpu_kernels.decode_layers
    with mock.patch.object(cpu_kernels, "decode_layers", lambda *a, **k: calls.append(1) or real(*a, **k)):
        ours = _decode_logits(model, kind, lens, 3, True, block, seed)
        # decode steps whose rows this machine's kernels take (`rows_for`: bf16 4, or 16 with AMX), and a
        # one-token prompt's prefill, which is a one-token step too
        expected = 3 * (batch <= cpu_kernels.rows_for(model.dtype)) + lens.count(1)
        assert len(calls) == expected
        assert torch.equal(ours, _decode_logits(model, kind, lens, 3, False, block, seed))
    assert len(calls) == expected


@needs_kernel
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_one_call_runs_each_gemm_on_the_kernel_its_rows_call_for(one_calls, dtype):
    """The same choice as the operators make (`gemm_kernel`): AMX for bf16 rows 3-16 where it runs,
    the streaming kernel up to `rows_for` rows otherwise; past that, no one call (oneDNN's GEMM)."""
    most = cpu_kernels.rows_for(torch.bfloat16 if dtype == "bf16" else torch.float32)
    for batch in sorted({1, 2, 3, most, most + 1}):
        one_calls.clear()
        engine = Engine(make_model("llama", dtype=dtype), cache="paged")
        engine.generate([list(range(1, 9))] * batch, SamplingParams(max_new_tokens=3))
        if batch > most:
            assert one_calls == []
        else:
            amx = dtype == "bf16" and cpu_kernels.amx_available() and batch >= cpu_kernels.AMX_MIN_ROWS
            assert one_calls == [(batch, amx)] * 2


@needs_kernel
def test_a_recorded_one_call_step_names_every_operator_of_every_layer(one_calls):
    model = make_model("llama")
    prompts = [[1, 2, 3, 4], [5, 6]]
    params = SamplingParams(max_new_tokens=4)
    records = {}
    for one_call in (True, False):
        model.decode_in_one_call = one_call
        rec = Recorder()
        Engine(model).generate(prompts, params, recorder=rec)
        records[one_call] = rec.trace
    assert len(one_calls) == 3
    shape = {flag: [(r.step, r.layer, r.op) for r in trace.ops if r.phase == "decode"]
             for flag, trace in records.items()}
    assert shape[True] == shape[False]  # the same operators, layers and order
    ops = [r for r in records[True].ops if r.phase == "decode" and r.layer is not None]
    assert {r.op for r in ops} == set(cpu_kernels.LAYER_PARTS)
    assert all(r.seconds >= 0 for r in ops)
    for step in records[True].steps:
        if step.phase == "decode":  # the parts are inside the forward pass
            parts = sum(r.seconds for r in records[True].ops if r.phase == "decode" and r.step == step.step)
            assert 0 < parts <= step.forward_seconds


@needs_kernel
def test_the_operators_run_one_by_one_where_the_one_call_does_not_apply(one_calls):
    prompts, params = [[1, 2, 3, 4, 5]], SamplingParams(max_new_tokens=3)
    naive = Engine(make_model("llama"), attention="naive")  # another attention backend
    sdpa = [o.tokens for o in Engine(make_model("llama")).generate(prompts, params)]
    assert len(one_calls) == 2
    one_calls.clear()
    naive.generate(prompts, params)
    Engine(make_model("gpt2")).generate(prompts, params)  # LayerNorm, GELU, learned positions
    Engine(make_model("mixtral")).generate(prompts, params)  # experts
    off = make_model("llama")
    off.decode_in_one_call = False
    assert [o.tokens for o in Engine(off).generate(prompts, params)] == sdpa
    assert one_calls == []
    # a mixed step (a decode token and a prefill chunk) runs its groups together, one by one
    model = make_model("llama")
    cache = _cache(model.spec, "paged", model.dtype)
    cache.allocate(0, 4)
    model(torch.tensor([[1, 2, 3, 4]]), cache.prepare([0], 4))
    cache.append_slot(0)
    cache.allocate(1, 3)
    model.forward_groups([(torch.tensor([[5]]), cache.prepare([0], 1)),
                          (torch.tensor([[6, 7, 8]]), cache.prepare([1], 3))])
    assert one_calls == []


@needs_kernel
@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen2.5-7b", "mistral-7b", "gpt2", "mixtral-8x7b", "qwen3-8b",
                                  "gemma-2-9b", "gemma-3-27b", "qwen3-30b-a3b", "gpt-oss-20b", "llama-4-scout",
                                  "deepseek-v3", "glm-4.5"])
def test_the_spec_says_which_models_decode_in_one_call(one_calls, name):
    """`ModelSpec.one_call_layers` is the engine's own rule (the calibrated model prices a model's
    operators by it): a built-in family's decode step runs in one call exactly where it says so."""
    mla = dict(kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16,
               head_dim=32, rotary_dim=16, num_kv_heads=4)
    spec = tiny(name, dense_layers=(0,), **(mla if name == "deepseek-v3" else {})) \
        if name in ("deepseek-v3", "glm-4.5") else tiny(name)
    Engine(build_model(spec, seed=0)).generate([[1, 2, 3, 4, 5]], SamplingParams(max_new_tokens=3))
    assert bool(one_calls) == spec.one_call_layers
    assert spec.one_call_layers == (name in ("llama-3.1-8b", "qwen2.5-7b", "mistral-7b"))


@needs_kernel
def test_a_flop_counter_sees_the_same_gemms_with_or_without_the_one_call(one_calls):
    """Under a dispatch mode the GEMMs run one by one as ops, so `FlopCounterMode` counts them all."""
    model = make_model("llama")
    counts = []
    for one_call in (True, False):
        model.decode_in_one_call = one_call
        cache = _cache(model.spec, "contiguous", model.dtype)
        cache.allocate(0, 6)
        model(torch.tensor([[1, 2, 3, 4, 5, 6]]), cache.prepare([0], 6))
        cache.append_slot(0)
        with FlopCounterMode(display=False) as counter:
            model(torch.tensor([[7]]), cache.prepare([0], 1))
        counts.append(counter.get_total_flops())
    assert one_calls == [] and counts[0] == counts[1] > 0


@needs_kernel
def test_a_block_table_outside_the_cache_is_refused_before_anything_is_written():
    model = make_model("llama")
    cache = _cache(model.spec, "paged", model.dtype)
    cache.allocate(0, 6)
    model(torch.tensor([[1, 2, 3, 4, 5, 6]]), cache.prepare([0], 6))
    cache.append_slot(0)
    meta = cache.prepare([0], 1)
    meta.block_tables = meta.block_tables.clone()
    meta.block_tables[0, 1] = cache.blocks(0)[0].shape[0]  # one past the last block
    meta._memo.clear()
    before = cache.kv.clone()
    with pytest.raises(ValueError, match="block"):
        model(torch.tensor([[7]]), meta)
    assert torch.equal(cache.kv, before)


@needs_kernel
def test_decode_layers_names_arguments_that_do_not_fit():
    model = make_model("llama")
    x = torch.zeros(2, model.spec.hidden_size)
    k = torch.zeros(4, 8, model.spec.num_kv_heads, model.spec.head_dim)
    kw = dict(heads=4, kv_heads=2, head_dim=16, ffn=128, eps=1e-5, cos=torch.zeros(2, 16), sin=torch.zeros(2, 16),
              seq_lens=torch.ones(2, dtype=torch.int32), max_len=1, window=None,
              tables=torch.zeros(2, 1, dtype=torch.int32), k_blocks=k, amx=False)
    with pytest.raises(ValueError, match="decode_layers"):  # ptrs of the wrong width
        cpu_kernels.decode_layers(x, torch.zeros(2, 3, dtype=torch.int64), torch.ones(2), **kw)
    with pytest.raises(ValueError, match="decode_layers"):  # AMX is bf16 only
        cpu_kernels.decode_layers(x, torch.zeros(2, len(cpu_kernels.LAYER_PTRS), dtype=torch.int64), torch.ones(2),
                                  **{**kw, "amx": True})
    with pytest.raises(ValueError, match="decode_layers"):  # a table of another batch
        cpu_kernels.decode_layers(x, torch.zeros(2, len(cpu_kernels.LAYER_PTRS), dtype=torch.int64), torch.ones(2),
                                  **{**kw, "tables": torch.zeros(3, 1, dtype=torch.int32)})


def _step_after_a_change(dtype: str, kind: str, one_call: bool, change, inference: bool = False) -> torch.Tensor:
    """A decode step, `change(model)`, then another on the same cache: the second step's logits."""
    with torch.inference_mode(inference):
        model = make_model("llama", dtype=dtype)
        model.decode_in_one_call = one_call
        cache = _cache(model.spec, kind, model.dtype)
        lens = [4, 6, 5, 7]
        for s, n in enumerate(lens):
            cache.allocate(s, n)
            model(torch.arange(1, n + 1)[None], cache.prepare([s], n))
        for t in (8, 9):
            for s in range(len(lens)):
                cache.append_slot(s)
            logits = model(torch.full((len(lens), 1), t), cache.prepare(list(range(len(lens))), 1))
            if t == 8:
                change(model)
        return logits


def _scale_in_place(model):
    with torch.no_grad():
        model.layers[1].up_weight.mul_(-0.5)  # its version moves


def _replace(model):
    model.layers[0].o_weight = torch.nn.Parameter(model.layers[0].o_weight.detach() * 2, requires_grad=False)
    model.layers[0].attn_norm.weight = torch.nn.Parameter(model.layers[0].attn_norm.weight.detach() + 1,
                                                          requires_grad=False)


def _change_inference_tensor(model):  # no version counter: a change needs ops.clear()
    model.layers[0].qkv_weight.mul_(3)
    model.ops.clear()


@needs_kernel
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("kind", ["contiguous", "paged"])
@pytest.mark.parametrize("change", [_scale_in_place, _replace, _change_inference_tensor])
def test_the_one_call_follows_weights_changed_between_steps(one_calls, dtype, kind, change):
    """Its addresses are kept between steps; a weight changed in place, a parameter replaced, or an
    inference tensor changed and `ops.clear()`ed gives the per-operator logits, never stale weights
    (bf16 at 4 rows on an AMX CPU: its packed copies)."""
    inference = change is _change_inference_tensor
    ours = _step_after_a_change(dtype, kind, True, change, inference)
    assert len(one_calls) == 2
    assert torch.equal(ours, _step_after_a_change(dtype, kind, False, change, inference))
    assert not torch.equal(ours, _step_after_a_change(dtype, kind, True, lambda m: None, inference))


@needs_kernel
def test_the_one_call_follows_the_cache_it_is_given(one_calls):
    """One model, caches of both kinds and block sizes in turn: each step reads its own."""
    model = make_model("llama")
    lens = [4, 6, 5]
    for kind, block in (("paged", 4), ("contiguous", 4), ("paged", 3), ("paged", 4)):
        assert torch.equal(_decode_logits(model, kind, lens, 2, True, block),
                           _decode_logits(model, kind, lens, 2, False, block))
    assert len(one_calls) == 8


@needs_kernel
def test_clearing_the_packed_copies_frees_them_though_the_one_call_ran():
    import gc
    import weakref

    model = make_model("llama", dtype="bf16")
    _decode_logits(model, "paged", [4, 6, 5, 7], 2, True)  # 4 rows: on AMX, from packed copies
    packs = [weakref.ref(entry[3]) for entry in model.ops._packs.values()]
    assert packs
    model.ops.clear()
    gc.collect()
    assert all(ref() is None for ref in packs)
    lens = [4, 6, 5, 7]
    assert torch.equal(_decode_logits(model, "paged", lens, 2, True), _decode_logits(model, "paged", lens, 2, False))
