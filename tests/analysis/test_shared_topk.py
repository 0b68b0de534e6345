"""GLM-5 (`glm_moe_dsa`): DeepSeek Sparse Attention whose "shared" layers reuse the previous full layer's
top-k. Read as transformers decides the pattern (`indexer_types`, `index_topk_pattern`, the freq / offset
schedule); parameters exact against transformers (tiny and the config class's default shape); a shared
layer has no indexer, caches no indexer key (against transformers' cache), runs no indexer operator and
holds no indexer weights; the cache's pipeline stages split the keys where they are; the serving cost
model prices a static batch as `estimate`; bad patterns are refused in one line."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from model_checks import assert_static_batch_is_estimate, checkpoint_count, hf_model

from llmperf.analysis import ForwardModel
from llmperf.analysis.rollup import stage_weight_bytes
from llmperf.errors import SpecError
from llmperf.specs import Precision
from llmperf.specs.hf import model_spec_from_hf_config

CFG = dict(model_type="glm_moe_dsa", vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
           num_hidden_layers=6, num_attention_heads=4, n_routed_experts=8, num_experts_per_tok=2, n_group=2,
           topk_group=1, kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
           index_topk=16, index_head_dim=32, index_n_heads=4, first_k_dense_replace=1, max_position_embeddings=4096,
           index_topk_pattern="FSSFSF", torch_dtype="bfloat16")
SPEC = model_spec_from_hf_config(CFG, name="tiny-glm5")
BF16 = Precision.uniform("bf16")


@pytest.mark.parametrize("schedule, shared", [
    (dict(index_topk_pattern="FSSFSF"), (1, 2, 4)),
    (dict(index_topk_pattern=None, indexer_types=["full", "full", "shared", "full", "shared", "shared"]), (2, 4, 5)),
    (dict(index_topk_pattern=None, index_topk_freq=3, index_skip_topk_offset=1), (1, 2, 4, 5)),
    (dict(index_topk_pattern=None), ()),  # the default schedule: every layer runs its indexer
])
def test_the_pattern_and_param_count_are_transformers(schedule, shared):
    cfg = {**CFG, **schedule}
    model = hf_model(cfg)
    spec = model_spec_from_hf_config(cfg, name="t")
    assert spec.shared_topk_layers == shared
    assert [t == "shared" for t in model.config.indexer_types] == [i in shared for i in range(6)]
    assert spec.param_count == checkpoint_count(model)
    assert [k.shared_topk for k in spec.layer_kinds()] == [i in shared for i in range(6)]
    assert spec.layer_kinds()[1].label == ("full/moe/shared-topk" if 1 in shared else "full/moe")


def test_the_default_shape_is_exact():
    transformers = pytest.importorskip("transformers")
    full = transformers.AutoConfig.for_model("glm_moe_dsa").to_dict()
    spec = model_spec_from_hf_config(full, name="t")
    assert spec.param_count == checkpoint_count(hf_model({"model_type": "glm_moe_dsa"})) == 743_911_218_432
    assert spec.index_n_heads == 32 and spec.v_head_dim == 256 and spec.num_layers == 78
    assert spec.shared_topk_layers == ()


def test_shared_layers_cache_no_indexer_key():
    torch = pytest.importorskip("torch")
    model = hf_model(CFG, device="cpu").eval()
    with torch.no_grad():
        cache = model(torch.randint(0, 256, (1, 7)), use_cache=True).past_key_values
    held = [getattr(layer, "indexer_keys", None) is not None for layer in cache.layers]
    assert held == [i not in SPEC.shared_topk_layers for i in range(6)]
    kv = SPEC.kv_cache("bf16")
    latent = (32 + 8) * 2
    assert kv.bytes_per_token == 6 * latent + 3 * (32 + 4)  # three layers hold a key of 32 fp8 + a scale
    assert kv.sharded(tp=2).bytes_per_token == kv.bytes_per_token  # an MLA latent and the keys: never split
    stages = [kv.stage(i, 2) for i in range(2)]  # layers 0-2 (one key), 3-5 (two keys)
    assert [s.bytes_per_token for s in stages] == [3 * latent + 36, 3 * latent + 2 * 36]
    assert kv.sharded(pp=2).bytes_per_token == stages[1].bytes_per_token  # the larger stage


def test_a_shared_layer_runs_no_indexer_and_holds_none():
    def totals(model):  # noqa: ANN001, ANN202  (each operator summed over its sections)
        out: dict = {}
        for o in ForwardModel(model=model, precision=BF16).forward_ops(2, 1, 1000):
            out[o.name] = o if o.name not in out else replace(out[o.name], flops=out[o.name].flops + o.flops,
                                                                 weight_bytes=out[o.name].weight_bytes + o.weight_bytes)
        return out

    ops = totals(SPEC)
    assert ops["index_score"].flops == 3 * 2 * 1000 * 4 * (2 * 32 + 3)  # layers 0, 3, 5
    assert ops["index_q_proj"].weight_bytes == 3 * 2 * 48 * 4 * 32
    every = SPEC.scaled(shared_topk_layers=())
    ops_every = totals(every)
    assert ops["attention"].flops == ops_every["attention"].flops  # the main attention still reads top-k
    assert every.param_count - SPEC.param_count == 3 * SPEC.indexer_params_per_layer
    assert sum(stage_weight_bytes(SPEC, BF16)) == 2 * SPEC.param_count + 5 * 8 * 2  # fp32 score biases: 2 B more
    for tp in (1, 4):
        diff = stage_weight_bytes(every, BF16, tp)[0] - stage_weight_bytes(SPEC, BF16, tp)[0]
        assert diff == 3 * 2 * SPEC.indexer_params_per_layer  # replicated: the same on every rank


@pytest.mark.parametrize("tp, eff", [(1, "roofline"), (2, "typical")])
def test_a_static_batch_is_priced_as_estimate(tp, eff):
    assert_static_batch_is_estimate(SPEC, tp, eff)


@pytest.mark.parametrize("cfg, needle", [
    ({**CFG, "index_topk_pattern": "SFFFFF"}, "indexer_types='shared' is not modelled (layer 0 has no earlier"),
    ({**CFG, "index_topk_pattern": "FXSFSF"}, "index_topk_pattern='FXSFSF' is not modelled"),
    ({**CFG, "index_topk_pattern": None, "indexer_types": ["full"] * 5},
     "indexer_types must list num_hidden_layers=6 of full / shared"),
    ({**CFG, "index_topk_pattern": None, "index_topk_freq": -1}, "index_topk_freq must be an integer >= 0"),
])
def test_refused_in_one_line(cfg, needle):
    with pytest.raises(SpecError, match=re.escape(needle)) as info:
        model_spec_from_hf_config(cfg, name="t")
    assert "\n" not in str(info.value)


def test_model_spec_checks_the_shared_layers():
    with pytest.raises(SpecError, match="shared_topk_layers holds layer 0"):
        SPEC.scaled(shared_topk_layers=(0, 2))
    with pytest.raises(SpecError, match=re.escape("shared_topk_layers=[2] needs index_topk")):
        SPEC.scaled(shared_topk_layers=(2,), index_topk=None, index_n_heads=None, index_head_dim=None)
    with pytest.raises(SpecError, match="shared_topk_layers holds layer 9"):
        SPEC.scaled(shared_topk_layers=(9,))
    assert SPEC.scaled(num_layers=3).shared_topk_layers == (1, 2)  # fewer layers keep theirs
