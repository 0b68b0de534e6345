"""Bamba (`bamba`) in the engine against `transformers` in fp32, from tiny checkpoints transformers saves
(`pre_ff_layernorm`, `feed_forward.`, `mamba.` names) and the engine loads as a user's (`from_pretrained`): Mamba-2
layers (Granite 4.0-H's mixer) and attention rotating half of each head, each followed by its MLP; one with biases
everywhere they may be and a tied head. The Mamba chunk is 4 tokens: prompts span several chunks.

Checked: logits of a prompt and of decode steps through both caches within 1e-5; generate() tokens identical
(greedy, processors, beams) on the paged, contiguous and chunked-prefill engines; the weights saved back under the
names transformers holds in memory.
"""

from __future__ import annotations

import pytest

from checkpoints import hybrid_checks

transformers = pytest.importorskip("transformers")

TOL = 1e-5  # fp32 (rtol and atol)
_BAMBA = dict(model_type="bamba", vocab_size=128, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=96, mamba_n_heads=8, mamba_d_state=16, mamba_n_groups=2, mamba_chunk_size=4,
              mamba_d_conv=4, num_hidden_layers=4, attn_layer_indices=[1], max_position_embeddings=64,
              bos_token_id=None, eos_token_id=None, pad_token_id=None)
CONFIGS = {
    "bamba": _BAMBA,
    "biases": dict(_BAMBA, attention_bias=True, mlp_bias=True, mamba_proj_bias=True, mamba_conv_bias=False,
                   tie_word_embeddings=True, attn_layer_indices=[0, 3]),
}


# the checkpoints fixture; logits, decode steps through both caches (BambaModel numbers a step's tokens from 0
# unless told, not from the cache's length: its position passed as generate() passes it) and generate() tokens
# equal transformers'; the weights saved back under transformers' names
_CHECKS = hybrid_checks(CONFIGS, noise=0.05, tol=TOL, step_positions=True)
globals().update(_CHECKS)
# named here too: tests/suite_markers.py lists it as slow by its name in this file
test_generate_equals_transformers = _CHECKS["test_generate_equals_transformers"]


