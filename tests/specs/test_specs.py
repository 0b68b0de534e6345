"""Golden public numbers and sanity of the built-in data under models_spec/.

Parameter counts are the ones the Hugging Face models report (model.num_parameters()); KV bytes per
token follow `2 * layers * kv_heads * head_dim * bytes`; ridge points are datasheet peak / bandwidth.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from llmperf.specs import (
    DEFAULT_HARDWARE,
    DEFAULT_MODEL,
    HardwareSpec,
    ModelSpec,
    list_hardware,
    list_models,
    load_hardware,
    load_model,
    match_hardware,
)

DATA = Path(__file__).resolve().parents[2] / "models_spec"

# ---- golden numbers ------------------------------------------------------------------------------

PARAMS = {  # as the Hugging Face implementations count them (tied weights once)
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
    "llama-2-7b": 6_738_415_616,
    "llama-2-13b": 13_015_864_320,
    "llama-2-70b": 68_976_648_192,
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.1-70b": 70_553_706_496,
    "llama-3.1-405b": 405_853_388_800,
    "mistral-7b": 7_241_732_096,
    "mixtral-8x7b": 46_702_792_704,
    "qwen2.5-7b": 7_615_616_512,
    "qwen2.5-72b": 72_706_203_648,
}


@pytest.mark.parametrize("name,params", sorted(PARAMS.items()))
def test_param_count_golden(name, params):
    assert load_model(name).param_count == params


def test_mixtral_active_params():
    """Mixtral 8x7B: 46.7B in total, 12.9B touched per token (2 of 8 experts)."""
    m = load_model("mixtral-8x7b")
    assert m.active_param_count == 12_879_925_248
    assert m.param_count - m.active_param_count == 32 * 6 * m.expert_params


def test_gpt3_is_the_175b_model():
    """The paper's 175.0B is a rounding of the exact count of its Table 2.1 shape."""
    m = load_model("gpt3-175b")
    assert m.head_dim == 128 and m.ffn_size == 4 * m.hidden_size
    assert m.param_count == pytest.approx(175e9, rel=0.005)


@pytest.mark.parametrize("name,kv", [("llama-2-7b", 524_288), ("llama-3.1-8b", 131_072),
                                     ("llama-2-13b", 819_200), ("llama-2-70b", 327_680),
                                     ("mistral-7b", 131_072), ("qwen2.5-7b", 57_344), ("gpt2", 36_864)])
def test_kv_bytes_per_token_fp16_golden(name, kv):
    assert load_model(name).kv_bytes_per_token("fp16") == kv


def test_llama2_7b_kv_cache_is_2_gib_at_4096_tokens():
    m = load_model("llama-2-7b")
    assert m.kv_bytes_per_token("fp16") == 512 * 1024
    assert m.kv_bytes_per_token("fp16") * 4096 == 2 * 2**30


def test_llama2_13b_weights_are_26_gb_fp16():
    """Article 000: a 13B model's fp16 weights take ~26 GB of an A100-40GB, "65%" (26 / 40 in nominal
    GB); of the 40 GiB the card really has, 61%."""
    w = load_model("llama-2-13b").weight_bytes("fp16")
    assert w / 1e9 == pytest.approx(26.0, abs=0.1)
    assert w / load_hardware("a100-40gb-sxm").memory_bytes == pytest.approx(0.61, abs=0.01)


def test_ridge_points_golden():
    assert round(load_hardware("a100-80gb-sxm").ridge_point("fp16")) == 153
    assert round(load_hardware("h100-sxm").ridge_point("fp16")) == 295


# datasheet headline numbers (REFERENCE.md): dense fp16 TFLOP/s, GB/s
HEADLINE = {
    "a100-40gb-sxm": (312, 1555), "a100-80gb-sxm": (312, 2039), "a100-80gb-pcie": (312, 1935),
    "h100-sxm": (989, 3350), "h100-pcie": (756, 2000), "h200": (989, 4800), "mi300x": (1307.4, 5300),
    "b200": (2250, 8000), "l4": (121, 300), "l40s": (362.05, 864), "a10": (125, 600),
    "rtx-4090": (165.2, 1008),
}


@pytest.mark.parametrize("name", sorted(HEADLINE))
def test_hardware_headline_numbers(name):
    hw = load_hardware(name)
    tflops, gbps = HEADLINE[name]
    assert hw.peak_tflops["fp16"] == tflops
    assert hw.memory_bandwidth_gbps == gbps
    assert hw.peak_flops_per_s("fp16") == tflops * 1e12
    assert hw.mem_bandwidth_bytes_per_s == gbps * 1e9


def test_h100_sxm_details():
    hw = load_hardware("h100-sxm")
    assert hw.peak_tflops == {"fp32": 67, "tf32": 494.7, "fp16": 989, "bf16": 989, "fp8": 1979, "int8": 1979}
    assert (hw.num_sms, hw.l2_cache_mib, hw.interconnect_gbps) == (132, 50, 450)
    assert hw.memory_gib == pytest.approx(81559 / 1024, abs=0.05)  # what nvidia-smi shows


def test_memory_capacities_in_gib():
    gib = {n: load_hardware(n).memory_gib for n in list_hardware()}
    assert gib["a100-40gb-sxm"] == 40 and gib["a100-80gb-sxm"] == 80
    assert 139 < gib["h200"] < 141 and 190 < gib["mi300x"] < 192 and 178 < gib["b200"] < 181


# ---- every built-in file -------------------------------------------------------------------------

def test_builtin_lists():
    assert len(list_models()) == 30 and len(list_hardware()) == 12  # 16 + today's 14 (issue 22)
    assert DEFAULT_MODEL in list_models() and DEFAULT_HARDWARE in list_hardware()
    # in name order ('gpt2' before 'gpt2-large'; sorting file names put 'gpt2.yaml' after it)
    assert list_models() == sorted(list_models())
    assert list_models().index("gpt2") == list_models().index("gpt2-large") - 1
    assert list_hardware() == sorted(list_hardware())


@pytest.mark.parametrize("kind,names", [("models", list_models()), ("hardware", list_hardware())])
def test_data_files_are_self_describing(kind, names):
    for name in names:
        path = DATA / kind / f"{name}.yaml"
        text = path.read_text()
        assert text.startswith("# "), f"{path}: first line must be a comment describing it"
        data = yaml.safe_load(text)
        assert data["name"] == path.stem == name
        assert data["source"].startswith("https://"), f"{path}: source must be a URL"


@pytest.mark.parametrize("name", list_models())
def test_every_model_loads(name):
    m = load_model(name)
    assert isinstance(m, ModelSpec) and m.name == name
    assert m.param_count > 0 and m.kv_bytes_per_token("fp16") > 0
    # the types the YAML must produce (PyYAML reads `1e-5` without a dot as a string: write 1.0e-5)
    assert isinstance(m.norm_eps, float) and isinstance(m.rope_theta, float)
    for flag in ("tied_embeddings", "qkv_bias", "out_bias", "mlp_bias", "parallel_residual"):
        assert isinstance(getattr(m, flag), bool), flag
    assert load_model(name.upper()) is m  # case-insensitive, cached


@pytest.mark.parametrize("name", list_hardware())
def test_every_hardware_loads_and_is_sane(name):
    hw = load_hardware(name)
    assert isinstance(hw, HardwareSpec) and hw.name == name and hw.variant and hw.device_names
    p = hw.peak_tflops
    assert p["fp16"] >= p.get("bf16", 0)  # never a faster bf16 than fp16 (equal on every device here)
    assert p["fp32"] < p["fp16"] and p.get("tf32", p["fp32"]) <= p["fp16"]
    # dense peaks: an 8-bit format at most doubles the 16-bit rate (a "with sparsity" figure would 4x it)
    # (GeForce: int8 is 4x the fp16-with-fp32-accumulate rate, which is itself half rate)
    for low in ("fp8", "int8"):
        if low in p:
            ratio = 4 if (name, low) == ("rtx-4090", "int8") else 2
            assert p[low] == pytest.approx(ratio * p["fp16"], rel=0.03), f"{name}: {low}"
    assert 100 < hw.ridge_point("fp16") < 450
    assert hw.ridge_point("fp32") < hw.ridge_point("fp16")
    assert hw.on_chip_bytes > 0 and hw.memory_bytes > 16 * 2**30


# ---- matching runtime device names and compute fallback --------------------------------------------

@pytest.mark.parametrize("device_name,expected", [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA A100-SXM4-40GB", "a100-40gb-sxm"),
    ("NVIDIA A100-SXM4-80GB", "a100-80gb-sxm"),
    ("NVIDIA A100 80GB PCIe", "a100-80gb-pcie"),
    ("NVIDIA H200", "h200"),
    ("NVIDIA B200", "b200"),
    ("NVIDIA L4", "l4"),
    ("NVIDIA L40S", "l40s"),
    ("NVIDIA A10", "a10"),
    ("NVIDIA GeForce RTX 4090", "rtx-4090"),
    ("AMD Instinct MI300X", "mi300x"),
    ("AMD Instinct MI300X VF", "mi300x"),
])
def test_match_hardware(device_name, expected):
    assert match_hardware(device_name).name == expected


@pytest.mark.parametrize("device_name", ["NVIDIA GeForce RTX 3090", "Tesla T4", "NVIDIA H100 NVL",
                                         "NVIDIA GH200 480GB", ""])
def test_match_hardware_unknown_is_none(device_name):
    assert match_hardware(device_name) is None


@pytest.mark.parametrize("device_name", ["NVIDIA A100-PCIE-40GB", "NVIDIA A10G", "NVIDIA L40"])
def test_match_hardware_no_prefix_collisions(device_name):
    spec = match_hardware(device_name)
    assert spec is None or spec.name not in ("a10", "l4")


@pytest.mark.parametrize("name,fp8,int4", [("a100-80gb-sxm", "fp16", "int4"), ("a100-40gb-sxm", "fp16", "int4"),
                                           ("a10", "fp16", "int4"), ("h100-sxm", "fp8", "int8"),
                                           ("h200", "fp8", "int8"), ("mi300x", "fp8", "int8"),
                                           ("rtx-4090", "fp8", "int4")])
def test_compute_dtype_fallback(name, fp8, int4):
    hw = load_hardware(name)
    assert hw.compute_dtype("fp8") == fp8
    assert hw.compute_dtype("int4") == int4
    assert hw.compute_dtype("bf16") == "bf16" and hw.compute_dtype("float16") == "fp16"
    assert hw.peak_flops_per_s("fp8") == hw.peak_tflops[fp8] * 1e12


def test_no_fp8_on_ampere():
    for name in ("a100-40gb-sxm", "a100-80gb-sxm", "a100-80gb-pcie", "a10"):
        assert "fp8" not in load_hardware(name).peak_tflops


def test_scaled_rederives_head_and_rotary_dims():
    small = load_model("llama-3.1-8b").scaled(hidden_size=64, num_heads=4, num_kv_heads=2, num_layers=2)
    assert small.head_dim == 16 and small.rotary_dim == 16
    assert load_model("llama-3.1-8b").scaled(num_layers=2).rotary_dim == 128
