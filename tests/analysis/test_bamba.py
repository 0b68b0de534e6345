"""Bamba (`bamba`) read from config.json: Llama's layers whose token mixer is attention in the layers
`attn_layer_indices` lists and a Mamba-2 mixer (Granite 4.0-H's, `mamba_*`) in the others, each followed by its
MLP; the attention rotates half of each head (BambaConfig's `partial_rotary_factor`).

Checked against transformers 5.24 on tiny structures invented here and at the config class's default (meta
device): the parameters its checkpoint holds, the Mamba-2 states and K and V its cache keeps, the matrix FLOPs of
a forward pass (`torch.utils.flop_counter`, less the Mamba-2 scan); a static batch priced as `estimate`.
"""

from __future__ import annotations

import re

import pytest
from model_checks import (
    assert_mamba2_states_and_kv,
    assert_read_or_one_error,
    assert_saved_config_reads_back,
    assert_simulated_static_batch_is_estimate,
    assert_static_batch_is_estimate,
    checkpoint_count,
    hf_matrix_flops_less_scan,
    hf_model,
    matrix_flops_less_scan,
)

from llmperf.errors import SpecError
from llmperf.specs.hf import model_spec_from_hf_config

BAMBA = dict(model_type="bamba", vocab_size=128, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=96, mamba_n_heads=8, mamba_d_state=16, mamba_n_groups=2, mamba_chunk_size=4,
             mamba_d_conv=4, num_hidden_layers=4, attn_layer_indices=[1], max_position_embeddings=64)
CASES = {
    "bamba": BAMBA,
    "biases": dict(BAMBA, attention_bias=True, mlp_bias=True, mamba_proj_bias=True, mamba_conv_bias=False,
                   tie_word_embeddings=True),
    "attention_only": dict(BAMBA, attn_layer_indices=[0, 1, 2, 3]),
    "mamba_only": dict(BAMBA, attn_layer_indices=None),
    "full_rotary": dict(BAMBA, rope_parameters={"rope_theta": 5000.0, "rope_type": "default",
                                                "partial_rotary_factor": 1.0}),
}


def read(cfg: dict):
    return model_spec_from_hf_config(dict(cfg), name="bamba")


@pytest.mark.parametrize("cfg", [*CASES.values(), {"model_type": "bamba"}], ids=[*CASES, "class_default"])
def test_parameters_are_transformers_checkpoint(cfg):
    assert read(cfg).param_count == checkpoint_count(hf_model(cfg))


def test_structure():
    spec = read(BAMBA)
    assert [k.label for k in spec.layer_kinds()] == ["linear", "full", "linear", "linear"]
    assert (spec.rotary_dim, spec.head_dim, spec.linear_value_head_dim, spec.state_dtype) == (8, 16, 16, "fp32")
    assert read(CASES["full_rotary"]).rotary_dim == 16 and read(CASES["attention_only"]).layer_types is None
    assert read({"model_type": "bamba"}).layer_types == ("linear",) * 32  # the class default: no attention


def test_state_and_kv_are_what_transformers_caches():
    torch = pytest.importorskip("torch")
    assert_mamba2_states_and_kv(read(BAMBA), BAMBA, state_dtype=torch.float32)


@pytest.mark.parametrize("case", ["bamba", "biases"])
def test_matrix_flops_are_transformers(case):
    spec = read(CASES[case]).scaled(linear_proj_bias=False, qkv_bias=False, out_bias=False, mlp_bias=False)
    assert hf_matrix_flops_less_scan(CASES[case], "mamba") == matrix_flops_less_scan(spec)


def test_a_static_batch_is_priced_as_estimate():
    assert_static_batch_is_estimate(read(BAMBA), 1, "typical")
    assert_simulated_static_batch_is_estimate(read(dict(BAMBA, max_position_embeddings=512)), tp=1)


def test_estimate_reads_a_saved_config(tmp_path):
    """`llmperf estimate` on BambaConfig's default saved by transformers, end to end."""
    from typer.testing import CliRunner

    from llmperf.cli import app

    hf_model({"model_type": "bamba"}).config.save_pretrained(tmp_path)
    result = CliRunner().invoke(app, ["estimate", str(tmp_path), "-H", "h100-sxm", "-b", "4", "-p", "512", "-g", "16"])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("case", ["bamba", "biases", "full_rotary"])
def test_saved_by_transformers_reads_back(case, tmp_path):
    assert_saved_config_reads_back(read, CASES[case], tmp_path, every_key_read=True)


@pytest.mark.parametrize("change, needle", [
    (dict(layers_block_type=["full_attention"] * 4), "layers_block_type=['full_attention', 'full_attention', "
                                                     "'full_attention', 'full_attention'] is not modelled (Bamba's"),
    (dict(hidden_act="gelu"), "hidden_act='gelu' is not modelled"),
    (dict(attn_layer_indices=[7]), "attn_layer_indices"),
    (dict(rope_parameters={"rope_theta": 1e4, "partial_rotary_factor": 0}), "partial_rotary_factor must be in (0, 1]"),
])
def test_refused_fields(change, needle):
    with pytest.raises(SpecError, match=re.escape(needle)):
        read(dict(BAMBA, **change))


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_KEYS = ("attn_layer_indices", "mamba_n_heads", "mamba_d_head", "mamba_expand", "mamba_d_state", "time_step_limit",
         "rope_parameters", "attention_bias", "mlp_bias")
_JUNK = st.one_of(st.none(), st.booleans(), st.integers(-2, 40), st.floats(allow_nan=True, allow_infinity=True),
                  st.text(alphabet="auto", max_size=4), st.lists(st.integers(-1, 5), max_size=4),
                  st.dictionaries(st.sampled_from(["rope_theta", "partial_rotary_factor"]),
                                  st.one_of(st.floats(allow_nan=True), st.integers(-1, 3)), max_size=2))


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_junk_gives_a_spec_or_one_spec_error(data):
    changed = dict(BAMBA)
    for key in data.draw(st.lists(st.sampled_from(_KEYS), min_size=1, max_size=3, unique=True)):
        changed[key] = data.draw(_JUNK)
    assert_read_or_one_error(read, changed)
