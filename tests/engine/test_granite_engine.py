"""IBM Granite in the engine against `transformers` in fp32, from tiny checkpoints transformers saves (Granite's
original names: `block_sparse_moe.input_linear`, `router.layer`, `shared_mlp.*`, `mamba.*`) and the engine loads
as a user's (`from_pretrained`).

Five structures invented here, each with all four scalars away from 1 (the embedding, each sublayer's output and
the logits scaled, the softmax scale set): Granite 4.0-H (`granitemoehybrid`) with Mamba-2, NoPE attention and
MoE + shared-MLP layers; a dense one (no experts: the shared MLP is the FFN) with rotary attention, biased
Mamba-2 projections and a tied head; Granite 3 dense (`granite`, biases), MoE (`granitemoe`) and MoE with a
shared MLP (`granitemoeshared`). The Mamba chunk is 4 tokens: prompts span several chunks.

Checked: logits of a prompt and of decode steps through both caches within 1e-5; generate() tokens identical
(greedy, processors, beams) on the paged, contiguous and chunked-prefill engines; the operators' names; the
weights saved back under the names transformers holds in memory; tensor parallelism of the dense Granite 3.
"""

from __future__ import annotations

import pytest
import torch

from llmperf.engine import from_pretrained
from llmperf.engine.cache import ContiguousKVCache

from checkpoints import PROMPTS, assert_mamba2_refused_without_state_rollback, hybrid_checks
from engine_testing import OpNames

transformers = pytest.importorskip("transformers")

TOL = 1e-5  # fp32 (rtol and atol)
_SCALARS = dict(embedding_multiplier=6.0, residual_multiplier=0.3, logits_scaling=2.5, attention_multiplier=0.1)
_IDS = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
_HYBRID = dict(model_type="granitemoehybrid", vocab_size=128, hidden_size=64, num_attention_heads=4,
               num_key_value_heads=2, intermediate_size=24, shared_intermediate_size=32, num_local_experts=4,
               num_experts_per_tok=2, mamba_n_heads=8, mamba_d_state=16, mamba_n_groups=2, mamba_chunk_size=4,
               mamba_d_conv=4, num_hidden_layers=4, max_position_embeddings=64,
               layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
               **_SCALARS, **_IDS)
_GRANITE = dict(model_type="granite", vocab_size=128, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=96, num_hidden_layers=3, max_position_embeddings=64, **_SCALARS, **_IDS)
CONFIGS = {
    "hybrid_moe": _HYBRID,
    "hybrid_dense": dict(_HYBRID, num_local_experts=0, position_embedding_type="rope", mamba_proj_bias=True,
                         tie_word_embeddings=True, layer_types=["linear_attention", "full_attention"] * 2),
    "granite": dict(_GRANITE, attention_bias=True, mlp_bias=True),
    "granitemoe": dict(_GRANITE, model_type="granitemoe", intermediate_size=24, num_local_experts=4,
                       num_experts_per_tok=2),
    "granitemoeshared": dict(_GRANITE, model_type="granitemoeshared", intermediate_size=24, num_local_experts=4,
                             num_experts_per_tok=2, shared_intermediate_size=40),
}
NOISE = {"hybrid_moe": 0.2, "hybrid_dense": 0.05, "granite": 0.05, "granitemoe": 0.2, "granitemoeshared": 0.2}


# the checkpoints fixture (name -> (checkpoint directory, transformers model, the engine's fp32 model of it));
# logits, decode steps through both caches (the Mamba-2 layers' recurrent form) and generate() tokens equal
# transformers'; the weights saved back under the names and layouts transformers holds in memory
_CHECKS = hybrid_checks(CONFIGS, noise=NOISE, tol=TOL)
globals().update(_CHECKS)
# named here too: tests/suite_markers.py lists it as slow by its name in this file
test_generate_equals_transformers = _CHECKS["test_generate_equals_transformers"]


def test_the_scalars_matter(checkpoints):
    """Each scalar back at its neutral value (1; the softmax scale 1/sqrt(head_dim)) moves the logits away from
    transformers': the engine honours every one."""
    from dataclasses import replace

    path, hf, model = checkpoints["hybrid_moe"]
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        theirs = hf(ids).logits
        for field in _SCALARS:
            spec = replace(model.spec, **{field: 0.25 if field == "attention_multiplier" else 1.0})  # 0.25: 1/sqrt(D)
            ours = from_pretrained(path, dtype="fp32", spec=spec)(ids, all_logits=True)
            assert (ours - theirs).abs().max() > 100 * TOL, field


def test_operators_are_recorded_under_the_vocabulary_names(checkpoints):
    _, _, model = checkpoints["hybrid_moe"]
    rec = OpNames()
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]), rec=rec)
    names = {i: rec.of_layer(i) for i in range(2)}
    assert names[0][:7] == ["attn_norm", "in_proj", "conv1d", "ssd", "gated_norm", "o_proj", "attn_residual"]
    assert names[0][7:10] == ["mlp_norm", "router", "moe_route"] and names[0][-1] == "mlp_residual"
    assert names[1][:5] == ["attn_norm", "qkv_proj", "attention", "o_proj", "attn_residual"]  # NoPE: no rope
    assert {"embed_scale", "logits_scale"} <= set(rec.of_layer(None))


def _two_ranks(model, ids):
    """The model sharded over 2 ranks in threads (sums and gathers over a barrier, in rank order): rank 0's logits."""
    import threading

    from llmperf.engine.tensor_parallel import shard_model

    barrier, parts, out = threading.Barrier(2, timeout=60), [None, None], [None, None]

    def collective(rank: int, gather: bool):
        def run(t: torch.Tensor):
            parts[rank] = t.clone()
            barrier.wait()
            total = torch.cat(parts, dim=-1) if gather else parts[0] + parts[1]
            barrier.wait()
            return total if gather else t.copy_(total)
        return run

    shards = [shard_model(model, r, 2, collective(r, False), collective(r, True)) for r in range(2)]
    threads = [threading.Thread(target=lambda r=r: out.__setitem__(r, shards[r](ids, all_logits=True)))
               for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out[0]


def test_tensor_parallel_dense_granite_equals_the_whole_model(checkpoints):
    """The dense Granite 3 sharded over 2 ranks: the residual multiplier after each sublayer's sum, the logits
    scaled after the gather; Mamba-2 and MoE layers are refused by name."""
    from llmperf.engine import shard_spec
    from llmperf.errors import SpecError

    _, hf, model = checkpoints["granite"]
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        torch.testing.assert_close(_two_ranks(model, ids), hf(ids).logits, rtol=TOL, atol=TOL)
    with pytest.raises(SpecError, match=r"layer_types: .*linear \(Mamba-2\) layers; tensor parallelism"):
        shard_spec(checkpoints["hybrid_dense"][2].spec, 2)
    with pytest.raises(SpecError, match="num_experts: .*is a mixture of experts"):
        shard_spec(checkpoints["granitemoe"][2].spec, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_bytes_equal_the_analytical_model(checkpoints, dtype):
    """Every Mamba-2 layer's recurrent state (H x N x P, fp32 as transformers keeps it) and its convolution's last
    K - 1 inputs (the model's dtype), and the attention layers' K and V per token."""
    from llmperf.specs import Precision

    for name in ("hybrid_moe", "hybrid_dense"):
        spec = checkpoints[name][2].spec
        precision = Precision.uniform("fp32" if dtype == torch.float32 else "bf16")
        c = ContiguousKVCache(spec, max_batch=2, max_seq_len=16, dtype=dtype)
        assert c.state_bytes_per_seq == spec.kv_cache(precision).state_bytes > 0
        assert c.bytes_per_token == spec.kv_cache(precision).bytes_per_token


def test_features_without_state_rollback_refuse_mamba2_layers(checkpoints):
    assert_mamba2_refused_without_state_rollback(checkpoints["hybrid_moe"][2])
