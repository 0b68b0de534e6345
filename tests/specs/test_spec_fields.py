"""New spec fields: sliding window, quantization, GPT-2 attention scaling, family descriptions,
finite numbers only (NaN / infinity refused naming the field), optional hardware fields."""

from __future__ import annotations

import re
from dataclasses import fields

import pytest

from llmperf.errors import SpecError
from llmperf.specs import (
    FAMILIES,
    HardwareSpec,
    ModelSpec,
    QuantizationSpec,
    list_models,
    load_hardware,
    load_model,
)
from llmperf.specs.families import FAMILY_FIELDS

GOOD_MODEL = dict(name="m", vocab_size=256, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                  ffn_size=128, max_positions=256)
MINIMAL_HW = "name: mine\npeak_tflops: {fp16: 100}\nmemory_bandwidth_gbps: 1000\nmemory_gib: 16\n"


def raises(text: str):
    return pytest.raises(SpecError, match=re.escape(text))


# ---- NaN and infinity ------------------------------------------------------------------------------

@pytest.mark.parametrize("yaml_value,shown", [(".nan", "nan"), (".NaN", "nan"), (".inf", "inf"),
                                              ("-.inf", "-inf"), ("+.inf", "inf")])
@pytest.mark.parametrize("field", ["memory_bandwidth_gbps", "memory_gib", "l2_cache_mib", "sram_per_sm_kib",
                                   "interconnect_gbps"])
def test_hardware_yaml_refuses_nan_and_inf(tmp_path, field, yaml_value, shown):
    path = tmp_path / "hw.yaml"
    path.write_text(MINIMAL_HW.replace(f"{field}: 1000\n", "").replace(f"{field}: 16\n", "")
                    + f"{field}: {yaml_value}\n")
    with raises(f"{field} must be a finite"):
        load_hardware(str(path))
    with raises(f"got {shown}"):
        load_hardware(str(path))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_hardware_peak_refuses_nan_and_inf(value):
    with raises(f"peak_tflops.fp16 must be a finite positive number, got {value!r}"):
        HardwareSpec(name="x", peak_tflops={"fp16": value}, memory_bandwidth_gbps=1, memory_gib=1)


@pytest.mark.parametrize("field", ["norm_eps", "rope_theta"])
@pytest.mark.parametrize("yaml_value,shown", [(".nan", "nan"), (".inf", "inf"), ("-.inf", "-inf")])
def test_model_yaml_refuses_nan_and_inf(tmp_path, field, yaml_value, shown):
    path = tmp_path / "m.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in GOOD_MODEL.items()) + f"{field}: {yaml_value}\n")
    with raises(f"{field} must be a finite positive number, got {shown}"):
        load_model(str(path))


@pytest.mark.parametrize("field", ["hidden_size", "num_layers", "sliding_window", "max_positions"])
def test_model_integer_fields_refuse_nan_and_inf(field):
    for value in (float("nan"), float("inf")):
        with raises(f"{field} must be a positive integer, got {value!r}"):
            ModelSpec(**{**GOOD_MODEL, field: value})


def test_interconnect_zero_allowed_negative_not():
    assert HardwareSpec(name="x", peak_tflops={"fp16": 1}, memory_bandwidth_gbps=1, memory_gib=1,
                        interconnect_gbps=0).interconnect_gbps == 0
    with raises("interconnect_gbps must be a finite number >= 0, got -1"):
        HardwareSpec(name="x", peak_tflops={"fp16": 1}, memory_bandwidth_gbps=1, memory_gib=1, interconnect_gbps=-1)


# ---- a custom hardware file needs only the roofline's fields --------------------------------------

def test_minimal_hardware_yaml(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(MINIMAL_HW)
    hw = load_hardware(str(path))
    assert hw.ridge_point("fp16") == 100e12 / 1000e9
    assert hw.memory_bytes == 16 * 2**30
    assert (hw.num_sms, hw.sram_per_sm_kib, hw.l2_cache_mib, hw.on_chip_bytes) == (None, None, None, None)
    assert hw.interconnect_gbps == 0 and hw.variant == "" and hw.device_names == ()


@pytest.mark.parametrize("missing", ["peak_tflops", "memory_bandwidth_gbps", "memory_gib"])
def test_hardware_required_fields(tmp_path, missing):
    path = tmp_path / "mine.yaml"
    path.write_text("".join(line + "\n" for line in MINIMAL_HW.splitlines() if not line.startswith(missing)))
    with raises(f"missing field {missing!r}"):
        load_hardware(str(path))


def test_hardware_required_field_set():
    """What docs/specs.md documents as required: the roofline's inputs and nothing else."""
    import dataclasses
    required = {f.name for f in fields(HardwareSpec)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    assert required == {"name", "peak_tflops", "memory_bandwidth_gbps", "memory_gib"}


# ---- sliding window, attention scaling -------------------------------------------------------------

def test_sliding_window_field():
    assert load_model("mistral-7b").sliding_window == 4096
    assert load_model("llama-3.1-8b").sliding_window is None
    assert load_model("qwen2.5-7b").sliding_window is None  # use_sliding_window is false
    assert load_model("mixtral-8x7b").sliding_window is None
    with raises("sliding_window must be a positive integer, got 0"):
        ModelSpec(**{**GOOD_MODEL, "sliding_window": 0})
    with raises("sliding_window must be a positive integer, got 10.5"):
        ModelSpec(**{**GOOD_MODEL, "sliding_window": 10.5})


def test_attention_scale_flags():
    m = ModelSpec(**GOOD_MODEL)
    assert m.attn_scale is True and m.attn_scale_inverse_layer_idx is False
    for f in ("attn_scale", "attn_scale_inverse_layer_idx"):
        with raises(f"{f} must be true or false, got 'yes'"):
            ModelSpec(**{**GOOD_MODEL, f: "yes"})


# ---- quantization ---------------------------------------------------------------------------------

def test_quantization_spec():
    q = QuantizationSpec(method="awq", bits=4, group_size=128, zero_point=True)
    assert (q.weight_dtype, q.bytes_per_weight) == ("int4", 0.5)
    assert QuantizationSpec(method="gptq", bits=8, group_size=None, zero_point=False).weight_dtype == "int8"


@pytest.mark.parametrize("kwargs,needle", [
    (dict(method="bnb"), "quantization.method must be one of awq, gptq, fp8, mxfp4, nvfp4, got 'bnb'"),
    (dict(bits=3), "quantization.bits must be one of 4, 8, got 3"),
    (dict(bits=True), "quantization.bits must be one of 4, 8, got True"),
    (dict(group_size=0), "quantization.group_size must be a positive integer or null (per channel), got 0"),
    (dict(group_size=-1), "got -1"),
    (dict(zero_point="yes"), "quantization.zero_point must be true or false, got 'yes'"),
])
def test_quantization_bad_fields(kwargs, needle):
    with raises(needle):
        QuantizationSpec(**{**dict(method="gptq", bits=4), **kwargs})


def test_quantization_from_yaml(tmp_path):
    path = tmp_path / "q.yaml"
    body = "".join(f"{k}: {v}\n" for k, v in GOOD_MODEL.items())
    path.write_text(body + "quantization: {method: awq, bits: 4, group_size: 128, zero_point: true}\n")
    m = load_model(str(path))
    assert m.quantization == QuantizationSpec(method="awq", bits=4, group_size=128, zero_point=True)
    assert ModelSpec(**m.to_dict()) == m  # round trip through plain data
    path.write_text(body + "quantization: {method: awq, bitz: 4}\n")
    with raises("unknown field 'quantization.bitz'"):
        load_model(str(path))
    path.write_text(body + "quantization: {method: awq}\n")
    with raises("missing field 'quantization.bits'"):
        load_model(str(path))
    path.write_text(body + "quantization: int4\n")
    with raises("quantization must be a mapping"):
        load_model(str(path))


# ---- family descriptions ----------------------------------------------------------------------------

@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_fills_the_structural_fields(family):
    m = ModelSpec(**GOOD_MODEL, family=family)
    for f in FAMILY_FIELDS:
        assert getattr(m, f) == getattr(FAMILIES[family], f), f


def test_explicit_fields_override_the_family():
    m = ModelSpec(**GOOD_MODEL, family="llama", qkv_bias=True)  # Qwen2's layout on a llama block
    assert m.qkv_bias and not m.out_bias and m.norm_kind == "rmsnorm"


def test_scaled_to_another_family_rederives_its_fields():
    m = ModelSpec(**GOOD_MODEL).scaled(family="gpt2")
    assert (m.norm_kind, m.pos_encoding, m.tied_embeddings, m.qkv_bias) == ("layernorm", "learned", True, True)
    assert m.scaled(num_layers=4).norm_kind == "layernorm"  # other changes keep the fields


def test_unknown_family():
    with raises("family must be one of llama, gpt2, opt, gpt_neox, got 'bert'"):
        ModelSpec(**GOOD_MODEL, family="bert")


@pytest.mark.parametrize("name", list_models())
def test_builtin_models_structural_fields_are_set(name):
    m = load_model(name)
    assert all(getattr(m, f) is not None for f in FAMILY_FIELDS)


@pytest.mark.parametrize("scaling,needle", [
    ({"rope_type": "linear", "factor": float("nan")}, "rope_scaling.factor must be a finite positive number, got nan"),
    ({"rope_type": "linear", "factor": float("inf")}, "rope_scaling.factor must be a finite positive number, got inf"),
    ({"rope_type": "linear", "factor": 0}, "rope_scaling.factor must be a finite positive number, got 0"),
    ({"rope_type": "longrope", "short_factor": [1.0, float("nan")]}, "rope_scaling.short_factor must be finite"),
    ("big", "rope_scaling must be a mapping, got 'big'"),
])
def test_rope_scaling_numbers_are_finite(scaling, needle):
    with raises(needle):
        ModelSpec(**GOOD_MODEL, rope_scaling=scaling)


def test_model_yaml_rope_scaling_nan(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in GOOD_MODEL.items())
                    + "rope_scaling: {rope_type: linear, factor: .nan}\n")
    with raises("rope_scaling.factor must be a finite positive number, got nan"):
        load_model(str(path))


@pytest.mark.parametrize("line,field", [("memory_bandwidth_gbps: .nan", "memory_bandwidth_gbps"),
                                        ("memory_gib: .inf", "memory_gib"),
                                        ("peak_tflops: {fp16: .nan}", "peak_tflops.fp16")])
@pytest.mark.parametrize("fmt", ["table", "json"])
def test_cli_refuses_nan_hardware_with_one_line(tmp_path, line, field, fmt):
    """The issue's case: a `.nan` bandwidth used to print `nan ns` and bare NaN in JSON."""
    from typer.testing import CliRunner

    from llmperf.cli import app
    key = line.split(":")[0]
    text = "".join(row + "\n" for row in MINIMAL_HW.splitlines() if not row.startswith(key)) + line + "\n"
    path = tmp_path / "hw.yaml"
    path.write_text(text)
    out = tmp_path / "out.json"
    r = CliRunner().invoke(app, ["estimate", "-H", str(path), "-f", fmt, "-o", str(out)])
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0] and "must be a finite" in lines[0]
    assert "Traceback" not in r.output and not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hw.yaml"]


@pytest.mark.parametrize("prompt_len,gen_len", [(20_000, 64), (4_096, 64), (3_000, 2_000), (4_000, 200)])
def test_sliding_window_decode_closed_form_equals_the_steps(prompt_len, gen_len):
    """A prompt already past Mistral's 4096-token window: every decode step reads 4096 tokens of KV,
    so the closed-form TPOT equals the mean of the per-step times (it once summed the steps between
    the window and the prompt: 1.8 s per token instead of 8 ms at a 32k prompt)."""
    import numpy as np

    import llmperf
    est = llmperf.estimate("mistral-7b", "a100-80gb-sxm", batch=4, prompt_len=prompt_len, gen_len=gen_len)
    steps = np.asarray(list(est.decode_step_times_s()))
    assert len(steps) == gen_len - 1
    assert est.tpot_s == pytest.approx(steps.mean(), rel=1e-9)
    if prompt_len >= 4096:
        assert steps.max() == pytest.approx(steps.min(), rel=1e-12)  # the window caps the context


# ---- any junk in any field: a spec or one SpecError, never another exception ------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_JUNK = st.one_of(st.none(), st.booleans(), st.integers(-3, 10_000), st.floats(allow_nan=True, allow_infinity=True),
                  st.text(max_size=5), st.lists(st.integers(0, 3), max_size=2),
                  st.dictionaries(st.text(max_size=4), st.one_of(st.integers(-1, 9), st.floats(), st.text(max_size=3)),
                                  max_size=2))
GOOD_HW = dict(name="hw", peak_tflops={"fp16": 100}, memory_bandwidth_gbps=1000, memory_gib=16)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_junk_model_fields(data):
    names = [f.name for f in fields(ModelSpec) if f.name != "name"]
    changed = dict(GOOD_MODEL)
    for key in data.draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True)):
        changed[key] = data.draw(_JUNK)
    try:
        m = ModelSpec(**changed)
    except SpecError as exc:
        assert "\n" not in str(exc)
    else:
        assert m.param_count > 0 and m.kv_bytes_per_token("fp16") > 0


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_junk_hardware_fields(data):
    names = [f.name for f in fields(HardwareSpec) if f.name not in ("name", "efficiency", "calibration")]
    changed = dict(GOOD_HW)
    for key in data.draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True)):
        changed[key] = data.draw(_JUNK)
    try:
        hw = HardwareSpec(**changed)
    except SpecError as exc:
        assert "\n" not in str(exc)
    else:
        assert 0 < hw.ridge_point(next(iter(hw.peak_tflops))) < float("inf")


def test_a_bandwidth_whose_ridge_point_overflows_is_refused_by_name():
    """Found by `test_junk_hardware_fields`: 1e-308 GB/s passed every per-field check, then the ridge
    point (peak FLOP/s / bytes/s) was infinite."""
    with pytest.raises(SpecError, match="memory_bandwidth_gbps is too small for its peak_tflops"):
        HardwareSpec(**dict(GOOD_HW, memory_bandwidth_gbps=1.1125369292536007e-308))


@pytest.mark.parametrize("key", ["\n", "", " a", 3])
def test_a_rope_scaling_key_that_cannot_print_on_one_line_is_named_by_its_repr(key):
    # found by test_junk_model_fields (hypothesis) on an AVX2-emulated CI run: a key '\n' broke the message
    from llmperf.specs import load_model
    with pytest.raises(SpecError) as exc:
        load_model("llama-3.1-8b").scaled(rope_scaling={key: 0})
    assert "\n" not in str(exc.value) and f"rope_scaling[{key!r}]" in str(exc.value)
