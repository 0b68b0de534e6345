"""DeepSeek Sparse Attention (DeepSeek-V3.2): the config read with its lightning indexer (parameters exactly
transformers', tiny and at the released shape), the indexer's key in the KV cache (its width against
transformers' cache; fp8 and a scale a token, as vLLM keeps it), the main attention reading each query's
top-k keys while the indexer scores every key, the replicated indexer's weights, decode totals that
equal the sum of their steps, and the serving cost model pricing a static batch as `estimate` does."""

from __future__ import annotations

import re

import pytest
from model_checks import assert_static_batch_is_estimate, checkpoint_count, hf_model

import llmperf
from llmperf.analysis import ForwardModel
from llmperf.analysis.operators import attended_pairs
from llmperf.analysis.rollup import stage_weight_bytes
from llmperf.analysis.timemodel import time_model_for
from llmperf.errors import SpecError
from llmperf.specs import Precision, load_hardware
from llmperf.specs.hf import model_spec_from_hf_config

CFG = dict(model_type="deepseek_v32", vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
           num_hidden_layers=3, num_attention_heads=4, n_routed_experts=8, num_experts_per_tok=2, n_group=2,
           topk_group=1, kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
           index_topk=16, index_head_dim=32, index_n_heads=4, first_k_dense_replace=1, max_position_embeddings=4096,
           torch_dtype="bfloat16")
SPEC = model_spec_from_hf_config(CFG, name="tiny-dsa")
BF16 = Precision.uniform("bf16")


def test_param_count_is_exact_tiny_and_released():
    transformers = pytest.importorskip("transformers")
    assert SPEC.param_count == checkpoint_count(hf_model(CFG))
    full = transformers.AutoConfig.for_model("deepseek_v32").to_dict()
    spec = model_spec_from_hf_config(full, name="t")
    assert spec.param_count == checkpoint_count(hf_model(full)) == 671_877_944_064  # 671.03B + 61 indexers
    assert spec.indexer_params_per_layer == 1536 * 64 * 128 + 7168 * 128 + 2 * 128 + 7168 * 64


def test_indexer_key_is_cached_beside_the_latent():
    torch = pytest.importorskip("torch")
    model = hf_model(CFG, device="cpu").eval()
    with torch.no_grad():
        cache = model(torch.randint(0, 256, (1, 7)), use_cache=True).past_key_values
    layer = cache.layers[0]
    assert layer.indexer_keys.shape[-1] == SPEC.index_head_dim  # one key a token for all the indexer's heads
    kv = SPEC.kv_cache("bf16")
    assert kv.index_bytes_per_token == 32 + 4  # fp8 and one fp32 scale per 128 elements
    assert kv.bytes_per_token_per_layer == (32 + 8) * 2 + 36
    assert kv.sharded(tp=4).bytes_per_token_per_layer == kv.bytes_per_token_per_layer  # not split
    released = model_spec_from_hf_config(pytest.importorskip("transformers").AutoConfig.for_model(
        "deepseek_v32").to_dict(), name="t")
    assert released.kv_cache("bf16").bytes_per_token == 61 * (576 * 2 + 132)


def test_main_attention_reads_top_k_keys_the_indexer_every_key():
    fm = ForwardModel(model=SPEC, precision=BF16)
    ops = {o.name: o for o in fm.forward_ops(2, 1, 1000)}
    assert [n for n in ops if n.startswith("index_")] == ["index_q_proj", "index_k_proj", "index_k_norm",
                                                           "index_write", "index_score", "index_topk"]
    dense = ForwardModel(model=SPEC.scaled(index_topk=None, index_n_heads=None, index_head_dim=None), precision=BF16)
    att, att_dense = ops["attention"], {o.name: o for o in dense.forward_ops(2, 1, 1000)}["attention"]
    assert att.kv_read_bytes == pytest.approx(att_dense.kv_read_bytes * 16 / 1000)  # 16 of 1,000 keys
    n_layers = SPEC.num_layers
    assert ops["index_score"].flops == n_layers * 2 * 1000 * 4 * (2 * 32 + 3)
    assert ops["index_score"].kv_read_bytes == n_layers * 2 * 1000 * 36
    assert ops["index_score"].compute_dtype == "fp8"
    prefill = {o.name: o for o in fm.forward_ops(1, 300, 300)}
    assert prefill["index_score"].flops == n_layers * attended_pairs(300, 300, causal=True) * 4 * (2 * 32 + 3)


def test_the_indexer_is_replicated_on_every_rank():
    one, four = (stage_weight_bytes(SPEC, BF16, tp)[0] for tp in (1, 4))
    indexer = 2 * SPEC.indexer_params_per_layer * SPEC.num_layers
    assert sum(stage_weight_bytes(SPEC, BF16, 1, 1)) == 2 * SPEC.param_count + 2 * 8 * 2  # + fp32 score bias
    assert four > (one - indexer) / 4 + indexer - 1  # the indexer whole on each of the 4
    fm = ForwardModel(model=SPEC, precision=BF16, tp=4)
    assert fm.index_q_proj(1, 1, 1).flops == 2 * 48 * 4 * 32


@pytest.mark.parametrize("eff", ["roofline", "typical"])
def test_decode_totals_are_the_sum_of_their_steps(eff):
    """The closed-form decode sum prices the main attention flat past top-k and the indexer growing."""
    hw = load_hardware("h200")
    tm = None if eff == "roofline" else time_model_for(hw, eff, "bf16")
    est = llmperf.estimate(SPEC, hw, batch=3, prompt_len=10, gen_len=40, time_model=tm)
    assert est.e2e_s == pytest.approx(est.ttft_s + est.decode_step_times_s().sum(), rel=1e-9)


@pytest.mark.parametrize("tp, eff", [(1, "roofline"), (2, "typical")])
def test_a_static_batch_is_priced_as_estimate(tp, eff):
    assert_static_batch_is_estimate(SPEC, tp, eff)


@pytest.mark.parametrize("cfg, needle", [
    ({**CFG, "index_topk": 0}, "index_topk must be a positive integer"),
    ({**CFG, "layer_types": ["indexed_attention", "full_attention", "indexed_attention"]},
     "layer_types='full_attention' is not modelled (every DeepSeek Sparse Attention layer is indexed_attention)"),
    ({**CFG, "mlp_layer_types": ["dense", "moe", "sparse"]}, "mlp_layer_types must list num_hidden_layers=3"),
    ({**CFG, "model_type": "deepseek_v3"}, "index_topk=16 is not modelled (DeepSeek Sparse Attention is read for "
                                           "deepseek_v32 and glm_moe_dsa only)"),
])
def test_refused_in_one_line(cfg, needle):
    with pytest.raises(SpecError, match=re.escape(needle)) as info:
        model_spec_from_hf_config(cfg, name="t")
    assert "\n" not in str(info.value)


def test_model_spec_checks_the_indexer_fields():
    with pytest.raises(SpecError, match="index_n_heads=4 needs index_topk"):
        SPEC.scaled(index_topk=None)
    with pytest.raises(SpecError, match="needs multi-head latent attention with q_lora_rank"):
        SPEC.scaled(q_lora_rank=None)
    mlp = model_spec_from_hf_config({**CFG, "mlp_layer_types": ["dense", "sparse", "dense"]}, name="t")
    assert mlp.dense_layers == (0, 2)


def test_the_engine_refuses_it_by_name():
    pytest.importorskip("torch")
    from llmperf.engine.parts import check_buildable

    with pytest.raises(ValueError, match="index_topk: the engine does not run DeepSeek Sparse Attention"):
        check_buildable(SPEC)
