"""Nemotron-H (`nemotron_h`) in the engine against `transformers` in fp32, from tiny checkpoints transformers saves
(`backbone.` names, experts one by one) and the engine loads as a user's (`from_pretrained`).

Two hybrids of layers of one sublayer: a dense one (Mamba-2 without a conv bias, an MLP with biases, attention
without positions) and an MoE one (conv and projection biases, non-gated relu2 experts and the one shared expert,
sigmoid routing over 2 groups with the score correction moved off zero, routed_scaling_factor 2.5). Two heads of
every Mamba-2 layer get a dt_bias so low that transformers' clamp of dt at time_step_min decides their prefill
(`test_the_prefill_clamp_matters`). The Mamba chunk is 4 tokens: prompts span several chunks, and chunked prefill
(5 tokens a step) cuts them elsewhere.

Checked: logits of a prompt and of decode steps through both caches within 1e-5; generate() tokens identical
(greedy, processors, beams) on the paged, contiguous and chunked-prefill engines; the two forms of the scan
against each other in fp64; the state's bytes against `KVCacheSpec.state_bytes`; the operators' names; the
weights saved back under transformers' names; a preempted sequence recomputed; the features that refuse Mamba-2
layers by name.
"""

from __future__ import annotations

import pytest
import torch

from llmperf.engine import Engine, from_pretrained
from llmperf.engine.cache import ContiguousKVCache
from llmperf.engine.mamba2 import chunk_scan, recurrent_scan

from checkpoints import CASES, PROMPTS, assert_mamba2_refused_without_state_rollback, hybrid_checks
from engine_testing import OpNames, hf_generate

transformers = pytest.importorskip("transformers")

TOL = 1e-5  # fp32 (rtol and atol); measured at most 3.8e-6 on logits up to 6.1 (MoE), 7e-7 (dense)
_BASE = dict(model_type="nemotron_h", vocab_size=128, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, intermediate_size=96, mamba_num_heads=8, mamba_head_dim=8, ssm_state_size=16, n_groups=2,
             chunk_size=4, conv_kernel=4, max_position_embeddings=64, bos_token_id=None, eos_token_id=None,
             pad_token_id=None)
CONFIGS = {
    "dense": dict(_BASE, layers_block_type=["linear_attention", "mlp", "linear_attention", "full_attention", "mlp"],
                  use_conv_bias=False, mlp_bias=True),
    "moe": dict(_BASE, layers_block_type=["linear_attention", "moe", "full_attention", "moe", "linear_attention"],
                use_bias=True, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                moe_shared_expert_intermediate_size=32, n_group=2, topk_group=1, routed_scaling_factor=2.5),
}
NOISE = {"dense": 0.05, "moe": 0.2}  # as tests/engine/test_moe_families.py: tiny routers separate the experts


def _move_off_init(hf, path) -> None:
    """Every score correction moved by noise (zeros at init); two heads of each Mamba-2 layer given a dt below
    time_step_min = 1e-3 (softplus(dt_bias) about 1e-4), x 100 times larger (their conv1d channels) and no D
    skip, so that the clamp decides a visible part of the layer's output; the checkpoint saved again."""
    g = torch.Generator().manual_seed(9)
    with torch.no_grad():
        for layer in hf.model.layers:
            if layer.block_type == "moe":
                bias = layer.mixer.gate.e_score_correction_bias
                bias.add_(torch.randn(bias.shape, generator=g) * 0.1)
            elif layer.block_type == "linear_attention":
                m = layer.mixer
                m.dt_bias[:2], m.D[:2] = -9.0, 0.0
                m.conv1d.weight[:2 * m.head_dim] *= 100.0
    hf.save_pretrained(path)


# the checkpoints fixture (name -> (checkpoint directory, transformers model, the engine's fp32 model of it));
# logits, decode steps through both caches (transformers' own cached steps: the recurrent form, dt unclamped, not
# a forward over the whole sequence, which clamps every token's dt, `test_the_prefill_clamp_matters`) and
# generate() tokens equal transformers'; the weights saved back under the names and layouts transformers holds
_CHECKS = hybrid_checks(CONFIGS, noise=NOISE, tol=TOL, after=_move_off_init)
globals().update(_CHECKS)
# named here too: tests/suite_markers.py lists it as slow by its name in this file
test_generate_equals_transformers = _CHECKS["test_generate_equals_transformers"]


def test_the_prefill_clamp_matters(checkpoints):
    """Without the clamp of dt at time_step_min (mamba_ssm's and vLLM's scan) the prefill's logits leave
    transformers'; the spec carries the config's time_step_min."""
    from dataclasses import replace

    path, hf, model = checkpoints["dense"]
    assert model.spec.linear_dt_min == 1e-3
    unclamped = from_pretrained(path, dtype="fp32", spec=replace(model.spec, linear_dt_min=0.0))
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        assert (unclamped(ids, all_logits=True) - hf(ids).logits).abs().max() > 100 * TOL


def test_preempted_sequences_recompute_transformers_tokens(checkpoints):
    """10 blocks of 4 tokens cannot hold the three sequences to their end: the newest is preempted and recomputed
    from position 0, its prompt clamped and its generated tokens not, as they were computed the first time."""
    _, hf, model = checkpoints["dense"]
    params = CASES["greedy"]
    engine = Engine(model, cache="paged", block_size=4, num_blocks=10, chunked_prefill=True, max_batched_tokens=4)
    outputs = engine.generate(PROMPTS, params)
    assert sum(o.metrics.num_preemptions for o in outputs) > 0
    assert [[c.tokens for c in o.completions] for o in outputs] == hf_generate(hf, PROMPTS, params)


def test_chunked_and_recurrent_forms_agree_in_fp64():
    g = torch.Generator().manual_seed(0)
    B, T, H, P, G, N = 2, 11, 4, 3, 2, 5
    x = torch.randn(B, T, H, P, generator=g, dtype=torch.float64)
    dt = torch.rand(B, T, H, generator=g, dtype=torch.float64)
    A, D = -torch.rand(H, generator=g, dtype=torch.float64) * 2, torch.randn(H, generator=g, dtype=torch.float64)
    Bm, Cm = (torch.randn(B, T, G, N, generator=g, dtype=torch.float64) for _ in range(2))
    init = torch.randn(B, H, N, P, generator=g, dtype=torch.float64)
    y_c, s_c = chunk_scan(x, dt, A, Bm, Cm, D, 4, init)
    y_r, s_r = recurrent_scan(x, dt, A, Bm, Cm, D, init)
    assert y_c.dtype == torch.float64
    torch.testing.assert_close(y_c, y_r, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s_c, s_r, rtol=1e-10, atol=1e-10)
    # a prompt split in two (at 5, not at the chunk of 4) continues through the state
    y_a, s_a = chunk_scan(x[:, :5], dt[:, :5], A, Bm[:, :5], Cm[:, :5], D, 4, init)
    y_b, s_b = chunk_scan(x[:, 5:], dt[:, 5:], A, Bm[:, 5:], Cm[:, 5:], D, 4, s_a)
    torch.testing.assert_close(torch.cat((y_a, y_b), dim=1), y_c, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s_b, s_c, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_bytes_equal_the_analytical_model(checkpoints, dtype):
    """Every Mamba-2 layer's recurrent state (H x N x P, fp32: mamba_ssm_cache_dtype) and its convolution's last
    K - 1 inputs (W channels, the model's dtype), and the one attention layer's K and V per token."""
    from llmperf.specs import Precision

    for name in CONFIGS:
        spec = checkpoints[name][2].spec
        precision = Precision.uniform("fp32" if dtype == torch.float32 else "bf16")
        c = ContiguousKVCache(spec, max_batch=2, max_seq_len=16, dtype=dtype)
        assert spec.state_dtype == "fp32"
        assert c.state_bytes_per_seq == spec.kv_cache(precision).state_bytes > 0
        assert c.bytes_per_token == spec.kv_cache(precision).bytes_per_token
        assert c.num_layers == 1 and not c.supports_prefix_sharing  # K/V of the attention layer only


def test_operators_are_recorded_under_the_vocabulary_names(checkpoints):
    _, _, model = checkpoints["moe"]
    rec = OpNames()
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]), rec=rec)
    names = {i: rec.of_layer(i) for i in range(3)}
    assert names[0] == ["attn_norm", "in_proj", "conv1d", "ssd", "gated_norm", "o_proj", "attn_residual"]
    assert names[1][:3] == ["mlp_norm", "router", "moe_route"] and names[1][-1] == "mlp_residual"
    assert {"up_proj", "act", "down_proj", "moe_sum", "shared_up_proj", "shared_act", "shared_down_proj"} == \
        set(names[1][3:-1])
    assert names[2] == ["attn_norm", "qkv_proj", "attention", "o_proj", "attn_residual"]  # no rope, no cache


def test_features_without_state_rollback_refuse_mamba2_layers(checkpoints):
    from llmperf.engine import shard_spec
    from llmperf.errors import SpecError
    from llmperf.specs.hf import model_spec_from_hf_config

    _, _, model = checkpoints["dense"]
    assert_mamba2_refused_without_state_rollback(model)
    with pytest.raises(SpecError, match=r"layer_types: .*linear \(Mamba-2\) layers; tensor parallelism"):
        shard_spec(model.spec, 2)
    with pytest.raises(SpecError, match="mixer_only_layers: .*layers of one sublayer"):
        shard_spec(model_spec_from_hf_config(dict(_BASE, layers_block_type=["full_attention", "mlp"] * 2)), 2)
