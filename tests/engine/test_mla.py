"""Multi-head latent attention (DeepSeek-V3, DeepSeek-V2 / V2-Lite, Kimi-K2 by config) from tiny
checkpoints saved by transformers, every layer dense (`first_k_dense_replace` = the layer count): the
same logits and generate() tokens; the absorbed and unabsorbed forms giving the same logits and
tokens whichever is forced; a cache of one (R + Dr)-wide latent per token and layer, its bytes per
token the analytical model's; the engine's FLOPs of both forms equal to the analytical model's
(`torch.utils.flop_counter`, the dense attention convention)."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from llmperf.analysis import ForwardModel
from llmperf.engine import (
    OP_NAMES,
    ContiguousKVCache,
    Engine,
    PagedKVCache,
    Recorder,
    SamplingParams,
    build_model,
    from_pretrained,
    to_hf_state_dict,
)
from llmperf.engine.mla import set_mla_mode
from llmperf.specs import ModelSpec, Precision, load_model

from checkpoints import CASES, ENGINES, PROMPTS, assert_generation_matches, assert_logits_match, saved_checkpoint
from engine_testing import hf_generate, hf_twin, kernels_available

# hidden 64, 4 heads, kv_lora_rank 32, qk_rope 16, qk_nope 16, v_head 24 (so V is narrower than q/k),
# rms_norm_eps 1e-5 (the latent norms keep transformers' 1e-6), every layer dense
_BASE = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=4, max_position_embeddings=64, kv_lora_rank=32, qk_rope_head_dim=16,
             qk_nope_head_dim=16, v_head_dim=24, first_k_dense_replace=3, n_routed_experts=8, num_experts_per_tok=2,
             rms_norm_eps=1e-5)
_YARN = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16, mscale=1.0, mscale_all_dim=1.0,
             beta_fast=32, beta_slow=1)
CONFIGS = {
    # q_lora_rank, yarn with mscale_all_dim (the softmax scale's mscale^2), interleaved rotary pairs
    "deepseek_v3": dict(_BASE, model_type="deepseek_v3", q_lora_rank=48, rope_scaling=_YARN, rope_interleave=True),
    # V2-Lite: no q_lora_rank (q_proj), complex rotary pairs; attention_bias on q-less kv_a and o
    "deepseek_v2": dict(_BASE, model_type="deepseek_v2", q_lora_rank=None, attention_bias=True),
    # Kimi-K2's config.json: DeepSeek-V3's architecture under model_type kimi_k2 (transformers 5 has no
    # such type: the checkpoint is saved as deepseek_v3 and its config rewritten as Kimi publishes it)
    "kimi_k2": dict(_BASE, model_type="deepseek_v3", q_lora_rank=48, n_group=1, topk_group=1,
                    rope_scaling=dict(_YARN, beta_fast=1.0, beta_slow=1.0)),
}
# DeepSeek-V3 with rope_interleave false: rotate-half pairs (logits only)
HALVES = dict(_BASE, model_type="deepseek_v3", q_lora_rank=48, rope_interleave=False)


def _as_kimi(path) -> None:
    """Rewrite a saved deepseek_v3 config.json as Kimi-K2 publishes its own: model_type kimi_k2, rope
    settings at the top level (`rope_theta`, `rope_scaling` with `type`), no `rope_interleave`."""
    f = path / "config.json"
    cfg = json.loads(f.read_text())
    rope = cfg.pop("rope_parameters")
    cfg.pop("rope_interleave", None)
    cfg["model_type"] = "kimi_k2"
    cfg["rope_theta"] = rope.pop("rope_theta")
    rope["type"] = rope.pop("rope_type")
    cfg["rope_scaling"] = rope
    f.write_text(json.dumps(cfg))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    out = {}
    for name, cfg in CONFIGS.items():
        path = tmp_path_factory.mktemp(name)
        out[name] = (path, saved_checkpoint(cfg, path, seed=5, noise=0.2))  # noise: varied tokens
        if name == "kimi_k2":
            _as_kimi(path)
    return out


_MEMO: dict = {}


def test_the_checkpoints_are_what_they_claim(checkpoints):
    for name, (path, _) in checkpoints.items():
        spec = ModelSpec.from_hf_config(path)
        assert spec.is_mla and not spec.is_moe and spec.kv_width_per_token_per_layer == 48, name
        assert (spec.q_lora_rank is None) == (name == "deepseek_v2")
        assert spec.rope_interleaved  # V3's rope_interleave, V2's complex form, Kimi's default
    assert json.loads((checkpoints["kimi_k2"][0] / "config.json").read_text())["model_type"] == "kimi_k2"


@pytest.mark.parametrize("attention", ["sdpa", "naive"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_equal_transformers(checkpoints, name, attention):
    path, hf = checkpoints[name]
    assert_logits_match(path, hf, attention=attention)


def test_rotate_half_layout_logits_equal_transformers(tmp_path):
    hf = saved_checkpoint(HALVES, tmp_path, seed=6, noise=0.2)
    assert not ModelSpec.from_hf_config(tmp_path).rope_interleaved
    assert_logits_match(tmp_path, hf)


#: Kimi-K2's checkpoint differs from DeepSeek-V3's in its config only: one case of generate() suffices
GENERATIONS = [(name, case, engine) for name in CONFIGS for case in CASES for engine in ENGINES
               if name != "kimi_k2" or (case, engine) == ("greedy", "chunked")]


@pytest.mark.parametrize("name,case,engine", GENERATIONS)
def test_tokens_equal_transformers_generate(checkpoints, name, case, engine):
    path, hf = checkpoints[name]
    assert_generation_matches(path, hf, case, engine, memo=_MEMO)


# ---- absorbed == unabsorbed -----------------------------------------------------------------------
def _stepwise_logits(model, cache_kind: str, mode: str) -> list[torch.Tensor]:
    """Logits of a ragged batch through a cache: a prefill, an extend of 3 tokens, then 4 decode steps,
    every step in the forced form `mode`."""
    set_mla_mode(model, mode)
    cache = (PagedKVCache(model.spec, num_blocks=32, block_size=4) if cache_kind == "paged"
             else ContiguousKVCache(model.spec, max_batch=2, max_seq_len=32))
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, model.spec.vocab_size, (1, n), generator=g) for n in (9, 5)]
    out = []
    with torch.no_grad():
        for s, p in enumerate(prompts):  # ragged prefills, one sequence each
            cache.allocate(s, p.shape[1])
            out.append(model(p, cache.prepare([s], p.shape[1])))
        extend = torch.randint(0, model.spec.vocab_size, (2, 3), generator=g)
        for s in (0, 1):
            cache.reserve(s, 3)
        out.append(model(extend, cache.prepare([0, 1], 3)))  # extend over ragged cached contexts
        for _ in range(4):
            for s in (0, 1):
                cache.append_slot(s)
            out.append(model(out[-1].argmax(-1)[:, None], cache.prepare([0, 1], 1)))
    return out


@pytest.mark.parametrize("cache_kind", ["paged", "contiguous"])
@pytest.mark.parametrize("attention", ["sdpa", "naive"])
def test_absorbed_and_unabsorbed_give_the_same_logits(checkpoints, attention, cache_kind):
    model = from_pretrained(checkpoints["deepseek_v3"][0], dtype="fp32", attention=attention)
    runs = {mode: _stepwise_logits(model, cache_kind, mode) for mode in ("absorbed", "unabsorbed", "auto")}
    for mode in ("absorbed", "auto"):
        for a, b in zip(runs[mode], runs["unabsorbed"]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("engine", ["paged", "chunked"])
@pytest.mark.parametrize("mode", ["absorbed", "unabsorbed"])
@pytest.mark.parametrize("name", ["deepseek_v3", "deepseek_v2"])
def test_either_form_for_every_step_gives_transformers_tokens(checkpoints, name, mode, engine):
    path, hf = checkpoints[name]
    params = CASES["greedy"]
    expected = _MEMO.get((str(path), "greedy")) or hf_generate(hf, [list(p) for p in PROMPTS], params)
    model = from_pretrained(path, dtype="fp32")
    set_mla_mode(model, mode)
    outputs = Engine(model, **ENGINES[engine]).generate([list(p) for p in PROMPTS], params)
    assert [[c.tokens for c in o.completions] for o in outputs] == expected


def test_set_mla_mode_refuses_bad_input(checkpoints):
    model = from_pretrained(checkpoints["deepseek_v2"][0], dtype="fp32")
    with pytest.raises(ValueError, match="mla_mode: must be one of"):
        set_mla_mode(model, "fused")
    with pytest.raises(ValueError, match="no multi-head latent attention"):
        set_mla_mode(build_model(ModelSpec(name="t", vocab_size=64, hidden_size=32, num_layers=1, num_heads=2,
                                           ffn_size=64, max_positions=32)), "absorbed")


@pytest.mark.parametrize("backend", ["sdpa", "naive"])
@pytest.mark.parametrize("q_lora_rank", [48, None])
def test_operator_names_are_the_analytical_models(q_lora_rank, backend):
    """Every layer records the analytical model's MLA operators once each (prefill: kv_b_proj;
    decode: q_absorb, v_absorb). The order differs in one place: the engine up-projects and absorbs
    after the cache write (an extend step decompresses the cached latents with the new ones), the
    analytical model lists kv_b_proj and q_absorb before rope."""
    model = build_model(_spec(q_lora_rank=q_lora_rank), seed=0, attention=backend)
    rec = Recorder()
    Engine(model).generate([[1, 2, 3, 4, 5]], SamplingParams(max_new_tokens=3), recorder=rec)
    df = rec.trace.to_frame()
    assert set(df["op"]) <= set(OP_NAMES)
    fm = ForwardModel(model=model.spec, precision=Precision.uniform("fp32"),
                      attention="naive" if backend == "naive" else "fused", fused_gate_up=True)
    for phase, T in (("prefill", 5), ("decode", 1)):
        step = df[(df.phase == phase) & (df.step == 0)]
        for layer in range(model.spec.num_layers):
            assert sorted(step[step.layer == layer].op) == sorted(o.name for o in fm.layer_ops(1, T, T))


# ---- the latent cache ---------------------------------------------------------------------------
def _spec(**changes) -> ModelSpec:
    base = dict(name="mla", vocab_size=128, hidden_size=64, num_layers=3, num_heads=4, head_dim=32, ffn_size=96,
                max_positions=64, kv_lora_rank=32, q_lora_rank=48, qk_nope_head_dim=16, qk_rope_head_dim=16,
                v_head_dim=24, rotary_dim=16, rope_interleaved=True, norm_eps=1e-5)
    return ModelSpec(**{**base, **changes})


@pytest.mark.parametrize("dtype,name", [(torch.float32, "fp32"), (torch.bfloat16, "bf16")])
def test_the_latent_cache_holds_r_plus_dr_per_token_and_layer(dtype, name):
    spec = _spec()
    paged = PagedKVCache(spec, num_blocks=10, block_size=4, dtype=dtype)
    contiguous = ContiguousKVCache(spec, max_batch=2, max_seq_len=12, dtype=dtype)
    assert paged.kv.shape == (3, 1, 10, 4, 1, 48) and contiguous.kv.shape == (3, 1, 2, 1, 12, 48)
    expected = 3 * (32 + 16) * dtype.itemsize
    for cache, slots in ((paged, 40), (contiguous, 24)):
        assert cache.bytes_per_token == expected == spec.kv_bytes_per_token(name) == spec.kv_cache(name).bytes_per_token
        assert cache.capacity_bytes == slots * expected == cache.kv.numel() * cache.kv.element_size()
    k, v = paged.pools(0)
    assert k.shape == (10, 4, 1, 48) and v.data_ptr() == k.data_ptr()  # V is read from the latent itself


def test_published_deepseek_v3_latent_is_70272_bytes_per_token_in_fp16():
    """61 layers x (512 + 64) x 2 bytes (DeepSeek-V3: kv_lora_rank 512, qk_rope_head_dim 64)."""
    for model in ("deepseek-v3", "kimi-k2"):
        spec = load_model(model)
        cache = PagedKVCache(spec, num_blocks=1, block_size=1, dtype=torch.float16)
        assert cache.bytes_per_token == 70_272 == spec.kv_bytes_per_token("fp16")


def test_the_cache_holds_the_normed_latent_and_the_rotated_key(checkpoints):
    """What a prefill writes is transformers' own cache content ([kv_a_layernorm(c) | rotated k_rope],
    up to V3's de-interleaved layout of the rotary pairs, which the cache need not share)."""
    path, hf = checkpoints["deepseek_v2"]  # V2 keeps its pairs in place, as the engine does
    model = from_pretrained(path, dtype="fp32")
    ids = torch.tensor([PROMPTS[0]])
    cache = PagedKVCache(model.spec, num_blocks=8, block_size=4)
    cache.allocate(0, ids.shape[1])
    with torch.no_grad():
        model(ids, cache.prepare([0], ids.shape[1]))
        past = hf(ids, use_cache=True).past_key_values
    table = cache.block_table(0)
    for layer in range(model.spec.num_layers):
        ours = cache.pools(layer)[0][table].reshape(-1, 48)[:ids.shape[1]]
        c, k_rope = past.layers[layer].keys[0, 0], past.layers[layer].values[0, 0]
        torch.testing.assert_close(ours, torch.cat((c, k_rope), dim=-1), rtol=1e-5, atol=1e-5)


# ---- weights ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["deepseek_v3", "deepseek_v2"])
def test_weights_load_and_save_back_under_deepseek_names(checkpoints, name):
    path, hf = checkpoints[name]
    for layout in ("out_in", "in_out"):
        ours = to_hf_state_dict(from_pretrained(path, dtype="fp32", weight_layout=layout))
        theirs = {k: v for k, v in hf.state_dict().items() if "rotary" not in k}
        assert set(ours) == set(theirs)
        for k, v in theirs.items():
            assert torch.equal(ours[k], v), k
    attn = "model.layers.0.self_attn."
    expected = (["q_a_proj.weight", "q_a_layernorm.weight", "q_b_proj.weight"] if name == "deepseek_v3"
                else ["q_proj.weight", "kv_a_proj_with_mqa.bias", "o_proj.bias"])
    assert {attn + n for n in expected + ["kv_a_proj_with_mqa.weight", "kv_a_layernorm.weight", "kv_b_proj.weight",
                                          "o_proj.weight"]} <= set(ours)


@pytest.mark.parametrize("changes", [{}, dict(q_lora_rank=None, qkv_bias=True, out_bias=True),
                                     dict(rope_interleaved=False, rope_scaling=_YARN)])
def test_hf_config_of_an_mla_spec_is_a_deepseek_twin(changes):
    """`hf_config` writes a dense DeepSeek-V3 config for an MLA spec; `hf_twin` loads the engine's
    weights into it and transformers computes the engine's logits."""
    model = build_model(_spec(**changes), seed=3)
    hf = hf_twin(model)
    assert hf.config.model_type == "deepseek_v3"
    ids = torch.randint(0, 128, (2, 20), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(model(ids, all_logits=True), hf(ids).logits, rtol=1e-5, atol=1e-5)


def test_in_out_layout_gives_the_same_logits(checkpoints):
    path, _ = checkpoints["deepseek_v3"]
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        logits = [from_pretrained(path, dtype="fp32", weight_layout=w)(ids) for w in ("out_in", "in_out")]
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("changes", [{}, dict(q_lora_rank=None), dict(qkv_bias=True, out_bias=True),
                                     dict(q_lora_rank=None, qkv_bias=True, out_bias=True)])
def test_parameters_equal_the_analytical_count(changes):
    spec = _spec(**changes)
    assert sum(p.numel() for p in build_model(spec).parameters()) == spec.param_count


# ---- one q/k/v width for fused kernels -------------------------------------------------------------
@pytest.mark.parametrize("mode", ["unabsorbed", "absorbed"])
def test_sdpa_gets_one_q_k_v_width_for_several_queries_and_the_same_logits(checkpoints, mode, monkeypatch):
    """torch's CPU SDPA runs its flash kernel only for q, k and v of one width (else its math path,
    the scores materialised): every SDPA call of the prefills and the extend gets V at the q/k width,
    the decode steps V as it is, and the logits are the naive backend's (which never widens V)."""
    import torch.nn.functional as F

    widths = []  # (q, k, v) widths of each call
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda q, k, v, **kw: widths.append(
        (q.shape[-1], k.shape[-1], v.shape[-1])) or real(q, k, v, **kw))
    path = checkpoints["deepseek_v3"][0]
    runs = {a: _stepwise_logits(from_pretrained(path, dtype="fp32", attention=a), "paged", mode)
            for a in ("sdpa", "naive")}
    for a, b in zip(runs["sdpa"], runs["naive"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    several, decode = widths[:3 * 3], widths[3 * 3:]  # (two prefills, the extend) x 3 layers; 4 steps x 3 layers
    assert len(decode) == 4 * 3 and all(w[0] == w[1] == w[2] for w in several), widths
    assert all(w[2] < w[1] for w in decode), widths  # V as it is


def test_v_is_read_at_the_q_k_width_without_a_copy_where_its_rows_allow():
    """`_value_at_width`: V the first features of K (absorbed) -> K; V followed by K in each row
    (unabsorbed) -> the wider view from V's start, its first Dv features V's; else V zero-padded."""
    from llmperf.engine.mla import _value_at_width

    vk = torch.randn(2, 5, 3, 24 + 32)  # (B, S, H, Dv + Dq)
    K, V = vk[..., 24:].transpose(1, 2), vk[..., :24].transpose(1, 2)
    wide = _value_at_width(K, V)
    assert wide.shape == K.shape and wide.data_ptr() == V.data_ptr() and torch.equal(wide[..., :24], V)
    assert _value_at_width(K, K[..., :24]) is K
    alone = V.contiguous()
    padded = _value_at_width(K, alone)
    assert torch.equal(padded[..., :24], alone) and not padded[..., 24:].any()
    assert _value_at_width(K, K) is K
    with pytest.raises(ValueError, match="v_head_dim"):
        _value_at_width(V, K)


# ---- what the engine refuses ------------------------------------------------------------------------
@pytest.mark.parametrize("field,value", [("sliding_window", 8), ("attention_chunk_size", 8), ("nope_layers", (1,)),
                                         ("attn_softcap", 30.0), ("query_pre_attn_scalar", 20),
                                         ("sandwich_norms", True), ("attn_scale", False)])
def test_features_transformers_mla_lacks_are_refused_by_name(field, value):
    with pytest.raises(ValueError, match=f"^{field}: the engine's multi-head latent attention"):
        build_model(_spec(**{field: value}))


def test_a_rotary_width_other_than_qk_rope_head_dim_is_refused():
    with pytest.raises(ValueError, match="^rotary_dim: multi-head latent attention rotates exactly"):
        build_model(_spec(rotary_dim=8))


# ---- FLOPs against the analytical model --------------------------------------------------------------
def _analytical_flops(spec: ModelSpec, batch: int, q_len: int, kv_len: int, mode: str) -> float:
    """Matrix products of one forward under the dense attention convention (the naive backend
    materialises the whole masked rectangle), as `torch.utils.flop_counter` counts them."""
    fm = ForwardModel(model=spec, precision=Precision(), attention="naive", attention_flops="dense", mla_mode=mode)
    return sum(o.flops for o in fm.forward_ops(batch, q_len, kv_len) if o.kind in ("matmul", "attention"))


def _counted(model, tokens, meta) -> int:
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(tokens, meta)
    return counter.get_total_flops()


@pytest.mark.parametrize("q_lora_rank", [48, None])
@pytest.mark.parametrize("mode", ["auto", "absorbed", "unabsorbed"])
def test_flops_equal_the_analytical_model(mode, q_lora_rank):
    """Prefill of 2 x 7 tokens, an extend of 3 more (kv_b over every cached latent when unabsorbed) and
    a decode step at context 11, each counted on the naive backend; `auto` is unabsorbed for the
    first two, absorbed for the decode."""
    spec = _spec(q_lora_rank=q_lora_rank)
    model = build_model(spec, seed=1, attention="naive")
    set_mla_mode(model, mode)
    cache = PagedKVCache(spec, num_blocks=16, block_size=4)
    g = torch.Generator().manual_seed(2)
    for s in (0, 1):
        cache.allocate(s, 7)
    steps = [(7, 7), (3, 10), (1, 11)]
    for q_len, kv_len in steps:
        if kv_len > 7:
            for s in (0, 1):
                cache.reserve(s, q_len)
        tokens = torch.randint(0, spec.vocab_size, (2, q_len), generator=g)
        counted = _counted(model, tokens, cache.prepare([0, 1], q_len))
        assert counted == _analytical_flops(spec, 2, q_len, kv_len, mode), (q_len, kv_len)


# ---- triton (the interpreter on CPU) ------------------------------------------------------------------
@pytest.mark.parametrize("cache_kind,mode", [("paged", "auto"), ("paged", "absorbed"), ("paged", "unabsorbed"),
                                             ("contiguous", "auto")])
def test_triton_gives_the_sdpa_logits(checkpoints, cache_kind, mode, monkeypatch):
    """Prefill and extend through `kernels.flash_attention` (V read at the q/k width from each key's
    [v | k] row; the absorbed form with V = the latent), decode through `kernels.mla_decode` over the cache's blocks
    (absorbed) or flash attention over the decompressed keys (unabsorbed)."""
    ok, why = kernels_available()
    if not ok:
        pytest.skip(why)
    import kernels

    calls = []
    real = kernels.mla_decode
    monkeypatch.setattr(kernels, "mla_decode", lambda *a, **k: calls.append(1) or real(*a, **k))
    path, _ = checkpoints["deepseek_v3"]
    runs = {}
    for backend in ("sdpa", "triton"):
        model = from_pretrained(path, dtype="fp32", attention=backend)
        runs[backend] = _stepwise_logits(model, cache_kind, mode)
    for a, b in zip(runs["triton"], runs["sdpa"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert len(calls) == (0 if mode == "unabsorbed" else 4 * 3)  # 4 decode steps x 3 layers
