"""Gated DeltaNet hybrids (Qwen3-Next, Qwen3.5 dense and MoE) in the engine against `transformers` in fp32:
full-forward logits over a prompt past one 64-token chunk, decode-step logits through the cache, greedy
`generate()` tokens (paged, contiguous, chunked prefill, ragged batches), beams; the two forms of the delta
rule against each other in fp64; the per-sequence state's bookkeeping and accounting; the engine features
that refuse linear layers by name. Each tiny config is saved by transformers and loaded as a user's
checkpoint (`from_pretrained`: `ModelSpec.from_hf_config`, safetensors, experts one by one)."""

from __future__ import annotations

import pytest
import torch

from llmperf.engine import Engine, SamplingParams, from_pretrained
from llmperf.engine.cache import ContiguousKVCache, PagedKVCache
from llmperf.engine.deltanet import chunk_gated_delta_rule, recurrent_gated_delta_rule
from llmperf.engine.weights import to_hf_state_dict

from checkpoints import saved_checkpoint
from engine_testing import OpNames, hf_generate

transformers = pytest.importorskip("transformers")

_COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
               linear_key_head_dim=16, linear_value_head_dim=8, linear_conv_kernel_dim=4,
               max_position_embeddings=256, tie_word_embeddings=False, rms_norm_eps=1e-6,
               rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25))
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48)
CONFIGS = {
    "qwen3_next": dict(_COMMON, **_MOE, model_type="qwen3_next", norm_topk_prob=True, decoder_sparse_step=1,
                       mlp_only_layers=[]),
    "qwen3_5_text": dict(_COMMON, model_type="qwen3_5_text"),
    "qwen3_5_moe_text": dict(_COMMON, **_MOE, model_type="qwen3_5_moe_text"),
}
LONG = [int(t) for t in torch.randint(0, 256, (70,), generator=torch.Generator().manual_seed(5))]  # > one chunk
PROMPTS = [LONG, [5, 100, 17], LONG[:33]]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """name -> (transformers model, the engine's `from_pretrained` of the checkpoint transformers saved), fp32,
    the weights moved off their init by seeded noise."""
    import transformers.utils.logging as hf_logging

    hf_logging.set_verbosity_error()
    out = {}
    for name, cfg in CONFIGS.items():
        path = tmp_path_factory.mktemp(name)
        hf = saved_checkpoint(cfg, path)
        out[name] = (hf, from_pretrained(path, dtype="fp32"))
    return out


def _diff(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    d = (a - b).abs().max().item()
    return d, d / b.abs().max().item()


def test_chunked_and_recurrent_forms_agree_in_fp64():
    g = torch.Generator().manual_seed(0)
    B, T, nk, nv, dk, dv = 2, 150, 2, 4, 8, 6
    q, k = (torch.randn(B, T, nk, dk, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(B, T, nv, dv, generator=g, dtype=torch.float64)
    gate = -torch.rand(B, T, nv, generator=g, dtype=torch.float64)
    beta = torch.rand(B, T, nv, generator=g, dtype=torch.float64)
    init = torch.randn(B, nv, dk, dv, generator=g, dtype=torch.float64)
    o_c, s_c = chunk_gated_delta_rule(q, k, v, gate, beta, init)
    o_r, s_r = recurrent_gated_delta_rule(q, k, v, gate, beta, init)
    assert o_c.dtype == torch.float64
    torch.testing.assert_close(o_c, o_r, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s_c, s_r, rtol=1e-10, atol=1e-10)
    # a prompt split in two continues through the state: the same output and final state
    o_a, s_a = chunk_gated_delta_rule(q[:, :70], k[:, :70], v[:, :70], gate[:, :70], beta[:, :70], init)
    o_b, s_b = chunk_gated_delta_rule(q[:, 70:], k[:, 70:], v[:, 70:], gate[:, 70:], beta[:, 70:], s_a)
    torch.testing.assert_close(torch.cat((o_a, o_b), dim=1), o_c, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s_b, s_c, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_equal_transformers(models, name):
    hf, model = models[name]
    ids = torch.randint(0, 256, (2, 70), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours, theirs = model(ids, all_logits=True), hf(ids).logits
    absd, rel = _diff(ours, theirs)
    assert rel < 1e-5, (absd, rel)


@pytest.mark.parametrize("cache", ["paged", "contiguous"])
@pytest.mark.parametrize("name", CONFIGS)
def test_decode_step_logits_equal_transformers(models, name, cache):
    """A 70-token prefill through the cache, then 4 one-token steps: each step's logits are transformers'
    logits of the whole sequence so far."""
    hf, model = models[name]
    c = (PagedKVCache(model.spec, num_blocks=32, block_size=8) if cache == "paged"
         else ContiguousKVCache(model.spec, max_batch=1, max_seq_len=80))
    seq = list(LONG)
    assert c.allocate(7, len(seq))
    worst = 0.0
    with torch.no_grad():
        logits = model(torch.tensor([seq]), c.prepare([7], len(seq)))
        for _ in range(4):
            ref = hf(torch.tensor([seq])).logits[:, -1]
            worst = max(worst, _diff(logits, ref)[1])
            seq.append(int(logits.argmax()))
            assert c.append_slot(7)
            logits = model(torch.tensor([seq[-1:]]), c.prepare([7], 1))
    assert worst < 1e-5, worst


ENGINES = {
    "paged": dict(cache="paged", block_size=8),
    "contiguous": dict(cache="contiguous"),
    "chunked": dict(cache="paged", block_size=8, chunked_prefill=True, max_batched_tokens=24),
}


@pytest.fixture(scope="module")
def expected(models):
    """transformers' greedy tokens for each prompt alone."""
    return {name: hf_generate(hf, PROMPTS, SamplingParams(max_new_tokens=6)) for name, (hf, _) in models.items()}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", CONFIGS)
def test_generate_equals_transformers(models, expected, name, engine):
    """A ragged batch (70, 3 and 33 tokens; chunked: 24 tokens a step, so the long prompt is prefilled over
    3 steps beside the others' decode steps) gives each prompt transformers' tokens alone."""
    _, model = models[name]
    out = Engine(model, **ENGINES[engine]).generate(PROMPTS, SamplingParams(max_new_tokens=6, eos_token_id=None))
    assert [[c.tokens for c in o.completions] for o in out] == expected[name]


def test_beam_search_and_samples_fork_the_state(models):
    hf, model = models["qwen3_5_text"]
    params = SamplingParams(max_new_tokens=5, num_beams=3, num_return_sequences=2, eos_token_id=None)
    out = Engine(model, cache="paged", block_size=8).generate([LONG[:20]], params)
    assert [[c.tokens for c in o.completions] for o in out] == hf_generate(hf, [LONG[:20]], params)
    # three top-1 samples of one prompt: the forks continue the prompt's state, so all equal the greedy tokens
    greedy = Engine(model).generate([LONG[:20]], SamplingParams(max_new_tokens=5, eos_token_id=None))
    forked = Engine(model).generate([LONG[:20]], SamplingParams(max_new_tokens=5, num_return_sequences=3,
                                                                do_sample=True, top_k=1, eos_token_id=None))
    assert [c.tokens for c in forked[0].completions] == [greedy[0].tokens] * 3


def test_state_bookkeeping_and_accounting(models):
    _, model = models["qwen3_next"]
    spec = model.spec
    c = PagedKVCache(spec, num_blocks=16, block_size=8)
    per_layer = (spec.linear_conv_kernel - 1) * spec.linear_conv_dim * 4 + spec.linear_num_value_heads * \
        spec.linear_key_head_dim * spec.linear_value_head_dim * 4
    assert c.state_bytes_per_seq == 3 * per_layer  # three linear layers, fp32 conv and recurrent state
    assert c.bytes_per_token == 2 * 1 * spec.num_kv_heads * spec.head_dim * 4  # K/V of the one full layer only
    assert c.kv.shape[0] == 1 and not c.supports_prefix_sharing
    for s in range(6):  # past the initial slots: the state grows
        assert c.allocate(s, 3)
    u = c.usage()
    assert u.state_bytes == 6 * c.state_bytes_per_seq and u.state_capacity_bytes >= u.state_bytes
    c.states.recurrent[:, c.states._slot[2]] = 1.0
    c.free(2)
    assert c.usage().state_bytes == 5 * c.state_bytes_per_seq
    assert c.allocate(9, 3)  # a new sequence reuses the slot, zeroed
    assert c.states.recurrent[:, c.states._slot[9]].abs().max() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_bytes_equal_the_analytical_model(models, dtype):
    """The engine keeps the recurrent state in fp32 and the convolution's inputs at its dtype, as transformers
    does: `KVCacheSpec.state_bytes` of the spec with `state_dtype` fp32, at that activation dtype (vLLM keeps
    both at the model's dtype unless the config names `mamba_ssm_dtype`, llmperf's default)."""
    from llmperf.specs import Precision

    _, model = models["qwen3_5_text"]
    spec = model.spec
    name = "fp32" if dtype == torch.float32 else "bf16"
    c = ContiguousKVCache(spec, max_batch=2, max_seq_len=16, dtype=dtype)
    assert c.state_bytes_per_seq == spec.scaled(state_dtype="fp32").kv_cache(Precision.uniform(name)).state_bytes
    assert c.bytes_per_token == spec.kv_cache(Precision.uniform(name)).bytes_per_token


def test_operators_are_recorded_under_the_vocabulary_names(models):
    _, model = models["qwen3_next"]
    rec = OpNames()
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]), rec=rec)
    assert rec.of_layer(0)[:8] == ["attn_norm", "in_proj_qkvz", "in_proj_ba", "conv1d", "deltanet", "gated_norm",
                                   "o_proj", "attn_residual"]
    assert "attn_gate" in rec.of_layer(3)


def test_weights_save_back_under_transformers_names(models):
    for name, fmt in (("qwen3_next", "fused"), ("qwen3_5_text", "split")):
        hf, model = models[name]
        back = to_hf_state_dict(model, linear_format=fmt)
        theirs = hf.state_dict()
        for key, value in back.items():
            assert torch.equal(value, theirs[key]), key


def test_features_without_state_rollback_refuse_linear_layers(models):
    from llmperf.engine import shard_spec, speculative_generate, streaming_generate
    from llmperf.errors import SpecError

    _, model = models["qwen3_5_text"]
    with pytest.raises(ValueError, match="speculative decoding: .*linear"):
        speculative_generate(model, model, [[1, 2]], num_draft_tokens=2, max_new_tokens=2)
    with pytest.raises(ValueError, match="StreamingLLM: .*linear"):
        streaming_generate(model, [[1, 2]], sink_tokens=1, window=4, max_new_tokens=2)
    with pytest.raises(SpecError, match="layer_types: .*Gated DeltaNet"):
        shard_spec(model.spec, 2)
    with pytest.raises(ValueError, match="prefix_sharing: .*Gated DeltaNet"):
        Engine(model, prefix_sharing=True)
