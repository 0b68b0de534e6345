"""Gemma 4 (`gemma4_text`, and the text model of a `gemma4` checkpoint) read from config.json.

Its full layers have their own head dim (`global_head_dim`) and, with `attention_k_eq_v`, their own KV heads
(`num_global_key_value_heads`) and no v_proj (V is the key projection, normed apart: the cache keeps K and V);
with `enable_moe_block` every layer runs its dense FFN beside the experts (the shared expert), each branch
normed apart; per-layer embeddings (E2B / E4B), the last layers reading an earlier layer's cache and their
double-wide FFN. Checked against transformers 5.24: the parameters and persistent buffers its checkpoint holds,
the K and V its cache keeps, the matrix FLOPs its forward runs (`torch.utils.flop_counter`); the serving cost
model prices a static batch as `estimate` does. Bidirectional attention is refused by name, and the engine
refuses Gemma 4's layers.
"""

from __future__ import annotations

import pytest
from model_checks import (
    assert_read_or_one_error,
    assert_saved_config_reads_back,
    assert_static_batch_is_estimate,
    checkpoint_count,
    hf_model,
)

from llmperf.errors import SpecError
from llmperf.specs.hf import model_spec_from_hf_config

BASE = dict(model_type="gemma4_text", vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32, sliding_window=8,
            hidden_size_per_layer_input=0, max_position_embeddings=64)
K_EQ_V = dict(BASE, attention_k_eq_v=True, num_global_key_value_heads=1)
MOE = dict(K_EQ_V, enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=24,
           final_logit_softcapping=30.0)
CASES = {
    "dense": BASE,
    "k_eq_v": K_EQ_V,
    "k_eq_v_same_heads": dict(BASE, attention_k_eq_v=True),  # no num_global_key_value_heads: the model's
    "moe": MOE,
    # the last layer forced full, as transformers does
    "layer_types": dict(BASE, layer_types=["sliding_attention", "full_attention"] * 2 + ["sliding_attention"] * 2),
    "untied_biased": dict(K_EQ_V, tie_word_embeddings=False, attention_bias=True),
    # Gemma 4 E2B / E4B's structure: per-layer embeddings (a table of 96 rows), the last 3 layers reading the
    # cache of the last earlier layer of their kind (layers 3-5 read layer 2's, 1's and 1's), their dense FFN
    # twice as wide
    "ple_kv_shared": dict(BASE, hidden_size_per_layer_input=8, vocab_size_per_layer_input=96,
                          layer_types=["sliding_attention", "full_attention", "sliding_attention",
                                       "sliding_attention", "full_attention", "full_attention"],
                          num_kv_shared_layers=3, use_double_wide_mlp=True),
    "ple_kv_shared_k_eq_v": dict(K_EQ_V, hidden_size_per_layer_input=8, vocab_size_per_layer_input=128,
                                 num_kv_shared_layers=2,
                                 layer_types=["sliding_attention", "full_attention"] + ["sliding_attention"] * 3
                                 + ["full_attention"]),
}


def read(cfg: dict):
    return model_spec_from_hf_config(dict(cfg), name="gemma4")


@pytest.mark.parametrize("case", list(CASES))
def test_parameters_are_transformers_checkpoint(case):
    spec = read(CASES[case])
    assert spec.param_count == checkpoint_count(hf_model(CASES[case]))


def test_structure():
    spec = read(MOE)
    assert spec.layer_types == ("sliding",) * 5 + ("full",)
    assert (spec.global_head_dim, spec.global_kv_heads, spec.global_k_eq_v) == (32, 1, True)
    assert (spec.num_experts, spec.experts_per_token, spec.moe_ffn_size) == (4, 2, 24)
    assert (spec.shared_experts, spec.shared_ffn_size, spec.moe_parallel_ffn) == (1, 96, True)
    assert spec.v_norm and spec.layer_scalar and spec.sandwich_norms and not spec.norm_offset
    assert spec.final_softcap == 30.0 and spec.tied_embeddings
    assert read(CASES["layer_types"]).layer_types == ("sliding", "full") * 3
    full, sliding = (next(k for k in spec.layer_kinds() if k.attention == a) for a in ("full", "sliding"))
    assert spec.attention_dims(full) == (32, 1) and spec.attention_dims(sliding) == (16, 2)


def test_the_multimodal_checkpoint_reads_its_text_model():
    wrapped = read(dict(model_type="gemma4", text_config={k: v for k, v in MOE.items() if k != "model_type"}))
    assert wrapped.param_count == read(MOE).param_count


def test_bidirectional_attention_is_refused_by_name():
    with pytest.raises(SpecError, match=r"use_bidirectional_attention='all' is not modelled \(an encoder"):
        read({**BASE, "use_bidirectional_attention": "all"})


def test_a_kv_shared_layer_needs_an_earlier_cache_of_its_kind():
    """transformers refuses it too (its `kv_sharing_modes`): the last layer is the only full one."""
    with pytest.raises(SpecError, match="kv_shared_layers holds layer 5, with no earlier full layer"):
        read(dict(BASE, num_kv_shared_layers=2))
    with pytest.raises(SpecError, match="num_kv_shared_layers=6 is not modelled"):
        read(dict(BASE, num_kv_shared_layers=6))


def test_the_class_default():
    """Gemma4TextConfig's own shape: per-layer embeddings of 256, 5 sliding layers of 512 to 1 full, the full
    layers' head dim 512 with the model's 4 KV heads (no K = V)."""
    spec = read({"model_type": "gemma4_text"})
    assert spec.param_count == checkpoint_count(hf_model({"model_type": "gemma4_text"}))
    assert (spec.ple_dim, spec.ple_vocab, spec.global_head_dim, spec.sliding_window) == (256, 262_144, 512, 512)


def test_the_engine_refuses_gemma4_layers():
    from llmperf.engine.parts import check_buildable

    with pytest.raises(ValueError, match="global_head_dim: the engine does not build Gemma 4's layers"):
        check_buildable(read(K_EQ_V))


@pytest.mark.parametrize("case", ["dense", "k_eq_v", "moe", "ple_kv_shared", "ple_kv_shared_k_eq_v"])
def test_kv_cache_is_what_transformers_caches(case):
    """Every layer's K and V after a prompt shorter than the window (full layers: their own heads and head
    dim; K = V layers cache V apart; KV-shared layers none), in elements."""
    torch = pytest.importorskip("torch")
    cfg = CASES[case]
    model = hf_model(cfg, device="cpu").eval()
    with torch.no_grad():
        cache = model(torch.randint(0, 96, (1, 7)), use_cache=True).past_key_values  # ids within the PLE table
    held = [layer.keys is not None for layer in cache.layers]  # a KV-shared layer caches nothing
    numel = sum(layer.keys.numel() + layer.values.numel() for layer in cache.layers if layer.keys is not None)
    spec = read(cfg)
    kv = spec.kv_cache(1.0)
    assert held == [i not in spec.kv_shared_layers for i in range(spec.num_layers)]
    assert kv.bytes_for_context(7) == numel and kv.kv_layers == sum(held)


def test_kv_cache_groups_and_sharding():
    kv = read(K_EQ_V).kv_cache("bf16")
    assert [(g.attention, g.num_layers, g.bytes_per_token_per_layer) for g in kv.groups] == [
        ("sliding", 5, 2 * 2 * 16 * 2), ("full", 1, 2 * 1 * 32 * 2)]
    assert kv.bytes_for_context(100) == 5 * 8 * 128 + 100 * 128
    half = kv.sharded(tp=2)  # the sliding layers' 2 KV heads split; the full layers' one replicated
    assert [g.bytes_per_token_per_layer for g in half.groups] == [64, 128]
    # paged apart: a sliding block of 5 layers x 64 elements takes ceil(320 / 64) = 5 full-layer blocks
    assert kv.paged_blocks(100, 16) == (5 * kv.groups[0].blocks_held(100, 16), 7)


def test_matrix_flops_are_transformers():
    """Eager attention computes the whole masked square (the dense convention); the MoE experts as a loop over
    the experts the tokens hit. The router's input norm is not a matrix product: it is priced apart."""
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    from llmperf.analysis import ForwardModel
    from llmperf.specs import Precision

    for cfg in (K_EQ_V, MOE, CASES["ple_kv_shared"]):
        model = hf_model(cfg, device="cpu").eval()
        model.config._attn_implementation = "eager"
        model.config._experts_implementation = "eager"
        ids = torch.randint(0, 96, (2, 21))  # within the per-layer embeddings' 96 rows
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(ids)
        spec = read(cfg).scaled(moe_parallel_ffn=False) if cfg is MOE else read(cfg)
        fm = ForwardModel(model=spec, precision=Precision(), attention="naive", all_logits=True,
                          attention_flops="dense")
        ours = sum(o.flops for o in fm.forward_ops(2, 21, 21) if o.kind in ("matmul", "attention"))
        assert counter.get_total_flops() == ours


@pytest.mark.parametrize("case, tp, eff", [("moe", 1, "roofline"), ("moe", 1, "typical"), ("moe", 2, "typical"),
                                           ("ple_kv_shared", 1, "typical"), ("ple_kv_shared", 2, "roofline")])
def test_a_static_batch_is_priced_as_estimate(case, tp, eff):
    assert_static_batch_is_estimate(read(CASES[case]), tp, eff)


@pytest.mark.parametrize("case", ["k_eq_v", "moe", "untied_biased", "ple_kv_shared"])
def test_weights_per_gpu_sum_to_the_parameters(case):
    """At tp = pp = 1 and one precision the weight bytes are the parameters (full layers' own shapes, K = V
    without a v_proj, the MoE block's norms and scales, the layer scalars); at tp 2 less, never more."""
    from llmperf.analysis.rollup import stage_weight_bytes
    from llmperf.specs import Precision

    spec = read(CASES[case])
    assert sum(stage_weight_bytes(spec, Precision())) == 2 * spec.param_count
    assert sum(stage_weight_bytes(spec, Precision(), tp=2)) < 2 * spec.param_count


@pytest.mark.parametrize("case", ["moe", "ple_kv_shared"])
def test_saved_by_transformers_reads_back(case, tmp_path):
    """transformers writes the config its own way (rope_parameters per layer type, explicit layer_types, the
    per-layer config): read back, the same model; every key read is one llmperf lists."""
    assert_saved_config_reads_back(read, CASES[case], tmp_path)


def test_per_layer_config_as_transformers_saves_it():
    """The full layers' shape from `per_layer_config` (layer -> head_dim, num_key_value_heads) equals the hub's
    `global_head_dim` / `num_global_key_value_heads`; a sliding layer of its own shape, or full layers of
    different shapes, are refused naming the key."""
    types = ["sliding_attention", "full_attention"] * 3
    saved = dict(BASE, layer_types=types, attention_k_eq_v=True,
                 per_layer_config={"1": {"head_dim": 32, "num_key_value_heads": 1},
                                   "3": {"head_dim": 32, "num_key_value_heads": 1},
                                   "5": {"head_dim": 32, "num_key_value_heads": 1}})
    assert read(saved) == read(dict(BASE, layer_types=types, attention_k_eq_v=True, num_global_key_value_heads=1))
    with pytest.raises(SpecError, match=r"per_layer_config\['0'\]=.* is not modelled \(a shape of its own in a "
                                        "sliding layer"):
        read(dict(saved, per_layer_config={"0": {"head_dim": 32}}))
    with pytest.raises(SpecError, match="per_layer_config=.* is not modelled \\(full layers of different shapes"):
        read(dict(saved, per_layer_config={"1": {"head_dim": 32}, "3": {"head_dim": 64}, "5": {"head_dim": 32}}))


# ---- junk in Gemma 4's own fields: a ModelSpec or one SpecError line, never another exception ---------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_KEYS = ("global_head_dim", "num_global_key_value_heads", "attention_k_eq_v", "enable_moe_block", "num_experts",
         "top_k_experts", "moe_intermediate_size", "hidden_size_per_layer_input", "vocab_size_per_layer_input",
         "num_kv_shared_layers", "use_double_wide_mlp", "use_bidirectional_attention", "final_logit_softcapping",
         "sliding_window", "layer_types", "per_layer_config", "rope_parameters", "head_dim")
_JUNK = st.one_of(st.none(), st.booleans(), st.integers(-2, 40), st.floats(allow_nan=True, allow_infinity=True),
                  st.text(max_size=4), st.lists(st.sampled_from(["full_attention", "sliding_attention", "x"]),
                                                max_size=7),
                  st.dictionaries(st.sampled_from(["1", "5", "x", "full_attention", "sliding_attention"]),
                                  st.one_of(st.integers(-1, 64), st.none(),
                                            st.dictionaries(st.sampled_from(["head_dim", "num_key_value_heads",
                                                                             "rope_type", "rope_theta"]),
                                                            st.one_of(st.integers(-1, 64), st.text(max_size=3)),
                                                            max_size=2)), max_size=3))


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([MOE, CASES["ple_kv_shared"]]), st.data())
def test_junk_gives_a_spec_or_one_spec_error(cfg, data):
    changed = dict(cfg)
    for key in data.draw(st.lists(st.sampled_from(_KEYS), min_size=1, max_size=3, unique=True)):
        changed[key] = data.draw(_JUNK)
    assert_read_or_one_error(read, changed)
