"""Gated DeltaNet hybrids (Qwen3-Next, Qwen3.5 dense and MoE, the Qwen3.5 multimodal wrappers) read from
their config.json against transformers: parameter counts exact (tiny configs and the config classes'
defaults, which are the released shapes), every layer's kind, the per-sequence state transformers'
cache keeps (conv and recurrent state widths), and the refusals."""

from __future__ import annotations

import json
import re

import pytest

from llmperf.errors import SpecError
from llmperf.specs import ModelSpec
from llmperf.specs.hf import model_spec_from_hf_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

_GDN = dict(vocab_size=128, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=256, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
            linear_value_head_dim=8, linear_conv_kernel_dim=4, num_hidden_layers=4)
TINY = {
    # MoE iff (i + 1) % 2 == 0 and i not in mlp_only_layers: layer 1 only; layer 3 full, dense
    "qwen3_next": dict(_GDN, model_type="qwen3_next", intermediate_size=96, num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=32, shared_expert_intermediate_size=48, decoder_sparse_step=2,
                       mlp_only_layers=[3]),
    "qwen3_next-layer_types": dict(_GDN, model_type="qwen3_next", intermediate_size=96, num_experts=4,
                                   num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
                                   layer_types=["full_attention", "linear_attention", "linear_attention",
                                                "full_attention"], partial_rotary_factor=0.5),
    "qwen3_5_text": dict(_GDN, model_type="qwen3_5_text", intermediate_size=96, full_attention_interval=2),
    "qwen3_5_moe_text": dict(_GDN, model_type="qwen3_5_moe_text", num_experts=4, num_experts_per_tok=2,
                             moe_intermediate_size=32, shared_expert_intermediate_size=48),
}
WRAPPERS = {"qwen3_5": ("qwen3_5_text", "Qwen3_5ForCausalLM"),
            "qwen3_5_moe": ("qwen3_5_moe_text", "Qwen3_5MoeForCausalLM")}


def hf_model(cfg: dict, device: str = "meta"):
    with torch.device(device):
        return transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**json.loads(
            json.dumps(cfg))))


def n_params(model) -> int:
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


@pytest.mark.parametrize("name", sorted(TINY))
def test_tiny_param_count_is_exact(name):
    assert model_spec_from_hf_config(TINY[name], name="t").param_count == n_params(hf_model(TINY[name]))


@pytest.mark.parametrize("model_type", ["qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"])
def test_default_shapes_param_count_is_exact(model_type):
    """The config classes' defaults are Qwen3-Next-80B-A3B, Qwen3.5-9B's and Qwen3.5-35B-A3B's shapes."""
    cfg = transformers.AutoConfig.for_model(model_type)
    spec = model_spec_from_hf_config(cfg.to_dict(), name="t")
    assert spec.param_count == n_params(hf_model(cfg.to_dict()))


def test_qwen3_next_80b_shape():
    spec = model_spec_from_hf_config(transformers.AutoConfig.for_model("qwen3_next").to_dict(), name="t")
    assert spec.param_count == 79_674_391_296 and spec.layer_types.count("linear") == 36
    assert (spec.linear_key_dim, spec.linear_value_dim, spec.linear_conv_dim) == (2048, 4096, 8192)
    assert spec.rotary_dim == 64 and spec.norm_offset and spec.attn_output_gate and spec.shared_expert_gate
    assert spec.active_param_count < 4e9  # "A3B": 3.9B with the input embedding (llmperf's convention)


@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
def test_multimodal_wrapper_reads_its_text_model(wrapper):
    inner, _arch = WRAPPERS[wrapper]
    text = dict(TINY["qwen3_5_text" if inner == "qwen3_5_text" else "qwen3_5_moe_text"])
    cfg = dict(model_type=wrapper, architectures=["Qwen3_5ForConditionalGeneration"], torch_dtype="bfloat16",
               text_config=text)
    spec = model_spec_from_hf_config(cfg, name="t")
    assert spec.param_count == n_params(hf_model(text)) and spec.dtype == "bf16"
    assert "vision tower is not modelled" in spec.source


def test_layer_kinds():
    q = model_spec_from_hf_config(TINY["qwen3_next"], name="t")
    assert [k.label for k in q.layer_kinds()] == ["linear", "linear/moe", "linear", "full"]
    assert q.rotary_dim == 4  # partial_rotary_factor 0.25 of 16
    q2 = model_spec_from_hf_config(TINY["qwen3_next-layer_types"], name="t")
    assert q2.layer_types == ("full", "linear", "linear", "full") and q2.rotary_dim == 8
    d = model_spec_from_hf_config(TINY["qwen3_5_text"], name="t")
    assert d.layer_types == ("linear", "full") * 2 and not d.is_moe
    moe = model_spec_from_hf_config(TINY["qwen3_5_moe_text"], name="t")
    assert all(k.moe for k in moe.layer_kinds()) and moe.router_renormalize and moe.shared_experts == 1


@pytest.mark.parametrize("name", sorted(TINY))
def test_state_widths_match_transformers_cache(name):
    """A 5-token forward through the tiny model: each linear layer's conv and recurrent state, each full
    layer's K and V, against the spec's per-sequence state and per-token KV widths. The recurrent state is
    value heads x key dim x value dim, exactly."""
    spec = model_spec_from_hf_config(TINY[name], name="t")
    torch.manual_seed(0)
    model = hf_model(TINY[name], device="cpu").eval()
    with torch.no_grad():
        cache = model(torch.randint(0, 128, (1, 5)), use_cache=True).past_key_values
    for kind, layer in zip(spec.layer_kinds(), cache.layers):
        if kind.attention == "linear":
            # transformers keeps K inputs a channel; the next step needs K - 1 (vLLM's and FLA's conv state)
            conv = sum(t.numel() for t in layer.conv_states.values())
            assert conv == spec.linear_conv_dim * spec.linear_conv_kernel
            assert spec.linear_conv_state_elements == conv - spec.linear_conv_dim
            assert sum(t.numel() for t in layer.recurrent_states.values()) == spec.linear_state_elements
        else:
            k, v = layer.keys, layer.values
            assert k.shape[1] * k.shape[3] + v.shape[1] * v.shape[3] == spec.kv_width_per_token_per_layer


def test_saved_by_transformers_reads_back(tmp_path):
    for name in sorted(TINY):
        hf_model(TINY[name]).config.save_pretrained(tmp_path / name)
        back = ModelSpec.from_hf_config(tmp_path / name)
        spec = model_spec_from_hf_config(TINY[name], name="t")
        assert back.layer_kinds() == spec.layer_kinds() and back.param_count == spec.param_count


def test_state_dtype_from_mamba_ssm_dtype():
    spec = model_spec_from_hf_config({**TINY["qwen3_5_text"], "mamba_ssm_dtype": "float32"}, name="t")
    assert spec.state_dtype == "fp32"
    assert model_spec_from_hf_config(TINY["qwen3_5_text"], name="t").state_dtype is None


@pytest.mark.parametrize("cfg,needle", [
    ({**TINY["qwen3_5_text"], "attn_output_gate": False}, "attn_output_gate=False is not modelled"),
    ({**TINY["qwen3_5_text"], "mamba_ssm_dtype": "int8"}, "mamba_ssm_dtype='int8' is not modelled"),
    ({**TINY["qwen3_5_text"], "linear_conv_kernel_dim": 0}, "linear_conv_kernel_dim must be a positive integer"),
    ({**TINY["qwen3_5_text"], "linear_num_key_heads": 3}, "linear_num_key_heads=3 does not divide "
                                                          "linear_num_value_heads=4"),
    ({**TINY["qwen3_5_text"], "layer_types": ["linear_attention", "mamba", "full_attention", "full_attention"]},
     "layer_types='mamba' is not modelled"),
])
def test_refused_in_one_line(cfg, needle):
    with pytest.raises(SpecError, match=re.escape(needle)) as info:
        model_spec_from_hf_config(cfg, name="t")
    assert "\n" not in str(info.value)


def test_model_spec_checks_linear_fields():
    base = model_spec_from_hf_config(TINY["qwen3_5_text"], name="t")
    with pytest.raises(SpecError, match="linear_conv_kernel is not set"):
        base.scaled(linear_conv_kernel=None)
    with pytest.raises(SpecError, match="linear_conv_kernel must be at least 2"):
        base.scaled(linear_conv_kernel=1)
    with pytest.raises(SpecError, match="needs linear"):
        base.scaled(layer_types=None)
    with pytest.raises(SpecError, match="state_dtype"):
        base.scaled(state_dtype="fp7")
