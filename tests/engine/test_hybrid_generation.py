"""Tokens are unchanged by a hybrid cache giving blocks back: a Gemma 3 checkpoint saved by
transformers (3 sliding layers of window 6 : 1 full) generates transformers' exact tokens for prompts
and outputs many windows long, with the sliding layers' blocks freed (paged, chunked prefill, a pool
small enough to preempt and recompute, beams that fork and copy on write) and kept (`kv_window="full"`,
the contiguous cache)."""

from __future__ import annotations

import pytest

from llmperf.engine import Engine, SamplingParams, from_pretrained

from checkpoints import saved_checkpoint
from engine_testing import hf_generate

CONFIG = dict(model_type="gemma3_text", vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=160, head_dim=16,
              sliding_window=6, query_pre_attn_scalar=20,
              layer_types=["sliding_attention"] * 3 + ["full_attention"],
              rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0},
                               "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}})
#: prompts of 5 to 9 windows, ragged, and outputs of 5 more
PROMPTS = [[(7 * i + 3) % 128 for i in range(30)], [(11 * i + 5) % 128 for i in range(41)],
           [(5 * i + 1) % 128 for i in range(52)]]
GREEDY = SamplingParams(max_new_tokens=30)
BEAMS = SamplingParams(max_new_tokens=16, num_beams=3, num_return_sequences=2)

ENGINES = {
    "paged": dict(cache="paged", block_size=4),
    "contiguous": dict(cache="contiguous"),
    "chunked": dict(cache="paged", block_size=4, chunked_prefill=True, max_batched_tokens=9),
    # admitted at their prefill's cost (the full layers' blocks, 3 x 4 sliding ones), the first two
    # outgrow 42 blocks as they decode: the newest is preempted and recomputed
    "preempting": dict(cache="paged", block_size=4, num_blocks=42, chunked_prefill=True, max_batched_tokens=4),
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma3_hybrid")
    hf = saved_checkpoint(CONFIG, path, seed=5)
    return path, hf, {}


def _expected(checkpoint, params, prompts=PROMPTS):
    _, hf, memo = checkpoint
    key = (id(params), len(prompts))
    if key not in memo:
        memo[key] = hf_generate(hf, prompts, params)
    return memo[key]


def _peak_decoding(eng: Engine) -> int:
    """The most bytes reserved in a decode step (a prefill step holds its whole prompt in every layer)."""
    return max(s.usage.reserved_bytes for s in eng.last_steps if str(s.phase) == "decode")


@pytest.mark.parametrize("engine", list(ENGINES))
def test_greedy_tokens_equal_transformers(checkpoint, engine):
    path = checkpoint[0]
    eng = Engine(from_pretrained(path, dtype="fp32"), **ENGINES[engine])
    outputs = eng.generate(PROMPTS, GREEDY)
    assert [[c.tokens for c in o.completions] for o in outputs] == _expected(checkpoint, GREEDY)
    if engine == "preempting":
        assert sum(o.metrics.num_preemptions for o in outputs) > 0
    if engine == "paged":  # the sliding layers held a few blocks, not the context: under half of full pages
        full = Engine(eng.model, cache="paged", block_size=4, kv_window="full")
        assert [[c.tokens for c in o.completions] for o in full.generate(PROMPTS, GREEDY)] == \
            _expected(checkpoint, GREEDY)
        assert 2 * _peak_decoding(eng) < _peak_decoding(full)


@pytest.mark.parametrize("engine", ["paged", "chunked"])
def test_beams_equal_transformers(checkpoint, engine):
    eng = Engine(from_pretrained(checkpoint[0], dtype="fp32"), **ENGINES[engine])
    outputs = eng.generate(PROMPTS[1:2], BEAMS)
    assert [[c.tokens for c in o.completions] for o in outputs] == _expected(checkpoint, BEAMS, PROMPTS[1:2])
