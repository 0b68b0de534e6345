"""Bad input: each case is one `SpecError` whose message names the field (or name, or file) and value."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from llmperf.errors import SpecError
from llmperf.specs import HardwareSpec, ModelSpec, Precision, load_hardware, load_model, normalize_dtype
from llmperf.specs.hf import SUPPORTED_MODEL_TYPES

GOOD_MODEL = dict(name="m", vocab_size=256, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                  ffn_size=128, max_positions=256)
GOOD_HW = dict(name="hw", peak_tflops={"fp16": 100, "fp32": 10}, memory_bandwidth_gbps=1000, memory_gib=16,
               num_sms=10, sram_per_sm_kib=128, l2_cache_mib=4)


def write_yaml(tmp_path, data, name="bad.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def raises(match: str):
    return pytest.raises(SpecError, match=re.escape(match))


# ---- names and files ---------------------------------------------------------------------------

def test_unknown_model_lists_close_names():
    with pytest.raises(SpecError) as err:
        load_model("llama-2-7")
    msg = str(err.value)
    assert "unknown model 'llama-2-7'" in msg and "did you mean" in msg
    assert "llama-2-7b" in msg and "llama-2-70b" in msg
    assert "gpt2" not in msg  # only the close ones


def test_unknown_model_without_close_names_lists_all():
    with pytest.raises(SpecError) as err:
        load_model("zzzzzz")
    assert "known:" in str(err.value) and "qwen2.5-72b" in str(err.value)


def test_no_substring_matching_of_names():
    with raises("unknown model 'llama'"):
        load_model("llama")


def test_unknown_hardware_lists_close_names():
    with pytest.raises(SpecError) as err:
        load_hardware("h100")
    assert "unknown hardware 'h100'" in str(err.value)
    assert "h100-sxm" in str(err.value) and "h100-pcie" in str(err.value)


@pytest.mark.parametrize("loader", [load_model, load_hardware])
def test_file_not_found(loader, tmp_path):
    missing = str(tmp_path / "nope.yaml")
    with raises(f"file not found: {missing!r}"):
        loader(missing)


@pytest.mark.parametrize("loader", [load_model, load_hardware])
def test_invalid_yaml(loader, tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("name: [unclosed\nhidden_size: 64\n")
    with raises(f"{path}: not valid YAML"):
        loader(str(path))


def test_invalid_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with raises(f"{path}: not valid JSON"):
        load_model(str(path))


def test_yaml_that_is_not_a_mapping(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    with raises("expected a mapping of fields, got list"):
        load_model(str(path))


# ---- fields of a model file ----------------------------------------------------------------------

def test_missing_field(tmp_path):
    data = {k: v for k, v in GOOD_MODEL.items() if k != "hidden_size"}
    with raises("bad: missing field 'hidden_size'"):
        load_model(str(write_yaml(tmp_path, data)))


def test_empty_required_field(tmp_path):
    with raises("field 'ffn_size' is empty"):
        load_model(str(write_yaml(tmp_path, {**GOOD_MODEL, "ffn_size": None})))


@pytest.mark.parametrize("field,value", [("hidden_size", 0), ("num_layers", -2), ("vocab_size", 0),
                                         ("ffn_size", -1), ("max_positions", 0), ("num_kv_heads", 0),
                                         ("num_layers", 2.5), ("num_heads", True)])
def test_non_positive_or_non_integer_field(tmp_path, field, value):
    with raises(f"{field} must be a positive integer, got {value!r}"):
        load_model(str(write_yaml(tmp_path, {**GOOD_MODEL, field: value})))


def test_non_positive_norm_eps():
    with raises("norm_eps must be a finite positive number, got 0"):
        ModelSpec(**{**GOOD_MODEL, "norm_eps": 0})


def test_heads_do_not_divide_hidden(tmp_path):
    data = {**GOOD_MODEL, "hidden_size": 100, "num_heads": 3, "num_kv_heads": 3}
    with raises("num_heads=3 does not divide hidden_size=100"):
        load_model(str(write_yaml(tmp_path, data)))


def test_kv_heads_do_not_divide_heads(tmp_path):
    with raises("num_kv_heads=3 does not divide num_heads=4"):
        load_model(str(write_yaml(tmp_path, {**GOOD_MODEL, "num_kv_heads": 3})))


def test_unknown_field(tmp_path):
    with raises("bad: unknown field 'hiden_size'"):
        load_model(str(write_yaml(tmp_path, {**GOOD_MODEL, "hiden_size": 64})))


@pytest.mark.parametrize("field,value", [("ffn_kind", "geglu"), ("norm_kind", "batchnorm"),
                                         ("pos_encoding", "alibi"), ("family", "bert")])
def test_unknown_choice(field, value):
    with raises(f"{field} must be one of"):
        ModelSpec(**{**GOOD_MODEL, field: value})
    with raises(repr(value)):
        ModelSpec(**{**GOOD_MODEL, field: value})


def test_more_active_experts_than_experts():
    with raises("experts_per_token=3 exceeds num_experts=2"):
        ModelSpec(**{**GOOD_MODEL, "num_experts": 2, "experts_per_token": 3})


# ---- dtypes ------------------------------------------------------------------------------------

def test_unknown_model_dtype(tmp_path):
    with raises("dtype: unknown dtype 'fp12'"):
        load_model(str(write_yaml(tmp_path, {**GOOD_MODEL, "dtype": "fp12"})))


@pytest.mark.parametrize("field", ["weights", "activations", "kv"])
def test_unknown_precision_dtype(field):
    with raises(f"precision.{field}: unknown dtype 'int3'"):
        Precision(**{field: "int3"})


def test_unknown_dtype_names_the_choices():
    with pytest.raises(SpecError) as err:
        normalize_dtype("e5m2x")
    assert "fp16" in str(err.value) and "int4" in str(err.value)


def test_kv_bytes_unknown_dtype():
    with raises("unknown dtype 'fp64'"):
        ModelSpec(**GOOD_MODEL).kv_bytes_per_token("fp64")


# ---- hardware files ----------------------------------------------------------------------------

def test_hardware_unknown_peak_dtype(tmp_path):
    data = {**GOOD_HW, "peak_tflops": {"fp16": 100, "fp12": 5}}
    with raises("unknown dtype 'fp12'"):
        load_hardware(str(write_yaml(tmp_path, data)))


@pytest.mark.parametrize("field,value", [("memory_bandwidth_gbps", 0), ("memory_gib", -1),
                                         ("l2_cache_mib", 0), ("sram_per_sm_kib", "big")])
def test_hardware_non_positive_number(tmp_path, field, value):
    with raises(f"{field} must be a finite positive number, got {value!r}"):
        load_hardware(str(write_yaml(tmp_path, {**GOOD_HW, field: value})))


def test_hardware_non_positive_peak():
    with raises("peak_tflops.fp16 must be a finite positive number, got 0"):
        HardwareSpec(**{**GOOD_HW, "peak_tflops": {"fp16": 0}})


def test_hardware_num_sms_integer():
    with raises("num_sms must be a positive integer, got 10.5"):
        HardwareSpec(**{**GOOD_HW, "num_sms": 10.5})


def test_hardware_missing_and_unknown_field(tmp_path):
    data = {k: v for k, v in GOOD_HW.items() if k != "memory_gib"}
    with raises("missing field 'memory_gib'"):
        load_hardware(str(write_yaml(tmp_path, data)))
    with raises("unknown field 'tflops'"):
        load_hardware(str(write_yaml(tmp_path, {**GOOD_HW, "tflops": 1})))


def test_hardware_empty_peaks():
    with raises("peak_tflops must list at least one dtype"):
        HardwareSpec(**{**GOOD_HW, "peak_tflops": {}})


def test_compute_dtype_without_any_peak():
    hw = HardwareSpec(**{**GOOD_HW, "peak_tflops": {"int8": 10}})
    with raises("no compute peak for dtype 'fp32'"):
        hw.compute_dtype("fp32")


# ---- Hugging Face configs ------------------------------------------------------------------------

def test_unsupported_hf_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 768}))
    with pytest.raises(SpecError) as err:
        load_model(str(tmp_path))
    msg = str(err.value)
    assert "model_type 'bert' is not supported" in msg
    assert all(mt in msg for mt in SUPPORTED_MODEL_TYPES)


def test_hf_config_missing_field(tmp_path):
    cfg = {"model_type": "llama", "vocab_size": 32000, "hidden_size": 4096, "num_attention_heads": 32,
           "intermediate_size": 11008, "max_position_embeddings": 4096}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with raises("missing field 'num_hidden_layers'"):
        ModelSpec.from_hf_config(tmp_path)


def test_hf_config_invalid_value_names_the_file(tmp_path):
    cfg = {"model_type": "llama", "vocab_size": 32000, "hidden_size": 4096, "num_hidden_layers": 2,
           "num_attention_heads": 32, "num_key_value_heads": 5, "intermediate_size": 11008,
           "max_position_embeddings": 4096}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(SpecError) as err:
        ModelSpec.from_hf_config(path)
    assert str(path) in str(err.value) and "num_kv_heads=5 does not divide num_heads=32" in str(err.value)


def test_opt_projected_embeddings_rejected(tmp_path):
    cfg = {"model_type": "opt", "vocab_size": 50272, "hidden_size": 1024, "word_embed_proj_dim": 512,
           "num_hidden_layers": 24, "num_attention_heads": 16, "ffn_dim": 4096, "max_position_embeddings": 2048}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with raises("word_embed_proj_dim=512 differs from hidden_size=1024"):
        ModelSpec.from_hf_config(tmp_path)


def test_error_is_a_value_error():
    """Callers that catch ValueError (argparse, typer callbacks) see spec errors too."""
    assert issubclass(SpecError, ValueError)


# ---- gaps found in llmperf/specs by these tests, now fixed -------------------------------------------

_BASE = "vocab_size: 256\nhidden_size: 64\nnum_layers: 2\nnum_heads: 4\nffn_size: 128\nmax_positions: 256\n"


def _load_text(tmp_path, text, loader=load_model):
    path = tmp_path / "e.yaml"
    path.write_text(text)
    return loader(str(path))


def test_yaml_exponent_without_dot_is_a_number(tmp_path):
    m = _load_text(tmp_path, _BASE + "norm_eps: 1e-6\nrope_theta: 1e6\n")
    assert (m.norm_eps, m.rope_theta) == (1e-6, 1e6)


@pytest.mark.parametrize("text,field", [(_BASE + "norm_eps: small\n", "norm_eps"),
                                        (_BASE + "position_offset: x\n", "position_offset"),
                                        (_BASE + "num_experts: 2\nshared_experts: x\n", "shared_experts")])
def test_non_numeric_model_field_names_the_field(tmp_path, text, field):
    with raises(field):
        _load_text(tmp_path, text)


def test_non_numeric_interconnect_names_the_field(tmp_path):
    with raises("interconnect_gbps"):
        HardwareSpec(**{**GOOD_HW, "interconnect_gbps": "fast"})


@pytest.mark.parametrize("value", [-5.0, 0, "1e6"])
def test_invalid_rope_theta(value):
    with raises("rope_theta"):
        ModelSpec(**{**GOOD_MODEL, "rope_theta": value})


@pytest.mark.parametrize("field", ["tied_embeddings", "qkv_bias", "out_bias", "mlp_bias", "parallel_residual"])
def test_bool_fields_must_be_bools(field):
    with raises(field):
        ModelSpec(**{**GOOD_MODEL, field: "maybe"})


# ---- close names: prefix, then token, then spelling ----------------------------------------------------

@pytest.mark.parametrize("loader,name,expected", [
    (load_hardware, "a100", ["a100-40gb-sxm", "a100-80gb-pcie", "a100-80gb-sxm"]),  # prefix, not the A10
    (load_hardware, "A100", ["a100-40gb-sxm", "a100-80gb-pcie", "a100-80gb-sxm"]),
    (load_hardware, "h100 sxm", ["h100-sxm"]),  # tokens
    (load_hardware, "80gb", ["a100-80gb-pcie", "a100-80gb-sxm"]),
    (load_hardware, "sxm_h100", ["h100-sxm"]),  # tokens in any order, any separator
    (load_hardware, "h10", ["h100-pcie", "h100-sxm"]),
    (load_model, "llama-8b", ["llama-3.1-8b"]),
    (load_model, "mistral", ["mistral-7b"]),
    (load_model, "qwen", ["qwen2.5-72b", "qwen2.5-7b"]),
    (load_model, "lama-2-7b", ["llama-2-7b"]),  # spelling, only when nothing else matches
])
def test_close_names(loader, name, expected):
    from llmperf.specs import list_hardware, list_models
    from llmperf.specs.names import close_names
    known = list_hardware() if loader is load_hardware else list_models()
    got = close_names(name, known)
    assert got[:len(expected)] == expected
    with pytest.raises(SpecError) as err:
        loader(name)
    msg = str(err.value)
    assert msg.startswith(f"unknown {'hardware' if loader is load_hardware else 'model'} {name!r} (did you mean: ")
    assert all(e in msg for e in expected)


def test_a100_does_not_suggest_the_a10():
    with pytest.raises(SpecError) as err:
        load_hardware("a100")
    assert "a10," not in str(err.value) and not str(err.value).endswith("a10)")


@pytest.mark.parametrize("name", ["A100-80GB-SXM", "Llama-3.1-8B", " h100-sxm "])
def test_exact_names_are_case_insensitive_only(name):
    if "llama" in name.lower():
        assert load_model(name.strip()).name == "llama-3.1-8b"
    else:
        assert load_hardware(name.strip()).name == name.strip().lower()


def test_no_separator_folding_in_exact_lookup():
    """Exact means exact: a100_80gb_sxm is suggested, not silently taken."""
    with raises("unknown hardware 'a100_80gb_sxm' (did you mean: a100-80gb-sxm"):
        load_hardware("a100_80gb_sxm")


def test_every_prefix_suggests_its_names():
    """Any prefix of a built-in name that is not itself a name lists that name."""
    from llmperf.specs import list_hardware, list_models
    from llmperf.specs.names import close_names
    for known in (list_models(), list_hardware()):
        for name in known:
            for k in range(1, len(name)):
                if name[:k] not in known:
                    assert name in close_names(name[:k], known), (name[:k], name)


def test_every_token_subset_suggests_its_names():
    from llmperf.specs import list_hardware, list_models
    from llmperf.specs.names import close_names, tokens
    for known in (list_models(), list_hardware()):
        for name in known:
            parts = tokens(name)
            for drop in range(len(parts)):
                query = " ".join(parts[:drop] + parts[drop + 1:])
                if query and query not in known:
                    assert name in close_names(query, known), (query, name)


def test_unknown_name_lists_the_close_names():
    from llmperf.specs.names import unknown_name
    assert str(unknown_name("hardware", "a100", ["a10", "a100-80gb"])) == \
        "unknown hardware 'a100' (did you mean: a100-80gb)"
