"""IBM Granite read from config.json: `granite` (Llama's layers), `granitemoe` (Mixtral's), `granitemoeshared`
(with a shared MLP) and `granitemoehybrid` (Granite 4.0-H: Mamba-2 or attention layers, each followed by an MoE
with a shared MLP, or by that MLP alone when `num_local_experts` is 0), all with four scalars: the embedding, each
sublayer's output and the logits scaled, the softmax scale set (`embedding_multiplier`, `residual_multiplier`,
`logits_scaling`, `attention_multiplier`).

Checked against transformers 5.24 on tiny structures invented here and at each config class's default (meta
device): the parameters its checkpoint holds, the Mamba-2 states and the K and V its cache keeps, the matrix FLOPs
of a forward pass (`torch.utils.flop_counter`, less the Mamba-2 scan as for Nemotron-H); the serving cost model and
the simulator price a static batch as `estimate` does. What llmperf does not model is refused by name.
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

SCALARS = dict(embedding_multiplier=3.5, residual_multiplier=0.5, logits_scaling=4.0, attention_multiplier=0.05)
HYBRID = dict(model_type="granitemoehybrid", vocab_size=128, hidden_size=64, num_attention_heads=4,
              num_key_value_heads=2, intermediate_size=24, shared_intermediate_size=32, num_local_experts=4,
              num_experts_per_tok=2, mamba_n_heads=8, mamba_d_state=16, mamba_n_groups=2, mamba_chunk_size=4,
              mamba_d_conv=4, num_hidden_layers=4, max_position_embeddings=64,
              layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"], **SCALARS)
GRANITE = dict(model_type="granite", vocab_size=128, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=96, num_hidden_layers=2, max_position_embeddings=64, **SCALARS)
MOE = dict(GRANITE, model_type="granitemoe", intermediate_size=24, num_local_experts=4, num_experts_per_tok=2)
CASES = {
    "hybrid": HYBRID,
    "hybrid_dense": dict(HYBRID, num_local_experts=0),
    # rope positions, biases on attention and on the Mamba-2 projections, none on its convolution, tied head
    "hybrid_rope_biases": dict(HYBRID, position_embedding_type="rope", attention_bias=True, mamba_proj_bias=True,
                               mamba_conv_bias=False, tie_word_embeddings=True, mamba_expand=1, mamba_d_head=8),
    # the hub's older spelling, remapped by transformers: layers_block_type of mamba / attention
    "hybrid_legacy": dict({k: v for k, v in HYBRID.items() if k != "layer_types"},
                          layers_block_type=["mamba", "attention", "mamba", "attention"]),
    "hybrid_attention_only": dict(HYBRID, layer_types=["full_attention"] * 4),
    "hybrid_mamba_only": dict(HYBRID, layer_types=None),
    "granite": GRANITE,
    "granite_biases": dict(GRANITE, attention_bias=True, mlp_bias=True, tie_word_embeddings=True, head_dim=32),
    "granitemoe": MOE,
    "granitemoeshared": dict(MOE, model_type="granitemoeshared", shared_intermediate_size=40),
    "granitemoeshared_none": dict(MOE, model_type="granitemoeshared"),
}
TYPES = ("granite", "granitemoe", "granitemoeshared", "granitemoehybrid")


def read(cfg: dict):
    return model_spec_from_hf_config(dict(cfg), name="granite")


@pytest.mark.parametrize("case", list(CASES))
def test_parameters_are_transformers_checkpoint(case):
    assert read(CASES[case]).param_count == checkpoint_count(hf_model(CASES[case]))


@pytest.mark.parametrize("model_type", TYPES)
def test_the_class_default(model_type):
    """Each config class's own shape (not a released model): GraniteMoeHybridConfig's is 32 Mamba-2 layers."""
    cfg = {"model_type": model_type}
    assert read(cfg).param_count == checkpoint_count(hf_model(cfg))


def test_structure():
    spec = read(HYBRID)
    assert [k.label for k in spec.layer_kinds()] == ["linear/moe", "full/moe/nope", "linear/moe", "linear/moe"]
    assert spec.layer_types == ("linear", "full", "linear", "linear") and spec.nope_layers == (1,)
    assert not spec.mixer_only_layers and not spec.dense_layers
    assert (spec.linear_mixer, spec.linear_num_key_heads, spec.linear_num_value_heads) == ("mamba2", 2, 8)
    assert (spec.linear_key_head_dim, spec.linear_value_head_dim, spec.linear_conv_kernel) == (16, 16, 4)
    assert (spec.linear_chunk_size, spec.linear_conv_bias, spec.linear_proj_bias, spec.linear_dt_min) == (
        4, True, False, 0.0)
    assert (spec.num_experts, spec.experts_per_token, spec.ffn_size, spec.shared_experts, spec.shared_ffn_size) == (
        4, 2, 24, 1, 32)
    assert (spec.router_scoring, spec.router_renormalize, spec.ffn_kind, spec.state_dtype) == (
        "softmax", True, "swiglu", "fp32")
    assert (spec.embedding_multiplier, spec.residual_multiplier, spec.logits_scaling, spec.attention_multiplier) == (
        3.5, 0.5, 4.0, 0.05)
    dense = read(CASES["hybrid_dense"])
    assert not dense.is_moe and dense.ffn_size == 32 and dense.shared_experts == 0
    rope = read(CASES["hybrid_rope_biases"])
    assert rope.nope_layers == () and rope.linear_value_head_dim == 8 and rope.tied_embeddings
    assert read(CASES["hybrid_legacy"]).layer_types == ("linear", "full", "linear", "full")
    assert read(CASES["hybrid_attention_only"]).layer_types is None
    assert read({"model_type": "granitemoehybrid"}).attention_multiplier == 1.0  # the class default: scale 1
    assert read(CASES["granitemoeshared_none"]).shared_experts == 0


def test_state_and_kv_are_what_transformers_caches():
    """After a 7-token prompt: each Mamba-2 layer's recurrent state (heads x head dim x state size) and its
    convolution's inputs (transformers keeps all K of them; vLLM, and llmperf, the K - 1 the next step needs),
    the attention layers' K and V."""
    for cfg in (HYBRID, CASES["hybrid_rope_biases"], CASES["hybrid_legacy"]):
        spec = read(cfg)
        assert_mamba2_states_and_kv(spec, cfg)
        kv, kinds = spec.kv_cache(1.0), spec.layer_types
        assert kv.kv_layers == kinds.count("full")
        assert kv.linear_layers == kinds.count("linear")
        # the recurrent state in fp32 (transformers' cache keeps its scan's output so, in a bf16 model too), the
        # convolution's inputs at the activations' dtype
        assert spec.kv_cache("bf16").state_bytes == kinds.count("linear") * (
            4 * spec.linear_state_elements + 2 * spec.linear_conv_state_elements)


@pytest.mark.parametrize("case", ["hybrid", "hybrid_dense", "hybrid_rope_biases", "granite_biases", "granitemoe",
                                  "granitemoeshared"])
def test_matrix_flops_are_transformers(case):
    """Every projection, the eager attention (its whole masked square: the dense convention), the router and
    the experts as transformers runs them; the Mamba-2 scan's own products are priced by `ssd` (mamba_ssm's
    chunked kernels), not by transformers' reference loop: both are left out, as for Nemotron-H."""
    cfg = CASES[case]
    # the counter counts `addmm` as its product only
    spec = read(cfg).scaled(linear_proj_bias=False, qkv_bias=False, out_bias=False, mlp_bias=False)
    assert hf_matrix_flops_less_scan(cfg, "mamba", eager_experts=True) == matrix_flops_less_scan(spec)


def test_the_scalars_are_counted_where_they_run():
    """The embedding's and the logits' scalings are an operation an element each (`embed_scale`, `logits_scale`),
    the residual multiplier one more in each residual add (fused); the softmax scale costs nothing more."""
    from llmperf.analysis import ForwardModel
    from llmperf.specs import Precision

    spec = read(GRANITE)
    plain = spec.scaled(embedding_multiplier=1.0, residual_multiplier=1.0, logits_scaling=1.0,
                        attention_multiplier=None)
    ops = {s.residual_multiplier: {o.name: o for o in ForwardModel(model=s, precision=Precision()).forward_ops(
        3, 5, 5)} for s in (spec, plain)}
    assert ops[0.5]["embed_scale"].flops == 3 * 5 * 64 and "embed_scale" not in ops[1.0]
    assert ops[0.5]["logits_scale"].flops == 3 * 128 and "logits_scale" not in ops[1.0]
    for name in ("attn_residual", "mlp_residual"):
        assert ops[0.5][name].flops == 2 * ops[1.0][name].flops
        assert ops[0.5][name].bytes_total == ops[1.0][name].bytes_total
    assert ops[0.5]["attention"].flops == ops[1.0]["attention"].flops


@pytest.mark.parametrize("case, tp, eff", [("hybrid", 1, "roofline"), ("hybrid", 1, "typical"),
                                           ("hybrid_dense", 2, "typical"), ("granite", 2, "typical"),
                                           ("granitemoeshared", 2, "roofline")])
def test_a_static_batch_is_priced_as_estimate(case, tp, eff):
    assert_static_batch_is_estimate(read(CASES[case]), tp, eff)


@pytest.mark.parametrize("case", ["hybrid", "granite"])
def test_the_simulator_prices_a_static_batch_as_estimate(case):
    assert_simulated_static_batch_is_estimate(read(dict(CASES[case], max_position_embeddings=512)))


@pytest.mark.parametrize("case", ["hybrid", "hybrid_legacy", "hybrid_rope_biases", "granite_biases",
                                  "granitemoeshared"])
def test_saved_by_transformers_reads_back(case, tmp_path):
    """transformers writes `layer_types` (remapped), `time_step_limit` with its infinity as a mapping, and
    `mamba_d_head` resolved: read back, the same model; every key of the tiny configs is read."""
    assert_saved_config_reads_back(read, CASES[case], tmp_path, every_key_read=True)


@pytest.mark.parametrize("change, needle", [
    (dict(layer_types=["linear_attention", "sliding_attention"] * 2),
     "layer_types='sliding_attention' is not modelled (granitemoehybrid builds Mamba-2"),
    (dict(position_embedding_type="alibi"), "position_embedding_type='alibi' is not modelled"),
    (dict(hidden_act="gelu"), "hidden_act='gelu' is not modelled (it is also the Mamba-2 convolution's activation"),
    (dict(time_step_limit=[0.001, 0.1]), "time_step_limit=[0.001, 0.1] is not modelled (an upper clamp of dt)"),
    (dict(num_local_experts=0, shared_intermediate_size=0),
     "shared_intermediate_size=0 is not modelled (num_local_experts 0 leaves the layers no FFN)"),
    (dict(mamba_d_head=12), "mamba_d_head=12 x mamba_n_heads=8 must be mamba_expand x hidden_size = 128"),
    (dict(num_local_experts=1), "a mixture of 1 expert is not modelled"),
    (dict(residual_multiplier=0), "residual_multiplier must be"),
])
def test_refused_fields(change, needle):
    with pytest.raises(SpecError, match=re.escape(needle)):
        read(dict(HYBRID, **change))


def test_the_dt_clamp_is_read():
    """transformers' mixer clamps dt to time_step_limit in its chunked scan: its lower end is honoured."""
    assert read(dict(HYBRID, time_step_limit=[0.01, float("inf")])).linear_dt_min == 0.01
    for junk in ([0.5, 0.1], 5, "x", [0.0, {"__float__": "abc"}]):
        with pytest.raises(SpecError, match="time_step_limit must be"):
            read(dict(HYBRID, time_step_limit=junk))


def test_estimate_reads_a_saved_config(tmp_path):
    """`llmperf estimate` on a config directory, end to end, for each type."""
    from typer.testing import CliRunner

    from llmperf.cli import app

    for model_type in TYPES:
        d = tmp_path / model_type
        d.mkdir()
        hf_model({"model_type": model_type}).config.save_pretrained(d)
        result = CliRunner().invoke(app, ["estimate", str(d), "-H", "h100-sxm", "-b", "4", "-p", "512", "-g", "16"])
        assert result.exit_code == 0, result.output


# ---- junk in Granite's own fields: a ModelSpec or one SpecError line, never another exception ---------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_KEYS = ("layer_types", "layers_block_type", "mamba_n_heads", "mamba_d_head", "mamba_d_state", "mamba_n_groups",
         "mamba_expand", "mamba_d_conv", "mamba_chunk_size", "mamba_conv_bias", "mamba_proj_bias", "time_step_limit",
         "num_local_experts", "num_experts_per_tok", "shared_intermediate_size", "position_embedding_type",
         *SCALARS)
_JUNK = st.one_of(st.none(), st.booleans(), st.integers(-2, 40), st.floats(allow_nan=True, allow_infinity=True),
                  st.text(alphabet="auto", max_size=4), st.lists(st.floats(allow_nan=True), max_size=3),
                  st.lists(st.sampled_from(["linear_attention", "full_attention", "mamba", "attention", "x"]),
                           max_size=5))


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([HYBRID, CASES["hybrid_dense"], MOE]), st.data())
def test_junk_gives_a_spec_or_one_spec_error(cfg, data):
    changed = dict(cfg)
    for key in data.draw(st.lists(st.sampled_from(_KEYS), min_size=1, max_size=3, unique=True)):
        changed[key] = data.draw(_JUNK)
    assert_read_or_one_error(read, changed)
