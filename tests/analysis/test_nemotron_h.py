"""Nemotron-H (`nemotron_h`) read from config.json: layers of one sublayer each behind their RMSNorm (a Mamba-2
mixer, attention without positions, a two-matrix relu2 MLP, or a mixture of such experts with one shared
expert and DeepSeek-V3's sigmoid routing), from `layers_block_type` or the legacy `hybrid_override_pattern`.

Checked against transformers 5.24: the parameters and persistent buffers its checkpoint holds, the Mamba-2
states and the K and V its cache keeps, the matrix FLOPs of a forward pass (`torch.utils.flop_counter`); the
serving cost model prices a static batch as `estimate` does. What transformers builds otherwise than its
config says (a tied head, several shared experts) is refused by name; the engine builds the rest.
"""

from __future__ import annotations

import re

import pytest
from model_checks import (
    assert_mamba2_states_and_kv,
    assert_read_or_one_error,
    assert_saved_config_reads_back,
    assert_static_batch_is_estimate,
    checkpoint_count,
    hf_matrix_flops_less_scan,
    hf_model,
    matrix_flops_less_scan,
)

from llmperf.errors import SpecError
from llmperf.specs.hf import model_spec_from_hf_config

BASE = dict(model_type="nemotron_h", vocab_size=128, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, intermediate_size=96, mamba_num_heads=8, mamba_head_dim=8, ssm_state_size=16, n_groups=2,
            chunk_size=4, conv_kernel=4, max_position_embeddings=64,
            layers_block_type=["linear_attention", "mlp", "linear_attention", "full_attention", "mlp"])
MOE = dict(BASE, layers_block_type=["linear_attention", "moe", "full_attention", "moe", "linear_attention", "mlp"],
           n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, moe_shared_expert_intermediate_size=32,
           n_group=2, topk_group=1, routed_scaling_factor=2.5)
CASES = {
    "dense": BASE,
    "moe": MOE,
    # the hub's older spelling: the pattern string and the mamba_-prefixed keys, which win over the new ones
    "legacy": dict({k: v for k, v in BASE.items() if k != "layers_block_type"}, hybrid_override_pattern="M-M*-",
                   num_hidden_layers=5, mamba_n_groups=4, mamba_d_conv=3, mamba_conv_bias=False, mamba_chunk_size=8,
                   use_bias=True),
    "biased_relu": dict(BASE, mlp_bias=True, use_conv_bias=False, mlp_hidden_act="relu"),
    "mtp": dict(MOE, num_nextn_predict_layers=1),
    # a latent MoE: the routed experts work at 24 wide, projected down from and back up to the hidden 64
    "latent": dict(MOE, moe_latent_size=24),
    "attention_only": dict(BASE, layers_block_type=["full_attention", "mlp"] * 2),
}


def read(cfg: dict):
    return model_spec_from_hf_config(dict(cfg), name="nemotron-h")


@pytest.mark.parametrize("case", list(CASES))
def test_parameters_are_transformers_checkpoint(case):
    assert read(CASES[case]).param_count == checkpoint_count(hf_model(CASES[case]))


def test_the_class_default():
    """NemotronHConfig's own shape: one layer of each block type (1,968,355,720 parameters)."""
    spec = read({"model_type": "nemotron_h"})
    assert spec.param_count == checkpoint_count(hf_model({"model_type": "nemotron_h"})) == 1_968_355_720


def test_structure():
    spec = read(MOE)
    assert [k.label for k in spec.layer_kinds()] == ["linear/no-ffn", "moe", "full/nope/no-ffn", "moe",
                                                      "linear/no-ffn", "ffn"]
    assert spec.layer_types == ("linear", "none", "full", "none", "linear", "none")
    assert spec.mixer_only_layers == (0, 2, 4) and spec.nope_layers == (2,) and spec.dense_layers == (0, 2, 4, 5)
    assert (spec.linear_mixer, spec.linear_num_key_heads, spec.linear_num_value_heads) == ("mamba2", 2, 8)
    assert (spec.linear_key_head_dim, spec.linear_value_head_dim, spec.linear_conv_kernel) == (16, 8, 4)
    assert (spec.linear_chunk_size, spec.linear_conv_bias, spec.linear_proj_bias, spec.state_dtype) == (
        4, True, False, "fp32")
    assert (spec.ffn_kind, spec.hidden_act, spec.shared_experts, spec.shared_ffn_size) == ("relu", "relu2", 1, 32)
    assert (spec.router_scoring, spec.router_score_bias, spec.router_groups, spec.router_scale) == (
        "sigmoid", True, 2, 2.5)
    legacy = read(CASES["legacy"])
    assert (legacy.num_layers, legacy.linear_num_key_heads, legacy.linear_conv_kernel) == (5, 4, 3)
    assert (legacy.linear_chunk_size, legacy.linear_conv_bias, legacy.linear_proj_bias) == (8, False, True)
    assert not read(BASE).is_moe and read(CASES["attention_only"]).linear_mixer == "gated_deltanet"


def test_state_and_kv_are_what_transformers_caches():
    """After a 7-token prompt: each Mamba-2 layer's recurrent state (heads x head dim x state size) and its
    convolution's inputs (transformers keeps all K of them; vLLM, and llmperf, the K - 1 the next step needs),
    the attention layers' K and V; the MLP and MoE layers keep nothing."""
    for cfg in (BASE, MOE):
        spec = read(cfg)
        assert_mamba2_states_and_kv(spec, cfg)
        kv = spec.kv_cache(1.0)
        kinds = spec.layer_types
        assert spec.linear_conv_state_elements == spec.linear_conv_dim * (spec.linear_conv_kernel - 1)
        assert kv.kv_layers == kinds.count("full")
        assert kv.linear_layers == kinds.count("linear")
        # the state at mamba_ssm_cache_dtype (fp32), the convolution's inputs at the checkpoint's fp16
        assert kv.state_bytes == kinds.count("linear") * (spec.linear_state_elements * 4
                                                          + spec.linear_conv_state_elements * 2)


def test_matrix_flops_are_transformers():
    """Every projection, the eager attention (its whole masked square: the dense convention), the router and
    the experts (a loop over those the tokens hit) as transformers runs them. The Mamba-2 scan's own products
    are priced by `ssd` (mamba_ssm's chunked kernels), not by transformers' reference loop: both are left out."""
    for cfg in (BASE, MOE, CASES["legacy"], CASES["latent"]):
        # the counter counts `addmm` as its product only and the router's score-correction add not at all
        spec = read(cfg).scaled(linear_proj_bias=False)
        spec = spec.scaled(router_score_bias=False) if spec.is_moe else spec
        assert hf_matrix_flops_less_scan(cfg, "mixer", eager_experts=True) == matrix_flops_less_scan(spec)


def test_ssd_counts():
    """A decode token: the recurrent step over each head's P x N state, read and written once (fp32 here);
    a prompt: ceil(q / C) blocks of the chunked form, each block's state written and read."""
    from llmperf.analysis import ForwardModel
    from llmperf.analysis.operators import MAMBA2_CHANNEL_FLOPS, MAMBA2_HEAD_FLOPS, MAMBA2_STEP_FLOPS
    from llmperf.specs import Precision

    spec = read(MOE)
    fm = ForwardModel(model=spec, precision=Precision())
    nh, p, n, g, c = 8, 8, 16, 2, 4
    step = fm.ssd(3, 1, 50)
    assert step.flops == 3 * (nh * MAMBA2_STEP_FLOPS * n * p + nh * MAMBA2_HEAD_FLOPS + nh * p * MAMBA2_CHANNEL_FLOPS)
    assert step.kv_read_bytes == step.kv_write_bytes == 3 * nh * p * n * 4
    prompt = fm.ssd(1, 10, 10)  # 3 blocks of 4, the last padded; no state before it
    blocks = 3
    assert prompt.flops == (blocks * (g * 2 * c * c * n + nh * (2 * c * c * p + 4 * c * n * p))
                            + 10 * (nh * MAMBA2_HEAD_FLOPS + nh * p * MAMBA2_CHANNEL_FLOPS))
    assert prompt.kv_read_bytes == 0 and prompt.act_write_bytes == 10 * nh * p * 2 + blocks * nh * n * p * 2


@pytest.mark.parametrize("case, tp, eff", [("moe", 1, "roofline"), ("moe", 1, "typical"), ("dense", 2, "typical"),
                                           ("legacy", 2, "roofline"), ("latent", 2, "typical")])
def test_a_static_batch_is_priced_as_estimate(case, tp, eff):
    assert_static_batch_is_estimate(read(CASES[case]), tp, eff)


@pytest.mark.parametrize("case", ["dense", "moe", "legacy", "biased_relu", "latent"])
def test_weights_per_gpu_sum_to_the_parameters(case):
    """At tp = pp = 1 and one precision the weight bytes are the parameters (a layer of one sublayer: its
    norm, its mixer or FFN); at tp 2 less, never more."""
    from llmperf.analysis.rollup import stage_weight_bytes
    from llmperf.specs import Precision

    spec = read(CASES[case])
    spec = spec.scaled(router_score_bias=False) if spec.is_moe else spec  # that bias is kept in fp32
    assert sum(stage_weight_bytes(spec, Precision())) == 2 * spec.param_count
    assert sum(stage_weight_bytes(spec, Precision(), tp=2)) < 2 * spec.param_count


def test_a_latent_moe_routes_its_latent_rows():
    """The routed experts, the all-to-alls of expert parallelism and the weighted sum work at the latent width;
    the projections down and up run once a token, around them."""
    from llmperf.analysis import ForwardModel
    from llmperf.specs import Precision

    latent = read(CASES["latent"])
    assert latent.expert_model_dim == 24 and latent.latent_proj_params == 2 * 64 * 24
    ops = {}
    for spec in (latent, latent.scaled(moe_latent_size=None)):
        fm = ForwardModel(model=spec, precision=Precision(), tp=2, ep=2, dp_attention=True)
        ops[spec.moe_latent_size] = {o.name: o for o in fm.forward_ops(8, 1, 100)}
    for name in ("moe_dispatch", "moe_combine"):
        assert ops[24][name].comm_bytes == ops[None][name].comm_bytes * 24 / 64
    assert ops[24]["moe_sum"].flops == ops[None]["moe_sum"].flops * 24 / 64
    # 2 MoE layers, each 4 tokens a GPU (its own, with data-parallel attention)
    assert ops[24]["moe_latent_down"].flops == ops[24]["moe_latent_up"].flops == 2 * (2 * 4 * 64 * 24)
    assert "moe_latent_down" not in ops[None]
    with pytest.raises(ValueError, match="moe_latent_size: the engine does not build a latent MoE"):
        from llmperf.engine.parts import check_buildable
        check_buildable(latent)


def test_tensor_parallelism_splits_the_mamba_heads_and_groups():
    from llmperf.analysis.operators import ShardDims

    spec = read(MOE)
    dims = ShardDims.of(spec, 2)
    assert (dims.linear_key_heads, dims.linear_value_heads) == (1, 4)
    assert spec.kv_cache("bf16").sharded(tp=2).state_bytes == spec.kv_cache("bf16").state_bytes / 2
    with pytest.raises(SpecError, match="tp: 4 does not divide nemotron-h's linear_num_key_heads=2"):
        ShardDims.of(spec, 4)


@pytest.mark.parametrize("case", ["moe", "legacy", "latent"])
def test_saved_by_transformers_reads_back(case, tmp_path):
    """transformers writes `layers_block_type` (the legacy keys folded in): read back, the same model; every key
    read is one llmperf lists, and every key of the tiny configs is read."""
    assert_saved_config_reads_back(read, CASES[case], tmp_path, every_key_read=True)


@pytest.mark.parametrize("change, needle", [
    (dict(tie_word_embeddings=True), "tie_word_embeddings=True is not modelled (transformers' NemotronHForCausalLM "
                                     "keeps an lm_head of its own)"),
    (dict(n_shared_experts=2), "n_shared_experts=2 is not modelled (transformers builds one shared expert"),
    (dict(residual_in_fp32=True), "residual_in_fp32=True is not modelled"),
    (dict(sliding_window=16), "sliding_window=16 is not modelled (transformers' Nemotron-H attends to every token)"),
    (dict(mamba_hidden_act="gelu"), "mamba_hidden_act='gelu' is not modelled"),
    (dict(mamba_ssm_cache_dtype="int8"), "mamba_ssm_cache_dtype='int8' is not modelled"),
    (dict(mlp_hidden_act="silu"), "mlp_hidden_act='silu' is not modelled"),
    (dict(mlp_bias=True), "mlp_bias=True is not modelled (Nemotron-H's routed experts have no bias"),
    (dict(layers_block_type=["mamba", "mlp"]), "layers_block_type holds 'mamba'"),
    (dict(layers_block_type=None, hybrid_override_pattern="M-X"), "hybrid_override_pattern must be a non-empty "
                                                                  "string of M, *, -, E, got 'M-X'"),
])
def test_refused_fields(change, needle):
    with pytest.raises(SpecError, match=re.escape(needle)):
        read(dict(MOE, **change))


def test_the_engine_builds_nemotron_h_and_shards_none():
    """The engine builds every case (tests/engine/test_nemotron_h_engine.py runs them against transformers);
    tensor parallelism refuses its Mamba-2 layers and its layers of one sublayer by name."""
    from llmperf.engine.parts import check_buildable
    from llmperf.engine.tensor_parallel import shard_spec

    for case in ("dense", "moe", "legacy", "biased_relu", "attention_only"):
        check_buildable(read(CASES[case]))
    with pytest.raises(SpecError, match=r"layer_types: nemotron-h has linear \(Mamba-2\) layers; tensor parallelism"):
        shard_spec(read(BASE), 2)
    with pytest.raises(SpecError, match="mixer_only_layers: nemotron-h has layers of one sublayer"):
        shard_spec(read(CASES["attention_only"]), 2)


def test_the_dt_clamp_is_read():
    """transformers' mixer clamps dt below at time_step_min (legacy mamba_dt_min) in its chunked scan."""
    assert read(BASE).linear_dt_min == 1e-3  # NemotronHConfig's default
    assert read(dict(BASE, time_step_min=0.01)).linear_dt_min == 0.01
    assert read(dict(BASE, time_step_min=0.01, mamba_dt_min=0.0)).linear_dt_min == 0.0
    with pytest.raises(SpecError, match="time_step_min must be a finite number >= 0, got -1"):
        read(dict(BASE, time_step_min=-1))
    with pytest.raises(SpecError, match="linear_dt_min=0.5 needs linear_mixer=mamba2"):
        read(CASES["attention_only"]).scaled(linear_dt_min=0.5)


def test_its_mtp_module_is_refused_as_a_draft():
    from llmperf.analysis.speculative import mtp_spec

    with pytest.raises(SpecError, match=r"draft: mtp: nemotron-h's layers are one sublayer each \(Nemotron-H\); its"):
        mtp_spec(read(CASES["mtp"]))


def test_a_layer_of_neither_sublayer_is_refused():
    spec = read(BASE)
    with pytest.raises(SpecError, match="mixer_only_layers holds layer 1, whose layer_types entry is none"):
        spec.scaled(mixer_only_layers=(0, 1))
    with pytest.raises(SpecError, match="sandwich_norms=True is not modelled with layers of one sublayer"):
        spec.scaled(sandwich_norms=True)
    with pytest.raises(SpecError, match="linear_conv_bias=True needs linear_mixer=mamba2"):
        spec.scaled(linear_mixer="gated_deltanet")


# ---- junk in Nemotron-H's own fields: a ModelSpec or one SpecError line, never another exception -----------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_KEYS = ("layers_block_type", "hybrid_override_pattern", "mamba_num_heads", "mamba_head_dim", "ssm_state_size",
         "n_groups", "mamba_n_groups", "conv_kernel", "chunk_size", "use_conv_bias", "use_bias", "n_routed_experts",
         "num_experts_per_tok", "n_shared_experts", "moe_intermediate_size", "moe_shared_expert_intermediate_size",
         "n_group", "topk_group", "mamba_ssm_cache_dtype", "mlp_hidden_act", "num_nextn_predict_layers")
_JUNK = st.one_of(st.none(), st.booleans(), st.integers(-2, 40), st.floats(allow_nan=True, allow_infinity=True),
                  st.text(alphabet="M*-EX", max_size=6),
                  st.lists(st.sampled_from(["linear_attention", "full_attention", "mlp", "moe", "x"]), max_size=6))


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([BASE, MOE]), st.data())
def test_junk_gives_a_spec_or_one_spec_error(cfg, data):
    changed = dict(cfg)
    for key in data.draw(st.lists(st.sampled_from(_KEYS), min_size=1, max_size=3, unique=True)):
        changed[key] = data.draw(_JUNK)
    assert_read_or_one_error(read, changed)
