"""Quantised checkpoints as shipped (issue 22): fp8 block-wise, MXFP4, NVFP4, `modules_to_not_convert`,
weight bytes per module with their scales, fp4 peaks and the fallback on devices without them.

Golden figures: gpt-oss-120b ~ 65.2 GB and gpt-oss-20b ~ 13.8 GB (ARCHITECTURES.md section 9: the
expert matrices at 4.25 bits, everything else bf16; 120b's matches its ~65 GB checkpoint); fp8
blocks 8 + 32/16384 bits; B200's fp4 peak 9000 TFLOPS (HGX B200's 18 PF with sparsity).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmperf.analysis.generation import resolve_precision
from llmperf.errors import SpecError
from llmperf.specs import ModelSpec, Precision, QuantizationSpec, load_hardware
from llmperf.specs.hf import model_spec_from_hf_config
from llmperf.specs.precision import MODULES, MXFP4, NVFP4, block_scaled_format

# meta-llama/Meta-Llama-3.1-8B config.json, verbatim (via ai-dynamo/aiconfigurator @ 095f58a5,
# aic-core/src/aiconfigurator_core/model_configs/meta-llama--Meta-Llama-3.1-8B_config.json)
LLAMA_3_1_8B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": False,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0", "use_cache": True, "vocab_size": 128256,
}
# openai/gpt-oss-20b (and -120b) config.json's quantization_config (same source, openai--gpt-oss-20b_config.json)
GPT_OSS_KEPT = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]
GPT_OSS_QCFG = {"modules_to_not_convert": GPT_OSS_KEPT, "quant_method": "mxfp4"}
SHARED = Path("/work/shared/data/hf-configs")  # the project's copies, where mounted


def raises(needle: str):  # noqa: ANN201
    return pytest.raises(SpecError, match=re.escape(needle))


def gpt_oss(name: str, layers: int, experts: int, quantization: QuantizationSpec | None = None) -> ModelSpec:
    """gpt-oss's text decoder, from its config.json: hidden 2880, 64 query heads and 8 KV heads of
    64, experts of 2880 with biases (gate_up fused), top-4, a biased router, sinks, vocab 201088."""
    return ModelSpec(name=name, family="llama", vocab_size=201088, hidden_size=2880, num_layers=layers,
                     num_heads=64, num_kv_heads=8, head_dim=64, ffn_size=2880, num_experts=experts,
                     experts_per_token=4, qkv_bias=True, out_bias=True, mlp_bias=True, router_bias=True,
                     attn_sinks=True, tied_embeddings=False, max_positions=131072,
                     layer_types=("sliding", "full") * (layers // 2), sliding_window=128, dtype="bf16",
                     quantization=quantization)


MXFP4_CHECKPOINT = QuantizationSpec(method="mxfp4", group_size=32,
                                    modules_to_not_convert=("attention", "router", "embedding", "lm_head"))


def weight_bytes_by_module(m: ModelSpec, p: Precision) -> dict[str, float]:
    """Every parameter of a gpt-oss-shaped model by module: matrices at their module's format with
    its scales, biases, sinks and norms at the activation format."""
    h, e, i, a = m.hidden_size, m.num_experts, m.expert_ffn_size, p.act_bytes
    q, kv, n = m.q_size, m.kv_size, m.num_layers
    attn_matrices = (p.matrix_bytes(h, q, "attention") + 2 * p.matrix_bytes(h, kv, "attention")
                     + p.matrix_bytes(q, h, "attention"))
    attn_other = m.attn_params_per_layer - (2 * h * q + 2 * h * kv)  # biases, sinks
    expert = p.matrix_bytes(h, 2 * i, "expert") + p.matrix_bytes(i, h, "expert")  # gate_up fused, down
    return {
        "attention": n * (attn_matrices + attn_other * a),
        "expert": n * e * (expert + (2 * i + h) * a),
        "router": n * (p.matrix_bytes(h, e, "router") + e * a),
        "embedding": p.matrix_bytes(h, m.vocab_size, "embedding"),
        "lm_head": p.matrix_bytes(h, m.vocab_size, "lm_head"),
        "norms": (2 * n + 1) * h * a,
    }


# ---- gpt-oss: MXFP4 experts, everything else bf16 -------------------------------------------------

@pytest.mark.parametrize("name,layers,experts,params,gb", [
    ("gpt-oss-120b", 36, 128, 116_829_156_672, 65.2),
    ("gpt-oss-20b", 24, 32, 20_914_757_184, 13.8),
])
def test_gpt_oss_weight_bytes(name, layers, experts, params, gb):
    m = gpt_oss(name, layers, experts, MXFP4_CHECKPOINT)
    assert m.param_count == params
    p = resolve_precision(m)
    assert p == Precision(weights="bf16", activations="bf16", kv="bf16", modules={"expert": "mxfp4"})
    assert str(p) == p.label() == "bf16 (expert mxfp4)"
    parts = weight_bytes_by_module(m, p)
    total = sum(parts.values())
    # exactly: the expert matrices at 4 + 8/32 bits (2880 is 90 blocks of 32), every other parameter bf16
    expert_matrices = layers * experts * 3 * 2880 * 2880
    assert total == expert_matrices * 4.25 / 8 + (params - expert_matrices) * 2
    assert total / 1e9 == pytest.approx(gb, abs=0.06)
    assert parts["expert"] / total > 0.7  # the experts are most of the checkpoint (120b: 93%, 20b: 74%)
    # unquantised, the same model is 2 bytes a parameter
    assert sum(weight_bytes_by_module(m, resolve_precision(m, "bf16")).values()) == 2 * params


def test_gpt_oss_checkpoint_config_parses():
    """gpt-oss-20b's own quantization_config, on a model type llmperf reads today (the gpt_oss type
    is another change): the four kept patterns resolve to attention, router, embedding, lm_head."""
    m = model_spec_from_hf_config({**llama(), "quantization_config": GPT_OSS_QCFG}, name="x")
    assert m.quantization == MXFP4_CHECKPOINT
    assert m.quantization.quantized_modules == ("expert",)


# ---- the formats' bytes ---------------------------------------------------------------------------

def test_fp8_block_scales():
    """DeepSeek-V3's 7168 x 2048 expert matrix: fp8 values + one fp32 scale per 128 x 128 block
    (16 x 56 blocks); a partial block counts whole."""
    p = Precision(weights="bf16", modules={"expert": "fp8-block128"})
    assert p.matrix_bytes(7168, 2048, "expert") == 7168 * 2048 + 16 * 56 * 4 == 14_683_648
    assert p.matrix_bytes(2048, 7168, "expert") == 14_683_648
    assert p.matrix_bytes(7168, 129, "expert") == 7168 * 129 + 2 * 56 * 4
    fmt = block_scaled_format("fp8-block")
    assert fmt.name == "fp8-block128" and fmt.bits_per_weight == 8 + 32 / 16384
    assert block_scaled_format("FP8-BLOCK64x128").name == "fp8-block64x128"
    assert (p.module_dtype("expert"), p.matmul_dtype("expert")) == ("fp8", "fp8")


def test_mxfp4_and_nvfp4_bytes():
    """MXFP4: 4-bit values + one 8-bit scale per 32 (4.25 bits); NVFP4: + one fp8 scale per 16 and an
    fp32 per matrix (4.5 bits + 4 bytes)."""
    assert MXFP4.bits_per_weight == 4.25 and NVFP4.bits_per_weight == 4.5
    p = Precision(weights="bf16", modules={"expert": "mxfp4", "attention": "nvfp4"})
    assert p.matrix_bytes(2880, 5760, "expert") == 2880 * 5760 / 2 + 5760 * 90 == 8_812_800
    assert p.matrix_bytes(4096, 4096, "attention") == 4096 * 4096 / 2 + 4096 * 256 + 4 == 9_437_188
    assert p.matrix_bytes(33, 2, "expert") == 33 + 2 * 2  # a last partial block of 1 has its own scale
    assert (p.module_dtype("expert"), p.matmul_dtype("expert")) == ("fp4", "fp4")
    assert (p.module_dtype("dense_mlp"), p.matmul_dtype("dense_mlp")) == ("bf16", "fp16")
    assert str(p) == "w:bf16/a:fp16/kv:fp16 (attention nvfp4; expert mxfp4)"


@given(st.sampled_from(["fp32", "fp16", "bf16", "fp8", "int8", "int4", "fp4"]),
       st.sampled_from([None, -1, 32, 128]), st.integers(1, 20_000), st.integers(1, 20_000))
def test_matrix_bytes_without_module_unchanged(w, group, d_in, d_out):
    """Every call without a module (all of today's) returns what it returned before modules
    existed, and so does a module without its own format."""
    group = group if w in ("int4", "int8") else None
    p = Precision(weights=w, group_size=group)
    with_modules = Precision(weights=w, group_size=group, modules={"expert": "mxfp4", "embedding": "fp16"})
    for other in (with_modules, p):
        assert other.matrix_bytes(d_in, d_out) == p.matrix_bytes(d_in, d_out)
        for module in ("attention", "dense_mlp", "shared_expert"):
            assert other.matrix_bytes(d_in, d_out, module) == p.matrix_bytes(d_in, d_out)
    assert p.matrix_bytes(d_in, d_out, "lm_head") == p.embedding_matrix_bytes(d_in, d_out)
    # fp8 weights run fp8 GEMMs where the device has units (W8A8, as deployed); the rest at the activations
    assert p.matmul_dtype() == p.activations
    assert p.matmul_dtype("expert") == ("fp8" if w == "fp8" else p.activations)


def test_precision_modules_checked():
    with raises("precision.modules: unknown module 'experts'"):
        Precision(modules={"experts": "mxfp4"})
    with raises("precision.modules.expert: unknown weight format 'mxfp3'"):
        Precision(modules={"expert": "mxfp3"})
    with raises("precision.modules: expert is given twice"):
        Precision(modules=[("expert", "mxfp4"), ("expert", "nvfp4")])
    with raises("module: unknown module 'moe'"):
        Precision().matrix_bytes(1, 1, "moe")
    # pairs in MODULES order, formats canonical: a mapping and pairs give one hashable value
    a = Precision(modules={"lm_head": "bf16", "expert": "MXFP4"})
    assert a == Precision(modules=[("expert", "mxfp4"), ("lm_head", "bf16")]) and hash(a)
    assert a.modules == (("expert", "mxfp4"), ("lm_head", "bf16"))


# ---- resolve_precision: the checkpoint's formats, module by module --------------------------------

def test_deepseek_style_fp8_checkpoint():
    """fp8 block-wise converts attention and every FFN; embedding, lm_head and router stay bf16."""
    q = QuantizationSpec(method="fp8", block_size=(128, 128), activation_scheme="dynamic")
    m = gpt_oss("g", 2, 4, q)
    p = resolve_precision(m)
    fp8 = "fp8-block128"
    assert dict(p.modules) == {"attention": fp8, "dense_mlp": fp8, "expert": fp8, "shared_expert": fp8}
    assert [p.module_format(x) for x in ("router", "embedding", "lm_head")] == ["bf16"] * 3
    assert str(p) == "bf16 (attention, dense_mlp, expert, shared_expert fp8-block128)"
    # an explicit weight format or preset overrides the checkpoint, every matrix at it
    assert resolve_precision(m, weights="fp8") == Precision(weights="fp8", activations="bf16", kv="bf16")
    assert resolve_precision(m, "fp16") == Precision.uniform("fp16")
    assert resolve_precision(m, kv="fp8").kv == "fp8"


def test_modules_to_not_convert_honoured():
    q = QuantizationSpec(method="nvfp4", modules_to_not_convert=("attention", "lm_head"), kv_cache="fp8")
    p = resolve_precision(gpt_oss("g", 2, 4, q))
    assert dict(p.modules) == {"dense_mlp": "nvfp4", "expert": "nvfp4", "shared_expert": "nvfp4"}
    assert p.module_format("attention") == "bf16" and p.kv == "fp8"
    assert q.quantized_modules == ("dense_mlp", "expert", "shared_expert")
    # AWQ's kept modules (Mixtral's router: `modules_to_not_convert: ["gate"]`) stay 16-bit
    awq = QuantizationSpec(method="awq", bits=4, group_size=64, modules_to_not_convert=("router",))
    p = resolve_precision(gpt_oss("g", 2, 4, awq))
    assert (p.weights, p.module_format("router"), p.module_format("expert")) == ("int4", "bf16", "int4")


# ---- hardware: fp4 peaks where the device has them, the next wider format elsewhere ---------------

def test_fp4_peaks_and_fallbacks():
    b200, h100, a100 = (load_hardware(n) for n in ("b200", "h100-sxm", "a100-80gb-sxm"))
    assert b200.peak_tflops["fp4"] == 9000 == 2 * b200.peak_tflops["fp8"]
    assert [hw.compute_dtype("fp4") for hw in (b200, h100, a100)] == ["fp4", "fp8", "fp16"]
    assert b200.peak_flops_per_s("fp4") == 9000e12 and h100.peak_flops_per_s("fp4") == 1979e12
    mx = resolve_precision(gpt_oss("g", 2, 4, MXFP4_CHECKPOINT))
    # MXFP4 experts: native fp4 on Blackwell, W4A16 on Hopper (dequantised to bf16, not fp8)
    assert [hw.matmul_dtype(mx, "expert") for hw in (b200, h100, a100)] == ["fp4", "bf16", "bf16"]
    assert [hw.matmul_dtype(mx, "attention") for hw in (b200, h100)] == ["bf16", "bf16"]
    fp8 = Precision(weights="bf16", activations="bf16", kv="bf16", modules={"expert": "fp8-block128"})
    assert [hw.matmul_dtype(fp8, "expert") for hw in (b200, h100, a100)] == ["fp8", "fp8", "bf16"]
    # a plain precision computes as before: at its activations' format
    for hw in (b200, h100, a100):
        for p in (Precision.uniform("fp4"), Precision(weights="int4"), Precision.uniform("fp8")):
            assert hw.matmul_dtype(p, "expert") == hw.matmul_dtype(p) == hw.compute_dtype(p.activations)


# ---- quantization_config forms, through model_spec_from_hf_config ---------------------------------

def llama() -> dict:
    return json.loads(json.dumps(LLAMA_3_1_8B))  # a deep copy


@pytest.mark.skipif(not SHARED.is_dir(), reason="the shared hf-configs are not mounted")
def test_embedded_configs_are_the_shared_ones():
    assert json.loads((SHARED / "Llama-3.1-8B.json").read_text()) == LLAMA_3_1_8B
    assert json.loads((SHARED / "gpt-oss-20b.json").read_text())["quantization_config"] == GPT_OSS_QCFG


def read(qcfg: dict) -> QuantizationSpec:
    return model_spec_from_hf_config({**llama(), "quantization_config": qcfg}, name="x").quantization


NVFP4_GROUP = {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "float", "group_size": 16},
               "input_activations": {"num_bits": 4, "type": "float", "group_size": 16}}
QWEN3_FP8_KEPT = ["lm_head", *(f"model.layers.{i}.{part}" for i in range(32)
                               for part in ("input_layernorm", "mlp.gate", "post_attention_layernorm"))]


@pytest.mark.parametrize("qcfg,expected", [
    ({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
     QuantizationSpec(method="fp8", group_size=128, block_size=(128, 128), activation_scheme="dynamic")),
    ({"quant_method": "fp8", "weight_block_size": [128, 128], "scale_fmt": "ue8m0"},  # DeepSeek-V3.2
     QuantizationSpec(method="fp8", block_size=(128, 128), activation_scheme="dynamic")),
    ({"quant_method": "fp8", "weight_block_size": [128, 128], "modules_to_not_convert": QWEN3_FP8_KEPT},
     QuantizationSpec(method="fp8", block_size=(128, 128), activation_scheme="dynamic",
                      modules_to_not_convert=("router", "lm_head"))),
    (GPT_OSS_QCFG, MXFP4_CHECKPOINT),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"]},
     QuantizationSpec(method="nvfp4", group_size=16, modules_to_not_convert=("lm_head",))),
    ({"quant_algo": "NVFP4"}, QuantizationSpec(method="nvfp4", group_size=16)),
    ({"quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]},
      "producer": {"name": "modelopt"}},  # hf_quant_config.json's layout
     QuantizationSpec(method="nvfp4", group_size=16, modules_to_not_convert=("lm_head",), kv_cache="fp8")),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": ["lm_head", "*mlp.gate", "mtp*"]},
     QuantizationSpec(method="nvfp4", group_size=16, modules_to_not_convert=("router", "lm_head"))),
    ({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
      "config_groups": {"group_0": NVFP4_GROUP}, "ignore": ["lm_head", "re:.*mlp.gate$"]},
     QuantizationSpec(method="nvfp4", group_size=16, modules_to_not_convert=("router", "lm_head"))),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "modules_to_not_convert": ["gate"]},
     QuantizationSpec(method="awq", bits=4, group_size=128, modules_to_not_convert=("router",))),
])
def test_quantization_config_forms(qcfg, expected):
    q = read(qcfg)
    assert q == expected
    m = model_spec_from_hf_config({**llama(), "quantization_config": qcfg}, name="x")
    p = resolve_precision(m)
    for module in q.quantized_modules:
        assert p.module_format(module) == q.weight_format
    for module in q.modules_to_not_convert:
        assert p.module_format(module) == m.dtype


@pytest.mark.parametrize("qcfg,needle", [
    ({"quant_method": "hqq"}, "quantization_config.quant_method='hqq' is not modelled (supported: awq, gptq, fp8, "
                              "mxfp4, modelopt (quant_algo NVFP4), compressed-tensors"),
    ({"quant_method": "fp8", "fmt": "e5m2"}, "quantization_config.fmt='e5m2' is not modelled"),
    ({"quant_method": "fp8", "weight_block_size": None}, "quantization_config.weight_block_size=None"),
    ({"quant_method": "fp8", "weight_block_size": [128]}, "quantization_config.weight_block_size must be two"),
    ({"quant_method": "fp8", "activation_scheme": "tensor"}, "quantization_config.activation_scheme='tensor'"),
    ({"quant_method": "modelopt", "quant_algo": "FP8"}, "quantization_config.quant_algo='FP8' is not modelled "
                                                         "(supported: NVFP4)"),
    ({"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION"}, "quant_algo='MIXED_PRECISION'"),
    ({"quant_method": "modelopt"}, "quantization_config.quant_algo=None is not modelled (supported: NVFP4)"),
    ({"quant_algo": "NVFP4", "group_size": 32}, "quantization_config.group_size=32"),
    ({"quant_algo": "NVFP4", "kv_cache_quant_algo": "INT8"}, "quantization_config.kv_cache_quant_algo='INT8'"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized"}, "quantization_config.format="),
    ({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
      "config_groups": {"g": {**NVFP4_GROUP, "input_activations": None}}},
     "quantization_config.config_groups.g.input_activations=None is not modelled (weight-only NVFP4"),
    # modules_to_not_convert: a part of a module, one layer, or an unknown name is refused by name
    ({"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn.q_proj"]},
     "quantization_config.modules_to_not_convert='model.layers.*.self_attn.q_proj' is not modelled (it names "
     "a part of a module"),
    ({"quant_method": "fp8", "modules_to_not_convert": ["model.layers.0.self_attn"]},
     "it keeps attention in layer(s) [0] only"),
    ({"quant_method": "fp8", "modules_to_not_convert": ["model.layers.*.mlp.experts.3"]}, "one expert"),
    ({"quant_method": "fp8", "modules_to_not_convert": ["frobnicator"]}, "'frobnicator' is not modelled (it "
                                                                        "names no module"),
    ({"quant_method": "fp8", "modules_to_not_convert": "lm_head"}, "must be a list of module names"),
])
def test_quantization_config_refusals(qcfg, needle):
    with raises(needle):
        read(qcfg)


def test_quantization_spec_checks_and_yaml_round_trip():
    with raises("quantization.bits: mxfp4 stores 4-bit values, got 8"):
        QuantizationSpec(method="mxfp4", bits=8)
    with raises("quantization.group_size: nvfp4 has one scale per 16 inputs of a row, got 32"):
        QuantizationSpec(method="nvfp4", group_size=32)
    with raises("quantization.block_size applies to fp8"):
        QuantizationSpec(method="mxfp4", block_size=(1, 32))
    with raises("quantization.modules_to_not_convert: unknown module 'self_attn'"):
        QuantizationSpec(method="fp8", modules_to_not_convert=("self_attn",))
    q = QuantizationSpec(method="fp8", block_size=[64, 128], group_size=128)
    assert (q.block_size, q.scale_block, q.weight_format, q.weight_dtype) == ((64, 128), (64, 128),
                                                                           "fp8-block64x128", "fp8")
    assert (MXFP4_CHECKPOINT.label, QuantizationSpec(method="nvfp4").scale_block) == ("mxfp4 (expert)", (1, 16))
    m = gpt_oss("g", 2, 4, MXFP4_CHECKPOINT)
    assert ModelSpec(**m.to_dict()) == m  # round trip through plain data (a model YAML's quantization:)
    assert set(MODULES) >= set(MXFP4_CHECKPOINT.modules_to_not_convert)
