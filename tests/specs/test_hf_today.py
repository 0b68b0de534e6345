"""Today's models (issue 22) against Hugging Face `transformers`: Qwen3 dense and MoE, DeepSeek-V2/V3
(and Kimi-K2, a DeepSeek-V3), GLM-4.5, gpt-oss, Llama 4 (text) and Gemma 2/3 (text).

Parameter-count convention (`ModelSpec.param_count`): every tensor of the checkpoint that transformers
builds, i.e. `model.parameters()` (tied weights once) plus its persistent buffers. The only persistent
buffer is DeepSeek-V3's / GLM-4.5's `e_score_correction_bias` (one fp32 per routed expert per MoE layer,
the noaux_tc routing correction: it is in the checkpoint and read every step). The input embedding is
counted; multi-token-prediction layers (`mtp_layers`) are not (transformers does not build them).
`active_param_count` follows the same convention (input embedding included, MTP excluded), which is how
ARCHITECTURES.md §11 recomputes its table; OpenAI's published "active" figures leave out the input
embedding.

KV: `kv_width_per_token_per_layer` equals the K + V widths transformers' cache stores for one token in
one layer. For multi-head latent attention transformers 5.24 caches the compressed latent (kv_lora_rank,
in the "keys" slot) and the shared rotary key (qk_rope_head_dim, in the "values" slot) as one head each,
as MLA engines (vLLM, SGLang, FlashMLA) do: kv_lora_rank + qk_rope_head_dim. (Older transformers cached
the unabsorbed per-head K and V instead.)
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from llmperf.errors import SpecError
from llmperf.specs import ModelSpec, load_model
from llmperf.specs.hf import HF_CONFIG_FIELDS, HF_REFUSED_FIELDS, model_spec_from_hf_config, read_hf_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# verbatim config.json files as published (provenance in each *.source.txt)
HF_CONFIGS = Path(__file__).parent / "data" / "hf-configs"


def read(cfg: dict) -> ModelSpec:
    return model_spec_from_hf_config(json.loads(json.dumps(cfg)), name="t")


def refused(cfg: dict, needle: str):
    with pytest.raises(SpecError, match=re.escape(needle)) as info:
        read(cfg)
    assert "\n" not in str(info.value)


# ---- transformers' side ----------------------------------------------------------------------------

_TEXT_CLASSES = {"llama4": ("Llama4TextConfig", "Llama4ForCausalLM"),
                 "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM")}


def hf_model(cfg: dict, device: str = "meta"):
    """The transformers causal LM of a config dict: multimodal wrappers build their text model only,
    Kimi-K2 is a DeepSeek-V3."""
    cfg = {k: v for k, v in json.loads(json.dumps(cfg)).items() if k != "quantization_config"}  # transformers
    mt = cfg["model_type"]  # mutates nested dicts (rope_scaling) it is given: a copy
    with torch.device(device):
        if mt in _TEXT_CLASSES:
            config_cls, model_cls = (getattr(transformers, n) for n in _TEXT_CLASSES[mt])
            text = {k: v for k, v in (cfg.get("text_config") or {}).items() if k != "model_type"}
            return model_cls(config_cls(**text))
        if mt == "kimi_k2":
            cfg = {**cfg, "model_type": "deepseek_v3"}
        if mt == "smollm3":  # its token ids default beyond a tiny vocabulary (ids change no count)
            cfg = {**cfg, "pad_token_id": None, "bos_token_id": None, "eos_token_id": None}
        if mt == "kimi_k25":  # its language model; the head is tied to its embedding (asserted)
            model = transformers.AutoModelForImageTextToText.from_config(transformers.Kimi_K25Config(
                text_config=cfg.get("text_config"), tie_word_embeddings=cfg.get("tie_word_embeddings", True)))
            assert model.lm_head.weight is model.get_input_embeddings().weight
            return model.model.language_model
        return transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**cfg))


def checkpoint_tensor_count(model) -> int:
    """parameters() (a tied weight once) + persistent buffers: what the checkpoint holds."""
    n = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    assert n == model.num_parameters()
    for mod in model.modules():
        for name, buf in mod.named_buffers(recurse=False):
            if name not in mod._non_persistent_buffers_set:
                assert name == "e_score_correction_bias", name  # the only one: see the module docstring
                n += buf.numel()
    return n


# ---- the verbatim configs -------------------------------------------------------------------------

def hub_configs() -> dict[str, dict]:
    out = {}
    for p in sorted(HF_CONFIGS.glob("*.json")):
        data = json.loads(p.read_text())
        # fp8 / mxfp4 quantization_config read too (tests/specs/test_quant_checkpoints.py checks the bytes);
        # transformers' meta-device build drops it (hf_model)
        out[p.stem] = data
    return out


HUB = hub_configs()


@pytest.mark.parametrize("name", sorted(HUB))
def test_hub_config_param_count_is_exact(name):
    spec = read(HUB[name])
    assert spec.param_count == checkpoint_tensor_count(hf_model(HUB[name]))


# ARCHITECTURES.md §11, "recomputed" column (input embedding included, MTP excluded), in billions
RECOMPUTED = {
    "DeepSeek-V3": (671.03, 37.55), "GLM-4.5": (352.8, 33.6), "Qwen3-30B-A3B": (30.53, 3.35),
    "Qwen3-8B": (8.19, 8.19), "Qwen2.5-7B": (7.62, 7.62), "gpt-oss-20b": (20.91, 4.19),
    "Llama-4-Scout-17B-16E-Instruct": (107.77, 17.17), "Llama-3.1-8B": (8.03, 8.03),
    "Mixtral-8x7B-v0.1": (46.70, 12.88),
}


@pytest.mark.parametrize("name", sorted(RECOMPUTED))
def test_hub_config_total_and_active_match_the_digest(name):
    spec = read(HUB[name])
    total, active = RECOMPUTED[name]
    assert spec.param_count / 1e9 == pytest.approx(total, rel=1e-3)
    assert spec.active_param_count / 1e9 == pytest.approx(active, rel=1e-3)


def test_hub_configs_layer_structure():
    ds = read(HUB["DeepSeek-V3"])
    assert ds.is_mla and ds.kv_width_per_token_per_layer == 512 + 64 and ds.mtp_layers == 1
    assert ds.dense_layers == (0, 1, 2) and ds.num_moe_layers == 58 and ds.router_score_bias
    assert ds.rope_scaling["type"] == "yarn" and ds.rotary_dim == 64 and ds.head_dim == 192
    glm = read(HUB["GLM-4.5"])
    assert glm.qk_norm == "rmsnorm" and glm.qkv_bias and not glm.out_bias and glm.rotary_dim == 64
    assert glm.dense_layers == (0, 1, 2) and glm.shared_experts == 1 and glm.moe_ffn_size == 1536
    oss = read(HUB["gpt-oss-20b"])
    assert oss.layer_types == ("sliding", "full") * 12 and oss.sliding_window == 128
    assert oss.attn_sinks and oss.router_bias and oss.mlp_bias and oss.experts_per_token == 4
    scout = read(HUB["Llama-4-Scout-17B-16E-Instruct"])
    assert scout.nope_layers == tuple(range(3, 48, 4)) and scout.attention_chunk_size == 8192
    assert scout.layer_types.count("chunked") == 36 and scout.qk_norm == "l2" and scout.shared_experts == 1
    assert scout.dense_layers == () and scout.moe_ffn_size == 8192 and scout.ffn_size == 16384
    assert "vision tower is not modelled" in scout.source
    q3 = read(HUB["Qwen3-30B-A3B"])
    assert q3.qk_norm == "rmsnorm" and q3.num_moe_layers == 48 and q3.head_dim == 128 and q3.sliding_window is None


# ---- tiny configs of each family: every structural switch, exact against transformers --------------

_BASE = dict(vocab_size=128, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False)
_MLA = dict(_BASE, num_key_value_heads=4, intermediate_size=96, moe_intermediate_size=16, n_routed_experts=8,
            num_experts_per_tok=2, kv_lora_rank=32, q_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8,
            v_head_dim=12, num_hidden_layers=3, first_k_dense_replace=1)
_LLAMA4_TEXT = dict(_BASE, head_dim=16, intermediate_size=32, intermediate_size_mlp=48, num_hidden_layers=4,
                    num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2,
                    attention_chunk_size=8, no_rope_layer_interval=2, use_qk_norm=True)
_GEMMA = dict(_BASE, head_dim=32, intermediate_size=96, sliding_window=8, tie_word_embeddings=True)

TINY = {
    # explicit head_dim 32 != 64 / 4; layers >= max_window_layers slide
    "qwen3": dict(_BASE, model_type="qwen3", head_dim=32, intermediate_size=96, num_hidden_layers=4,
                  use_sliding_window=True, sliding_window=8, max_window_layers=2),
    "qwen3-tied-bias": dict(_BASE, model_type="qwen3", head_dim=16, intermediate_size=96, num_hidden_layers=2,
                            attention_bias=True, tie_word_embeddings=True),
    # MoE iff (i + 1) % 2 == 0 and i not in mlp_only_layers: layer 1 only
    "qwen3_moe": dict(_BASE, model_type="qwen3_moe", head_dim=16, intermediate_size=96, moe_intermediate_size=32,
                      num_experts=8, num_experts_per_tok=2, decoder_sparse_step=2, mlp_only_layers=[3],
                      num_hidden_layers=4),
    "deepseek_v3": dict(_MLA, model_type="deepseek_v3", n_shared_experts=2, n_group=2, topk_group=1,
                        topk_method="noaux_tc", scoring_func="sigmoid", routed_scaling_factor=2.5,
                        num_nextn_predict_layers=1,
                        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                                      "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}),
    "deepseek_v3-no-q-lora": dict(_MLA, model_type="deepseek_v3", q_lora_rank=None, n_shared_experts=1,
                                  attention_bias=True, n_group=1, topk_group=1),
    "kimi_k2": dict(_MLA, model_type="kimi_k2", architectures=["DeepseekV3ForCausalLM"], n_shared_experts=1,
                    n_group=1, topk_group=1, first_k_dense_replace=2),
    # V2-Lite style: plain q_proj, softmax greedy routing, 2 shared experts, first layer dense
    "deepseek_v2": dict(_MLA, model_type="deepseek_v2", q_lora_rank=None, n_shared_experts=2, topk_method="greedy"),
    # GLM-5: DSA whose layers 2 and 3 reuse layer 1's top-k (no indexer, no indexer key cached)
    "glm_moe_dsa": dict(_MLA, model_type="glm_moe_dsa", num_hidden_layers=5, n_shared_experts=1, n_group=1,
                        topk_group=1, index_topk=4, index_head_dim=16, index_n_heads=2, index_topk_pattern="FFSSF"),
    # GLM-4.7-Flash: DeepSeek-V3's MLA and MoE, dense layers from mlp_layer_types
    "glm4_moe_lite": dict(_MLA, model_type="glm4_moe_lite", n_shared_experts=1, n_group=1, topk_group=1,
                          mlp_layer_types=["dense", "sparse", "dense"], num_nextn_predict_layers=1),
    "glm4_moe_lite-default-dense": dict(_MLA, model_type="glm4_moe_lite", n_shared_experts=1, n_group=1,
                                        topk_group=1),
    # Kimi K2.5: a DeepSeek-V3 text model (its hub config says kimi_k2), the head tied by the outer config
    "kimi_k25": dict(model_type="kimi_k25", architectures=["KimiK25ForConditionalGeneration"],
                     text_config=dict(_MLA, model_type="kimi_k2", n_shared_experts=1, n_group=1, topk_group=1),
                     torch_dtype="bfloat16"),
    # MiniMax-M2: q/k normed across all heads, rotary_dim as the hub spells it, every layer MoE
    "minimax_m2": dict(_BASE, model_type="minimax_m2", head_dim=16, intermediate_size=32, num_hidden_layers=2,
                       num_local_experts=4, num_experts_per_tok=2, rotary_dim=8),
    # SmolLM3: NoPE layers 1 and 3 (interval 2), which slide (window 8) with use_sliding_window
    "smollm3": dict(_BASE, model_type="smollm3", intermediate_size=96, num_hidden_layers=4, no_rope_layer_interval=2,
                    use_sliding_window=True, sliding_window=8, attention_bias=True),
    "smollm3-no-sliding": dict(_BASE, model_type="smollm3", intermediate_size=96, num_hidden_layers=4,
                               no_rope_layers=[1, 0, 0, 1], sliding_window=8),
    # Seed-OSS: q/k/v biases, none on o_proj, head_dim 32 != 64 / 4
    "seed_oss": dict(_BASE, model_type="seed_oss", head_dim=32, intermediate_size=96, num_hidden_layers=2),
    # OLMo 2 / 3: q/k normed across heads, post norms; OLMo 3 slides layers 0-2 (window 8), layer 3 full
    "olmo2": dict(_BASE, model_type="olmo2", intermediate_size=96, num_hidden_layers=2, attention_bias=True),
    "olmo3": dict(_BASE, model_type="olmo3", intermediate_size=96, num_hidden_layers=4, sliding_window=8),
    # EXAONE 4: per-head q/k norms, post norms; layers 0-2 slide (window 8, pattern 4), layer 3 full and NoPE
    "exaone4": dict(_BASE, model_type="exaone4", intermediate_size=96, num_hidden_layers=4, sliding_window=8,
                    sliding_window_pattern=4),
    "exaone4-global": dict(_BASE, model_type="exaone4", intermediate_size=96, num_hidden_layers=2,
                           sliding_window=None, head_dim=32, layer_types=["full_attention"] * 2),
    # ERNIE 4.5 MoE: layers 1 and 3 MoE (interval 2 from layer 1), 2 shared experts, the rest dense
    "ernie4_5_moe": dict(_BASE, model_type="ernie4_5_moe", intermediate_size=96, moe_intermediate_size=16,
                         num_hidden_layers=4, moe_num_experts=8, moe_k=2, moe_num_shared_experts=2,
                         moe_layer_start_index=1, moe_layer_interval=2, moe_layer_end_index=-1),
    "glm4_moe": dict(_BASE, model_type="glm4_moe", head_dim=32, intermediate_size=96, moe_intermediate_size=16,
                     n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, first_k_dense_replace=1,
                     num_hidden_layers=3, attention_bias=True, use_qk_norm=True, partial_rotary_factor=0.5,
                     n_group=1, topk_group=1, num_nextn_predict_layers=1),
    "gpt_oss": dict(_BASE, model_type="gpt_oss", head_dim=16, intermediate_size=32, num_hidden_layers=4,
                    num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                    layer_types=["sliding_attention", "full_attention", "full_attention", "sliding_attention"]),
    "gpt_oss-default-layers": dict(_BASE, model_type="gpt_oss", head_dim=16, intermediate_size=32,
                                   num_hidden_layers=4, num_local_experts=4, num_experts_per_tok=2,
                                   sliding_window=8),
    # MoE on layers 1 and 3 (step 2); NoPE layers 1 and 3 (interval 2); the rotary layers chunked
    "llama4": dict(model_type="llama4", architectures=["Llama4ForConditionalGeneration"],
                   text_config=dict(_LLAMA4_TEXT, model_type="llama4_text"), torch_dtype="bfloat16"),
    "llama4_text-moe_layers": dict(_LLAMA4_TEXT, model_type="llama4_text", moe_layers=[0, 3], use_qk_norm=False),
    "gemma2": dict(_GEMMA, model_type="gemma2", num_hidden_layers=4, attn_logit_softcapping=50.0,
                   final_logit_softcapping=30.0, hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=32),
    "gemma3_text": dict(_GEMMA, model_type="gemma3_text", num_hidden_layers=7, sliding_window_pattern=3,
                        head_dim=16, rope_scaling={"rope_type": "linear", "factor": 8.0}),
    "gemma3": dict(model_type="gemma3", architectures=["Gemma3ForConditionalGeneration"],
                   text_config=dict(_GEMMA, model_type="gemma3_text", num_hidden_layers=6)),
}


@pytest.mark.parametrize("name", sorted(TINY))
def test_tiny_param_count_is_exact(name):
    spec = read(TINY[name])
    assert spec.param_count == checkpoint_tensor_count(hf_model(TINY[name]))


@pytest.mark.parametrize("name", sorted(TINY))
def test_tiny_saved_by_transformers_reads_back(name, tmp_path):
    """transformers 5 writes the config its own way (rope_parameters, explicit layer_types, no_rope_layers,
    moe_layers): read back, the same structure."""
    if TINY[name]["model_type"] in ("llama4", "gemma3", "kimi_k2", "kimi_k25"):
        pytest.skip("the wrapper / alias is not a transformers causal-LM config")
    hf_model(TINY[name]).config.save_pretrained(tmp_path)
    back = ModelSpec.from_hf_config(tmp_path)
    spec = read(TINY[name])
    assert back.param_count == spec.param_count
    assert back.layer_kinds() == spec.layer_kinds()
    assert back.kv_width_per_token_per_layer == spec.kv_width_per_token_per_layer
    assert (back.rotary_dim, back.qk_norm, rope_kind(back)) == (spec.rotary_dim, spec.qk_norm, rope_kind(spec))


def rope_kind(spec: ModelSpec) -> str:
    scaling = spec.rope_scaling or {}
    return scaling.get("rope_type", scaling.get("type", "default"))


def test_tiny_layer_structure():
    q = read(TINY["qwen3"])
    assert q.layer_types == ("full", "full", "sliding", "sliding") and q.sliding_window == 8 and q.head_dim == 32
    moe = read(TINY["qwen3_moe"])
    assert [k.moe for k in moe.layer_kinds()] == [False, True, False, False] and moe.dense_layers == (0, 2, 3)
    ds = read(TINY["deepseek_v3"])
    assert ds.dense_layers == (0,) and ds.shared_experts == 2 and ds.q_lora_rank == 24 and ds.mtp_layers == 1
    assert read(TINY["deepseek_v3-no-q-lora"]).q_lora_rank is None
    assert read(TINY["kimi_k2"]).dense_layers == (0, 1)
    v2 = read(TINY["deepseek_v2"])
    assert not v2.router_score_bias and v2.mtp_layers == 0 and v2.q_lora_rank is None
    oss = read(TINY["gpt_oss-default-layers"])
    assert oss.layer_types == ("sliding", "full", "sliding", "full")
    l4 = read(TINY["llama4"])
    assert l4.nope_layers == (1, 3) and l4.layer_types == ("chunked", "full", "chunked", "full")
    assert [k.moe for k in l4.layer_kinds()] == [False, True, False, True] and l4.dtype == "bf16"
    assert [k.moe for k in read(TINY["llama4_text-moe_layers"]).layer_kinds()] == [True, False, False, True]
    g2 = read(TINY["gemma2"])
    assert g2.layer_types == ("sliding", "full") * 2 and (g2.attn_softcap, g2.final_softcap) == (50.0, 30.0)
    assert g2.tied_embeddings and g2.sandwich_norms and g2.embedding_scale and g2.hidden_act == "gelu_pytorch_tanh"
    g3 = read(TINY["gemma3_text"])
    assert g3.layer_types == ("sliding", "sliding", "full") * 2 + ("sliding",) and g3.qk_norm == "rmsnorm"
    assert g3.attn_softcap is None and g3.rope_scaling == {"rope_type": "linear", "factor": 8.0}
    assert read(TINY["gemma3"]).layer_types == ("sliding",) * 5 + ("full",)


# ---- KV elements per token and layer against transformers' cache ---------------------------------

@pytest.mark.parametrize("name", sorted(TINY))
def test_tiny_kv_width_matches_the_cache(name):
    """A forward of 5 tokens (inside every window and chunk) through the real tiny model: each layer's
    cached K and V widths (heads x head_dim) per token."""
    spec = read(TINY[name])
    torch.manual_seed(0)
    model = hf_model(TINY[name], device="cpu").eval()
    with torch.no_grad():
        cache = model(torch.randint(0, 128, (1, 5)), use_cache=True).past_key_values
    assert len(cache.layers) == spec.num_layers
    for layer in cache.layers:
        k, v = layer.keys, layer.values  # (B, H_kv, T, D)
        assert k.shape[2] == v.shape[2] == 5
        width = k.shape[1] * k.shape[3] + v.shape[1] * v.shape[3]
        if spec.is_mla:  # transformers 5 caches the latent as "K" and the shared rotary key as "V"
            assert (k.shape[1], k.shape[3], v.shape[1], v.shape[3]) == (1, spec.kv_lora_rank, 1, spec.qk_rope_head_dim)
        assert spec.kv_width_per_token_per_layer == width


# ---- every key read is listed; every key of the tiny configs is read ---------------------------------

@pytest.mark.parametrize("name", sorted(TINY))
def test_every_key_read_is_listed(name):
    cfg = json.loads(json.dumps(TINY[name]))
    fields, read_keys = read_hf_config(cfg, "t", "config")
    assert read_keys <= set(HF_CONFIG_FIELDS) | set(HF_REFUSED_FIELDS), read_keys - set(HF_CONFIG_FIELDS)
    inner = cfg.get("text_config", cfg)
    assert set(inner) <= read_keys, set(inner) - read_keys


# ---- refused by name, in one line --------------------------------------------------------------------

V3, Q3, OSS, L4, G3 = (TINY[n] for n in ("deepseek_v3", "qwen3", "gpt_oss", "llama4_text-moe_layers", "gemma3_text"))


@pytest.mark.parametrize("cfg,needle", [
    ({**V3, "index_topk": 2048, "index_n_heads": 64},
     "index_topk=2048 is not modelled (DeepSeek Sparse Attention is read for deepseek_v32 and glm_moe_dsa only)"),
    ({**Q3, "hybrid_override_pattern": "M-M*"}, "hybrid_override_pattern='M-M*' is not modelled (Mamba"),
    ({**Q3, "linear_num_value_heads": 32}, "linear_num_value_heads=32 is not modelled"),
    ({**Q3, "layer_types": ["linear_attention", "full_attention"] * 2},
     "layer_types='linear_attention' is not modelled (this model type builds no Gated DeltaNet layers)"),
    ({**Q3, "layer_types": ["full_attention"] * 3}, "layer_types has 3 entries, num_hidden_layers=4"),
    ({**Q3, "layer_types": ["full_attention"] * 3 + ["global"]}, "layer_types holds 'global'"),
    ({**V3, "num_experts_per_tok": 9}, "num_experts_per_tok=9 exceeds the 8 routed experts"),
    ({**OSS, "num_experts_per_tok": 5, "experts_per_token": 5}, "num_experts_per_tok=5 exceeds the 4 routed experts"),
    ({**OSS, "experts_per_token": 3}, "experts_per_token=3 differs from num_experts_per_tok=2"),
    ({**OSS, "swiglu_alpha": 1.5}, "swiglu_alpha=1.5 is not modelled (gpt-oss's clamped SwiGLU has the slope 1.702)"),
    ({**OSS, "num_local_experts": 1, "num_experts_per_tok": 1}, "a mixture of 1 expert is not modelled"),
    ({**TINY["qwen3_moe"], "num_experts": 1, "num_experts_per_tok": 1}, "a mixture of 1 expert is not modelled"),
    ({**V3, "kv_lora_rank": None}, "multi-head latent attention needs kv_lora_rank (missing or null)"),
    ({**V3, "qk_rope_head_dim": 0}, "qk_rope_head_dim must be a positive integer, got 0"),
    ({**V3, "topk_method": "greedy"}, "topk_method='greedy' is not modelled (DeepSeek-V3 routes noaux_tc)"),
    ({**TINY["deepseek_v2"], "mlp_bias": True}, "mlp_bias=True is not modelled"),
    ({**TINY["deepseek_v2"], "topk_method": "noaux_tc"}, "topk_method='noaux_tc' is not modelled"),
    ({**V3, "scoring_func": "softplus"}, "scoring_func='softplus' is not modelled"),
    ({**V3, "n_group": 3}, "n_group=3 does not divide the 8 routed experts"),
    ({**V3, "topk_group": 4}, "topk_group=4 exceeds n_group=2"),
    ({**V3, "moe_layer_freq": 0}, "moe_layer_freq must be a positive integer, got 0"),
    ({**TINY["qwen3_moe"], "mlp_only_layers": [4]}, "mlp_only_layers holds layer 4, outside 0..3"),
    ({**TINY["qwen3_moe"], "decoder_sparse_step": 0}, "decoder_sparse_step must be a positive integer"),
    ({**L4, "no_rope_layers": [1, 0]}, "no_rope_layers must be 4 flags"),
    ({**L4, "moe_layers": [0, 7]}, "moe_layers holds layer 7, outside 0..3"),
    ({**G3, "use_bidirectional_attention": True}, "use_bidirectional_attention=True is not modelled"),
    ({**G3, "sliding_window_pattern": 0}, "sliding_window_pattern must be a positive integer"),
    ({**G3, "sliding_window": -1}, "sliding_window must be a positive integer, got -1"),
    ({"model_type": "gemma3", "text_config": "big"}, "text_config must be a mapping, got 'big'"),
    ({"model_type": "llama4", "text_config": {**L4, "model_type": "llama"}},
     "text_config.model_type='llama', expected 'llama4_text'"),
    ({**TINY["glm4_moe"], "partial_rotary_factor": 1.5}, "partial_rotary_factor must be in (0, 1], got 1.5"),
    ({**Q3, "rope_scaling": {"rope_type": "made_up"}}, "rope_scaling.rope_type='made_up' is not modelled"),
    ({**Q3, "use_qk_norm": True}, None),  # Qwen3 has q/k norms anyway: accepted
    ({**Q3, "attn_logit_softcapping": 30.0}, "attn_logit_softcapping=30.0 is not modelled"),
])
def test_refused_fields_of_today(cfg, needle):
    if needle is None:
        assert read(cfg).qk_norm == "rmsnorm"
        return
    refused(cfg, needle)


def test_refusals_name_the_origin(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**V3, "num_experts_per_tok": 9}))
    with pytest.raises(SpecError, match=re.escape(f"{path}: num_experts_per_tok=9 exceeds")):
        ModelSpec.from_hf_config(path)
    path.write_text(json.dumps({"model_type": "llama4", "text_config": {**L4, "layer_types": ["full_attention"]}}))
    with pytest.raises(SpecError, match=re.escape(f"{path} (text_config): layer_types has 1 entries")):
        ModelSpec.from_hf_config(path)


def test_absent_keys_take_transformers_defaults():
    """Each config class's defaults (transformers 5.24) for keys a config leaves out."""
    bare = {k: v for k, v in TINY["deepseek_v3"].items()
            if k in ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings")}
    bare["num_hidden_layers"] = 4  # the default first_k_dense_replace=3 leaves one MoE layer
    ds = read(bare)  # DeepseekV3Config: 256 experts of 2048, top-8, 1 shared, 3 dense layers, MLA 512/1536/128/64/128
    assert (ds.num_experts, ds.moe_ffn_size, ds.experts_per_token, ds.shared_experts) == (256, 2048, 8, 1)
    assert (ds.kv_lora_rank, ds.q_lora_rank, ds.qk_nope_head_dim, ds.qk_rope_head_dim, ds.v_head_dim) == (
        512, 1536, 128, 64, 128)
    assert ds.dense_layers == (0, 1, 2) and ds.mtp_layers == 1 and ds.num_moe_layers == 1
    assert read({**bare, "num_hidden_layers": 3}).num_experts == 1  # no MoE layer left: a dense model
    assert ds.param_count == checkpoint_tensor_count(hf_model(bare))
    oss = read({k: v for k, v in OSS.items() if k not in ("layer_types", "sliding_window", "head_dim")})
    assert oss.sliding_window == 128 and oss.head_dim == 64 and oss.layer_types == ("sliding", "full") * 2
    assert oss.rope_scaling["rope_type"] == "yarn"
    g2 = read({k: v for k, v in TINY["gemma2"].items() if "softcapping" not in k})
    assert (g2.attn_softcap, g2.final_softcap) == (50.0, 30.0)
    g3 = read({**G3, "attn_logit_softcapping": None})
    assert g3.attn_softcap is None and g3.sliding_window == 8
    l4 = read({k: v for k, v in L4.items() if k not in ("moe_layers", "interleave_moe_layer_step",
                                                           "no_rope_layer_interval", "attention_chunk_size")})
    assert l4.dense_layers == () and l4.nope_layers == (3,) and l4.attention_chunk_size == 8192
    assert read({**L4, "attention_chunk_size": None}).layer_types is None  # no chunks: every layer global
    q = read({k: v for k, v in Q3.items() if k != "head_dim"})
    assert q.head_dim == 128  # Qwen3Config's default, not hidden / heads
    assert read({**Q3, "use_sliding_window": False}).sliding_window is None


# ---- any junk in any field: a ModelSpec or one SpecError ------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.analysis.model_checks import assert_read_or_one_error  # noqa: E402

_JUNK = st.one_of(st.none(), st.booleans(), st.integers(-3, 300), st.floats(allow_nan=True, allow_infinity=True),
                  st.text(max_size=6), st.lists(st.integers(-1, 5), max_size=5),
                  st.lists(st.sampled_from(["full_attention", "sliding_attention", "chunked_attention",
                                            "linear_attention"]), max_size=5),
                  st.dictionaries(st.sampled_from(["rope_type", "type", "factor", "rope_theta", "full_attention"]),
                                  st.one_of(st.sampled_from(["yarn", "linear", "llama3", "made_up"]),
                                            st.integers(-1, 256), st.floats(allow_nan=True)), max_size=3))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(TINY)), st.data())
def test_junk_values_give_a_spec_or_one_spec_error(name, data):
    cfg = json.loads(json.dumps(TINY[name]))
    target = cfg.get("text_config", cfg)
    keys = sorted(set(target) | set(HF_CONFIG_FIELDS) | set(HF_REFUSED_FIELDS))
    for key in data.draw(st.lists(st.sampled_from(keys), min_size=1, max_size=3, unique=True)):
        if key != "model_type":
            target[key] = data.draw(_JUNK)
    assert_read_or_one_error(read, cfg)


# ---- built-in models ---------------------------------------------------------------------------------
# Models without a verbatim config in tests/specs/data/hf-configs: their architecture as published
# (model cards, technical reports; ARCHITECTURES.md), in config.json spelling. The built-in YAML of each
# must equal what the HF reader makes of it, and transformers must count the same parameters.
PUBLISHED = {
    "qwen3-32b": dict(model_type="qwen3", vocab_size=151936, hidden_size=5120, num_hidden_layers=64,
                      num_attention_heads=64, num_key_value_heads=8, head_dim=128, intermediate_size=25600,
                      max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
                      tie_word_embeddings=False, torch_dtype="bfloat16"),
    "qwen3-235b-a22b": dict(model_type="qwen3_moe", vocab_size=151936, hidden_size=4096, num_hidden_layers=94,
                            num_attention_heads=64, num_key_value_heads=4, head_dim=128, intermediate_size=12288,
                            moe_intermediate_size=1536, num_experts=128, num_experts_per_tok=8,
                            norm_topk_prob=True, max_position_embeddings=40960, rope_theta=1000000.0,
                            rms_norm_eps=1e-6, tie_word_embeddings=False, torch_dtype="bfloat16"),
    "kimi-k2": dict(model_type="kimi_k2", architectures=["DeepseekV3ForCausalLM"], vocab_size=163840,
                    hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048, num_hidden_layers=61,
                    num_attention_heads=64, num_key_value_heads=64, kv_lora_rank=512, q_lora_rank=1536,
                    qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=384,
                    n_shared_experts=1, num_experts_per_tok=8, first_k_dense_replace=1, moe_layer_freq=1,
                    n_group=1, topk_group=1, topk_method="noaux_tc", scoring_func="sigmoid", norm_topk_prob=True,
                    routed_scaling_factor=2.827, num_nextn_predict_layers=0, max_position_embeddings=131072,
                    rope_theta=50000.0, rope_scaling={"type": "yarn", "factor": 32.0, "beta_fast": 1.0,
                                                      "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                                                      "original_max_position_embeddings": 4096},
                    rms_norm_eps=1e-6, tie_word_embeddings=False, torch_dtype="bfloat16"),
    "gpt-oss-120b": dict(json.loads((HF_CONFIGS / "gpt-oss-20b.json").read_text()), num_hidden_layers=36,
                         num_local_experts=128,
                         layer_types=["sliding_attention", "full_attention"] * 18),
    "llama-4-maverick": dict(model_type="llama4", architectures=["Llama4ForConditionalGeneration"],
                             torch_dtype="bfloat16", text_config=dict(
                                 model_type="llama4_text", vocab_size=202048, hidden_size=5120,
                                 num_hidden_layers=48, num_attention_heads=40, num_key_value_heads=8, head_dim=128,
                                 intermediate_size=8192, intermediate_size_mlp=16384, num_local_experts=128,
                                 num_experts_per_tok=1, interleave_moe_layer_step=2, use_qk_norm=False,
                                 attention_chunk_size=8192, max_position_embeddings=1048576, rope_theta=500000.0,
                                 rms_norm_eps=1e-5, tie_word_embeddings=False)),
    "gemma-2-9b": dict(model_type="gemma2", vocab_size=256000, hidden_size=3584, num_hidden_layers=42,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=256, intermediate_size=14336,
                       hidden_activation="gelu_pytorch_tanh", max_position_embeddings=8192, sliding_window=4096,
                       attn_logit_softcapping=50.0, final_logit_softcapping=30.0, query_pre_attn_scalar=256,
                       rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, torch_dtype="bfloat16"),
    "gemma-3-27b": dict(model_type="gemma3", architectures=["Gemma3ForConditionalGeneration"],
                        torch_dtype="bfloat16", text_config=dict(
                            model_type="gemma3_text", vocab_size=262208, hidden_size=5376, num_hidden_layers=62,
                            num_attention_heads=32, num_key_value_heads=16, head_dim=128, intermediate_size=21504,
                            hidden_activation="gelu_pytorch_tanh", max_position_embeddings=131072,
                            sliding_window=1024, sliding_window_pattern=6, query_pre_attn_scalar=168,
                            rope_theta=1000000.0, rope_local_base_freq=10000.0,
                            rope_scaling={"rope_type": "linear", "factor": 8.0}, rms_norm_eps=1e-6)),
}
PUBLISHED["kimi-k2"]["quantization_config"] = {  # Kimi-K2 ships DeepSeek-V3's fp8 block-wise format
    "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}

#: each new built-in and the config it is written from
BUILTIN_CONFIGS = {
    "qwen3-8b": HUB["Qwen3-8B"], "qwen3-30b-a3b": HUB["Qwen3-30B-A3B"], "deepseek-v3": HUB["DeepSeek-V3"],
    "deepseek-r1": HUB["DeepSeek-V3"],  # the same architecture (DeepSeek-R1 is a DeepSeek-V3 checkpoint)
    "glm-4.5": HUB["GLM-4.5"], "gpt-oss-20b": HUB["gpt-oss-20b"],
    "llama-4-scout": HUB["Llama-4-Scout-17B-16E-Instruct"], **PUBLISHED,
}


def structure(spec: ModelSpec) -> ModelSpec:
    return replace(spec, name="x", source="", dtype="fp16")


@pytest.mark.parametrize("name", sorted(BUILTIN_CONFIGS))
def test_builtin_equals_its_config(name):
    spec = load_model(name)
    back = read(BUILTIN_CONFIGS[name])
    assert structure(spec) == structure(back)
    assert spec.rope_scaling == back.rope_scaling  # not part of ==
    assert spec.layer_kinds() == back.layer_kinds() and spec.param_count == back.param_count
    assert spec.source.startswith("https://")


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_builtin_param_count_is_exact(name):
    """The built-ins written from the published architecture, counted by transformers (meta device)."""
    assert load_model(name).param_count == checkpoint_tensor_count(hf_model(PUBLISHED[name]))


# (total, active) in billions: ARCHITECTURES.md §11's recomputed column, and the published figures for the
# two Gemma models (text model only)
DIGEST = {"qwen3-8b": (8.19, 8.19), "qwen3-32b": (32.76, 32.76), "qwen3-30b-a3b": (30.53, 3.35),
          "qwen3-235b-a22b": (235.09, 22.19), "deepseek-v3": (671.03, 37.55), "deepseek-r1": (671.03, 37.55),
          "kimi-k2": (1026.4, 32.86), "glm-4.5": (352.8, 33.6), "gpt-oss-20b": (20.91, 4.19),
          "gpt-oss-120b": (116.83, 5.71), "llama-4-scout": (107.77, 17.17), "llama-4-maverick": (400.71, 17.19)}


@pytest.mark.parametrize("name", sorted(DIGEST))
def test_builtin_total_and_active_match_the_digest(name):
    spec = load_model(name)
    total, active = DIGEST[name]
    assert spec.param_count / 1e9 == pytest.approx(total, rel=1e-3)
    assert spec.active_param_count / 1e9 == pytest.approx(active, rel=1e-3)


def test_deepseek_r1_is_deepseek_v3():
    assert structure(load_model("deepseek-r1")) == structure(load_model("deepseek-v3"))


def test_builtin_kv_bytes_per_token():
    """Hand-computed, bf16, every layer's full cache (no window cap): DeepSeek-V3 61 x 576 x 2 = 70,272 B;
    gpt-oss-120b 36 x 2 x 8 x 64 x 2 = 73,728 B; Llama 4 Scout 48 x 2 x 8 x 128 x 2 = 196,608 B."""
    assert load_model("deepseek-v3").kv_width_per_token_per_layer * 61 * 2 == 70_272
    assert load_model("gpt-oss-120b").kv_width_per_token_per_layer * 36 * 2 == 73_728
    assert load_model("llama-4-scout").kv_width_per_token_per_layer * 48 * 2 == 196_608


@pytest.mark.parametrize("name,config_class", [("llama4", "Llama4Config"), ("gemma3", "Gemma3Config"),
                                               ("kimi_k25", "Kimi_K25Config")])
def test_multimodal_config_saved_by_transformers_reads_back(name, config_class, tmp_path):
    """The wrapper config as transformers 5 writes it (text_config nested, a vision_config beside it)."""
    text = {k: v for k, v in json.loads(json.dumps(TINY[name]["text_config"])).items() if k != "model_type"}
    getattr(transformers, config_class)(text_config=text).save_pretrained(tmp_path)
    back = ModelSpec.from_hf_config(tmp_path)
    spec = read(TINY[name])
    assert back.param_count == spec.param_count and back.layer_kinds() == spec.layer_kinds()
    assert "vision tower is not modelled" in back.source


# ---- random tiny configs of every family: the count is transformers' count ------------------------

def _random_config(family: str, draw) -> dict:
    heads = draw(st.sampled_from([1, 2, 4]))
    kv = draw(st.sampled_from([k for k in (1, 2, 4) if heads % k == 0]))
    hidden = heads * draw(st.sampled_from([8, 16]))
    layers = draw(st.integers(1, 5))
    cfg = dict(vocab_size=draw(st.integers(16, 80)), hidden_size=hidden, num_attention_heads=heads,
               num_key_value_heads=kv, num_hidden_layers=layers, intermediate_size=draw(st.integers(4, 40)),
               max_position_embeddings=64, tie_word_embeddings=draw(st.booleans()),
               attention_bias=draw(st.booleans()))
    head_dim = draw(st.sampled_from([4, 8, 16]))
    experts = draw(st.integers(2, 6))
    top_k = draw(st.integers(1, experts))
    if family in ("qwen3", "qwen3_moe"):
        cfg.update(model_type=family, head_dim=head_dim, use_sliding_window=draw(st.booleans()),
                   sliding_window=draw(st.integers(1, 8)))
        if family == "qwen3":
            cfg["max_window_layers"] = draw(st.integers(0, layers))
        else:
            cfg.update(num_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=draw(st.integers(2, 12)),
                       decoder_sparse_step=draw(st.integers(1, 3)),
                       mlp_only_layers=draw(st.lists(st.integers(0, layers - 1), unique=True)))
    elif family in ("deepseek_v3", "deepseek_v2"):
        groups = draw(st.sampled_from([g for g in (1, 2) if experts % g == 0]))
        cfg.update(model_type=family, num_key_value_heads=heads, kv_lora_rank=draw(st.integers(2, 12)),
                   q_lora_rank=draw(st.one_of(st.none(), st.integers(2, 12))), qk_nope_head_dim=draw(st.integers(2, 8)),
                   qk_rope_head_dim=draw(st.sampled_from([2, 4])), v_head_dim=draw(st.integers(2, 8)),
                   n_routed_experts=experts, num_experts_per_tok=top_k, n_group=groups, topk_group=groups,
                   n_shared_experts=draw(st.integers(0, 2)), moe_intermediate_size=draw(st.integers(2, 12)),
                   first_k_dense_replace=draw(st.integers(0, layers)))
    elif family == "glm4_moe":
        cfg.update(model_type=family, head_dim=head_dim, use_qk_norm=draw(st.booleans()),
                   partial_rotary_factor=draw(st.sampled_from([0.5, 1.0])), n_routed_experts=experts,
                   num_experts_per_tok=top_k, n_group=1, topk_group=1, n_shared_experts=draw(st.integers(0, 2)),
                   moe_intermediate_size=draw(st.integers(2, 12)), first_k_dense_replace=draw(st.integers(0, layers)))
    elif family == "gpt_oss":
        cfg.update(model_type=family, head_dim=head_dim, num_local_experts=experts, num_experts_per_tok=top_k,
                   sliding_window=draw(st.integers(1, 8)),
                   layer_types=draw(st.lists(st.sampled_from(["sliding_attention", "full_attention"]),
                                             min_size=layers, max_size=layers)))
    elif family == "llama4_text":
        cfg.update(model_type=family, head_dim=head_dim, intermediate_size_mlp=draw(st.integers(4, 40)),
                   num_local_experts=experts, num_experts_per_tok=top_k,
                   interleave_moe_layer_step=draw(st.integers(1, 3)), no_rope_layer_interval=draw(st.integers(1, 4)),
                   attention_chunk_size=draw(st.one_of(st.none(), st.integers(1, 8))), use_qk_norm=draw(st.booleans()))
        if draw(st.booleans()):
            cfg["moe_layers"] = draw(st.lists(st.integers(0, layers - 1), unique=True))
    else:  # gemma2, gemma3_text
        cfg.update(model_type=family, head_dim=head_dim, sliding_window=draw(st.integers(1, 8)),
                   query_pre_attn_scalar=head_dim)
        if family == "gemma3_text":
            cfg["sliding_window_pattern"] = draw(st.integers(1, 4))
    return cfg


@pytest.mark.parametrize("family", ["qwen3", "qwen3_moe", "deepseek_v3", "deepseek_v2", "glm4_moe", "gpt_oss",
                                    "llama4_text", "gemma2", "gemma3_text"])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_random_configs_count_exactly(family, data):
    cfg = _random_config(family, data.draw)
    spec = read(cfg)
    assert spec.param_count == checkpoint_tensor_count(hf_model(cfg))
    experts_used = spec.num_moe_layers * (spec.num_experts - spec.experts_per_token) * spec.expert_params
    assert spec.active_param_count == spec.param_count - experts_used


@pytest.mark.parametrize("family", ["qwen3", "qwen3_moe", "deepseek_v3", "glm4_moe", "gpt_oss", "llama4_text",
                                    "gemma2", "gemma3_text"])
@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_random_configs_cache_widths(family, data):
    """Each layer's cached K and V widths after a forward of 6 tokens (past some windows and chunks:
    the width per token does not depend on how many tokens a layer keeps)."""
    cfg = _random_config(family, data.draw)
    for key in ("intermediate_size", "moe_intermediate_size", "intermediate_size_mlp", "hidden_size"):
        if key in cfg:  # transformers' grouped expert GEMM wants 16-byte strides
            cfg[key] = -(-cfg[key] // 8) * 8
    if "n_group" in cfg:  # DeepSeek-V3's router sums each group's top 2 scores: groups of >= 2 experts
        cfg.update(n_group=1, topk_group=1)
    spec = read(cfg)
    torch.manual_seed(0)
    model = hf_model(cfg, device="cpu").eval()
    with torch.no_grad():
        cache = model(torch.randint(0, cfg["vocab_size"], (1, 6)), use_cache=True).past_key_values
    for layer in cache.layers:
        k, v = layer.keys, layer.values
        assert spec.kv_width_per_token_per_layer == k.shape[1] * k.shape[3] + v.shape[1] * v.shape[3]


def test_glm4_moe_lite_and_kimi_k25_at_their_class_defaults():
    """GLM-4.7-Flash's and Kimi K2.5's config classes' default shapes, exact against transformers."""
    glm = transformers.AutoConfig.for_model("glm4_moe_lite").to_dict()
    spec = read(glm)
    assert spec.param_count == checkpoint_tensor_count(hf_model(glm)) == 29_943_393_920
    assert spec.dense_layers == (0,) and spec.num_experts == 64 and spec.v_head_dim == 256
    text = transformers.AutoConfig.for_model("deepseek_v3").to_dict()  # DeepSeek-V3's shape
    kimi = read({"model_type": "kimi_k25", "text_config": text})  # the head tied by the outer default
    v3 = read(text)
    assert kimi.tied_embeddings and kimi.param_count == v3.param_count - v3.vocab_size * v3.hidden_size
    assert kimi.param_count == checkpoint_tensor_count(hf_model({"model_type": "kimi_k25", "text_config": text}))
    untied = read({"model_type": "kimi_k25", "tie_word_embeddings": False,
                   "text_config": {**text, "model_type": "kimi_k2"}})
    assert untied.param_count == v3.param_count and "kimi_k25 checkpoint" in untied.source


@pytest.mark.parametrize("cfg,needle", [
    ({"model_type": "kimi_k25", "text_config": {"model_type": "qwen3"}},
     "text_config.model_type='qwen3', expected 'deepseek_v3' in a kimi_k25 config"),
    ({"model_type": "kimi_k25", "tie_word_embeddings": "yes"}, "tie_word_embeddings must be true or false"),
    ({**TINY["glm4_moe_lite-default-dense"], "first_k_dense_replace": 3},
     "first_k_dense_replace=3 is not modelled (transformers' Glm4MoeLite builds its dense layers from"),
])
def test_glm4_moe_lite_and_kimi_k25_refusals(cfg, needle):
    refused(cfg, needle)


def test_smollm3_and_seed_oss_structure():
    smol = read(TINY["smollm3"])
    assert smol.nope_layers == (1, 3) and smol.layer_types == ("full", "sliding", "full", "sliding")
    assert smol.sliding_window == 8 and smol.qkv_bias and smol.out_bias  # (the tiny base unties the head)
    plain = read(TINY["smollm3-no-sliding"])  # a window without use_sliding_window: no layer slides
    assert plain.nope_layers == (1, 2) and plain.layer_types is None and plain.sliding_window is None
    seed = read(TINY["seed_oss"])
    assert seed.qkv_bias and not seed.out_bias and seed.head_dim == 32


@pytest.mark.parametrize("model_type, params", [("smollm3", 3_075_098_624), ("seed_oss", 28_921_040_896)])
def test_smollm3_and_seed_oss_at_their_class_defaults(model_type, params):
    cfg = transformers.AutoConfig.for_model(model_type).to_dict()
    assert read(cfg).param_count == checkpoint_tensor_count(hf_model(cfg)) == params


def test_olmo_structure_and_class_defaults():
    olmo3 = read(TINY["olmo3"])
    assert olmo3.layer_types == ("sliding", "sliding", "sliding", "full") and olmo3.sliding_window == 8
    assert olmo3.post_norm and olmo3.qk_norm == "rmsnorm_across_heads" and not olmo3.sandwich_norms
    assert read(TINY["olmo2"]).qkv_bias and read(TINY["olmo2"]).out_bias and read(TINY["olmo2"]).layer_types is None
    for model_type in ("olmo2", "olmo3"):
        cfg = transformers.AutoConfig.for_model(model_type).to_dict()
        assert read(cfg).param_count == checkpoint_tensor_count(hf_model(cfg)) == 6_888_624_128


def test_exaone4_structure_and_class_defaults():
    ex = read(TINY["exaone4"])
    assert ex.layer_types == ("sliding", "sliding", "sliding", "full") and ex.nope_layers == (3,)
    assert ex.post_norm and ex.qk_norm == "rmsnorm" and not ex.qkv_bias
    plain = read(TINY["exaone4-global"])  # no window: every layer full and rotary
    assert plain.layer_types is None and plain.nope_layers == () and plain.head_dim == 32
    cfg = transformers.AutoConfig.for_model("exaone4").to_dict()
    spec = read(cfg)
    assert spec.param_count == checkpoint_tensor_count(hf_model(cfg)) and len(spec.nope_layers) == 8


def test_ernie4_5_moe_structure_and_class_defaults():
    ernie = read(TINY["ernie4_5_moe"])
    assert ernie.dense_layers == (0, 2) and ernie.shared_experts == 2 and ernie.router_score_bias
    assert (ernie.router_scoring, ernie.router_renormalize) == ("softmax", True)
    cfg = transformers.AutoConfig.for_model("ernie4_5_moe").to_dict()
    spec = read(cfg)
    assert spec.param_count == checkpoint_tensor_count(hf_model(cfg)) and spec.dense_layers == (0,)
    refused({**TINY["ernie4_5_moe"], "use_bias": True}, "use_bias=True is not modelled (biases on the experts")
