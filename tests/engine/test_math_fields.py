"""Nothing loads silently wrong: every Hugging Face config field in `MATH_FIELDS` is honoured
(the loaded model equals `transformers` on the same checkpoint) or refused with its name."""

from __future__ import annotations

import pytest
import torch

from llmperf.engine import from_pretrained, hf_config
from llmperf.engine.weights import MATH_FIELDS, honour_hf_fields

from engine_testing import SPECS, hf_twin, make_model

transformers = pytest.importorskip("transformers")


_GEMMA2 = dict(model_type="gemma2", vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64)


def _cfg(kind: str, **changes):
    cfg = hf_config(SPECS[kind]())
    cfg.update(changes)
    return cfg


# field -> (base spec, config changes, expected ModelSpec changes or the refusal)
CASES = {
    "sliding_window": ("llama", dict(model_type="mistral", sliding_window=5), dict(sliding_window=5)),
    "use_sliding_window": ("qwen2", dict(use_sliding_window=True, sliding_window=7, max_window_layers=0),
                           dict(sliding_window=7)),
    "max_window_layers": ("qwen2", dict(use_sliding_window=True, sliding_window=7, max_window_layers=1), "refused"),
    # read per model type by the spec loader (ModelSpec.from_hf_config), which every family shares
    "layer_types": ("hf", dict(_GEMMA2, model_type="gemma3_text", sliding_window=5,
                               layer_types=["full_attention", "sliding_attention"]),
                    dict(layer_types=("full", "sliding"), sliding_window=5)),
    "scale_attn_weights": ("gpt2", dict(scale_attn_weights=False), dict(attn_scale=False)),
    "scale_attn_by_inverse_layer_idx": ("gpt2", dict(scale_attn_by_inverse_layer_idx=True),
                                        dict(attn_scale_inverse_layer_idx=True)),
    "attn_logit_softcapping": ("hf", dict(_GEMMA2, attn_logit_softcapping=50.0), dict(attn_softcap=50.0)),
    "final_logit_softcapping": ("hf", dict(_GEMMA2, final_logit_softcapping=30.0), dict(final_softcap=30.0)),
    "attention_chunk_size": ("hf", dict(_GEMMA2, model_type="llama4_text", attention_chunk_size=8,
                                        num_local_experts=4), dict(attention_chunk_size=8)),
}


def test_every_math_field_has_a_case():
    assert set(CASES) == set(MATH_FIELDS)


@pytest.mark.parametrize("field", sorted(MATH_FIELDS))
def test_math_field_is_honoured_or_refused(field):
    kind, changes, expected = CASES[field]
    if kind == "hf":  # the model types that define the field: the spec loader reads it
        from llmperf.specs import ModelSpec
        got = ModelSpec.from_hf_config(changes)
        for name, value in expected.items():
            assert getattr(got, name) == value, f"{field} not honoured: {name}={getattr(got, name)!r}"
        assert MATH_FIELDS[field].startswith("honoured")
        return
    spec = SPECS[kind]()
    if expected == "refused":
        assert MATH_FIELDS[field].startswith("refused") or "refused" in MATH_FIELDS[field]
        with pytest.raises(ValueError, match=field):
            honour_hf_fields(spec, _cfg(kind, **changes))
        return
    got = honour_hf_fields(spec, _cfg(kind, **changes))
    for name, value in expected.items():
        assert getattr(got, name) == value, f"{field} not honoured: {name}={getattr(got, name)!r}"


def test_qwen2_window_off_unless_enabled_and_full_layers():
    spec = SPECS["qwen2"]()
    assert honour_hf_fields(spec, _cfg("qwen2", sliding_window=4, use_sliding_window=False)).sliding_window is None
    assert honour_hf_fields(spec, _cfg("qwen2", sliding_window=4, use_sliding_window=True,
                                       max_window_layers=spec.num_layers)).sliding_window is None


@pytest.mark.parametrize("kind", ["mistral", "gpt2_scaled"])
def test_from_pretrained_honours_the_checkpoint(tmp_path, kind):
    """A saved HF checkpoint with a sliding window / GPT-2 scalings loads into a model equal to HF's."""
    model = make_model(kind, seed=4)
    hf = hf_twin(model)
    hf.save_pretrained(tmp_path)
    loaded = from_pretrained(tmp_path, dtype="fp32")
    assert loaded.spec.sliding_window == model.spec.sliding_window
    assert (loaded.spec.attn_scale, loaded.spec.attn_scale_inverse_layer_idx) == (
        model.spec.attn_scale, model.spec.attn_scale_inverse_layer_idx)
    tokens = torch.randint(0, model.spec.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens, all_logits=True), hf(tokens).logits, rtol=1e-5, atol=1e-5)


def test_triton_generates_what_sdpa_generates_with_a_window():
    """The sliding window (smaller than the prompt) reaches the triton kernels through the engine."""
    from llmperf.engine import Engine, SamplingParams

    from engine_testing import kernels_available

    ok, why = kernels_available()
    if not ok:
        pytest.skip(why)
    prompts = [list(range(1, 10)), list(range(20, 27))]
    got = [Engine(make_model("mistral", seed=1), attention=backend).generate(prompts, SamplingParams(max_new_tokens=4))
           for backend in ("triton", "sdpa")]
    assert [r.tokens for r in got[0]] == [r.tokens for r in got[1]]


_LLAMA = dict(model_type="llama", vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
_GPT2 = dict(model_type="gpt2", vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64, eos_token_id=0,
             bos_token_id=0)
# Fields that change the math and that the spec loader (llmperf.specs.hf) reads: each checkpoint
# loads equal to transformers, or is refused naming the field.
VARIANTS = {
    "head_dim": (dict(_LLAMA, head_dim=32), None),
    "hidden_act": (dict(_LLAMA, hidden_act="gelu_pytorch_tanh"), None),
    "attention_bias+mlp_bias": (dict(_LLAMA, attention_bias=True, mlp_bias=True), None),
    "rope_scaling linear": (dict(_LLAMA, rope_scaling=dict(rope_type="linear", factor=2.0)), None),
    "rope_scaling dynamic": (dict(_LLAMA, rope_scaling=dict(rope_type="dynamic", factor=2.0)), "rope_type"),
    "rope_scaling yarn": (dict(_LLAMA, rope_scaling=dict(rope_type="yarn", factor=2.0,
                                                         original_max_position_embeddings=32)), None),
    "rope_scaling yarn mscale": (dict(_LLAMA, rope_scaling=dict(rope_type="yarn", factor=4.0, beta_fast=16, beta_slow=2,
                                                                original_max_position_embeddings=16, mscale=0.8,
                                                                mscale_all_dim=0.5)), None),
    "tie_word_embeddings": (dict(_LLAMA, tie_word_embeddings=True), None),
    "rope_theta+rms_norm_eps": (dict(_LLAMA, rope_theta=500.0, rms_norm_eps=1e-3), None),
    "mistral head_dim+window": (dict(_LLAMA, model_type="mistral", sliding_window=4, head_dim=8), None),
    "qwen2 mixed windows": (dict(_LLAMA, model_type="qwen2", use_sliding_window=True, sliding_window=4,
                                 max_window_layers=1), "layer_types|max_window_layers"),
    "mixtral": (dict(_LLAMA, model_type="mixtral", num_local_experts=4, num_experts_per_tok=2, sliding_window=5), None),
    "gpt2 activation_function+n_inner": (dict(_GPT2, activation_function="relu", n_inner=80), None),
    "gpt2 reorder_and_upcast_attn": (dict(_GPT2, reorder_and_upcast_attn=True), None),
    "gpt2 layer_norm_epsilon": (dict(_GPT2, layer_norm_epsilon=1e-2), None),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_checkpoint_variants_load_equal_to_transformers_or_are_refused(tmp_path, name):
    cfg, refused = VARIANTS[name]
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**cfg),
                                                       dtype=torch.float32).eval()
    with torch.no_grad():
        for p in hf.parameters():  # away from the init's zeros and ones, so every weight matters
            p.add_(torch.randn_like(p) * 0.05)
    hf.save_pretrained(tmp_path)
    if refused:
        with pytest.raises(ValueError, match=refused):
            from_pretrained(tmp_path, dtype="fp32")
        return
    model = from_pretrained(tmp_path, dtype="fp32")
    tokens = torch.randint(0, 128, (2, 20), generator=torch.Generator().manual_seed(1))  # > every window
    with torch.no_grad():
        torch.testing.assert_close(model(tokens, all_logits=True), hf(tokens).logits, rtol=1e-5, atol=1e-5)
