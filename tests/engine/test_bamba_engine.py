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
import torch

from llmperf.engine import from_pretrained, to_hf_state_dict
from llmperf.engine.cache import ContiguousKVCache, PagedKVCache

from checkpoints import CASES, ENGINES, PROMPTS, assert_generation_matches, assert_logits_match, saved_checkpoint

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


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    import transformers.utils.logging as hf_logging

    hf_logging.set_verbosity_error()
    out = {}
    for name, cfg in CONFIGS.items():
        path = tmp_path_factory.mktemp(name)
        hf = saved_checkpoint(cfg, path, noise=0.05)
        out[name] = (path, hf, from_pretrained(path, dtype="fp32"))
    return out


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_equal_transformers(checkpoints, name):
    path, hf, _ = checkpoints[name]
    assert_logits_match(path, hf, tokens=13, tol=TOL)


@pytest.mark.parametrize("cache", ["paged", "contiguous"])
@pytest.mark.parametrize("name", CONFIGS)
def test_decode_step_logits_equal_transformers(checkpoints, name, cache):
    """A 13-token prefill through the cache, then 4 one-token steps, against transformers' own cached steps."""
    _, hf, model = checkpoints[name]
    c = (PagedKVCache(model.spec, num_blocks=16, block_size=4) if cache == "paged"
         else ContiguousKVCache(model.spec, max_batch=1, max_seq_len=20))
    seq = PROMPTS[0] + [1, 2]
    assert c.allocate(7, len(seq))
    with torch.no_grad():
        logits = model(torch.tensor([seq]), c.prepare([7], len(seq)))
        theirs = hf(torch.tensor([seq]), use_cache=True)
        for _ in range(4):
            torch.testing.assert_close(logits, theirs.logits[:, -1], rtol=TOL, atol=TOL)
            seq.append(int(logits.argmax()))
            assert c.append_slot(7)
            logits = model(torch.tensor([seq[-1:]]), c.prepare([7], 1))
            # BambaModel numbers a step's tokens from 0 unless told (not from the cache's length): its position, as
            # generate() passes it
            theirs = hf(torch.tensor([seq[-1:]]), cache=theirs.past_key_values, use_cache=True,
                        position_ids=torch.tensor([[len(seq) - 1]]))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", CONFIGS)
def test_generate_equals_transformers(checkpoints, name, case, engine, memo={}):  # noqa: B006 (shared on purpose)
    path, hf, _ = checkpoints[name]
    assert_generation_matches(path, hf, case, engine, memo=memo)


def test_weights_save_back_under_transformers_names(checkpoints):
    for name in CONFIGS:
        _, hf, model = checkpoints[name]
        back, theirs = to_hf_state_dict(model), hf.state_dict()
        assert set(back) == set(theirs), name
        for key, value in back.items():
            assert torch.equal(value, theirs[key]), key
