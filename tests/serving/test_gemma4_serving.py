"""Gemma 4 in the simulator's pool: its sliding layers keep their window's blocks (vLLM's hybrid KV-cache
manager), each of their blocks taking as many pool blocks as its bytes need, a pool block being the full
layers' (which store another width a token: their own head dim and KV heads); its KV-shared layers hold
none. Tensor parallelism splits each kind's KV heads apart (the full layers' one head replicated)."""

from __future__ import annotations

import numpy as np
import pytest

from llmperf.serving.simulator import ServingConfig, kv_note, plan_memory, simulate, window_groups
from llmperf.serving.workload import Workload
from llmperf.specs.hf import model_spec_from_hf_config

# 5 sliding layers (window 8) of 2 KV heads x 16, one full layer of 1 KV head x 32 (K = V)
CFG = dict(model_type="gemma4_text", vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
           num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32, sliding_window=8,
           hidden_size_per_layer_input=0, max_position_embeddings=4096, attention_k_eq_v=True,
           num_global_key_value_heads=1)
SPEC = model_spec_from_hf_config(CFG, name="tiny-gemma4")


@pytest.mark.parametrize("tp, pages", [(1, 5), (2, 3)])
def test_the_window_group_pages_by_bytes(tp, pages):
    """tp 1: a sliding block of 5 layers x 64 elements takes ceil(320 / 64) = 5 full-layer blocks; tp 2: the
    sliding layers' heads split (32 elements), the full layer's one head replicated: ceil(160 / 64) = 3."""
    (g,) = window_groups(SPEC, tp=tp)
    assert (g.attention, g.window, g.layers, g.full_layers, g.pages) == ("sliding", 8, 5, 1, pages)
    config = ServingConfig.build(SPEC, "h200", tp=tp, num_blocks=1000, max_batched_tokens=256)
    memory = plan_memory(config)
    assert memory.window_groups == (g,) and not memory.kv_sliding_full_pages
    assert memory.kv_bytes_per_token == 2 * 1 * 32 * 2  # a pool block: the full layer's K and V, bf16
    # at most, a 1,000-token sequence: the full layer's 63 blocks, and the blocks a 256-token step and the 7 keys
    # before it cover (17, and one it may straddle) in the window group, each taking `pages` pool blocks
    assert memory.blocks_for(1000) == 63 + pages * 18
    assert kv_note(SPEC).startswith("KV: sliding/chunked layers hold their window's blocks")


def test_kv_shared_layers_hold_no_blocks():
    shared = model_spec_from_hf_config(dict(CFG, layer_types=["sliding_attention", "full_attention"]
                                            + ["sliding_attention"] * 3 + ["full_attention"], num_kv_shared_layers=2),
                                       name="tiny-gemma4-shared")
    (g,) = window_groups(shared)
    assert (g.layers, g.full_layers) == (3, 1)  # layers 4 and 5 read layers 3's and 1's caches


def test_a_gemma4_load_is_simulated_with_its_windows():
    w = Workload(arrival_s=np.linspace(0, 0.01, 6), prompt_tokens=np.full(6, 300), output_tokens=np.full(6, 5),
                 shared_prefix_tokens=np.zeros(6, dtype=int))
    res = simulate(w, ServingConfig.build(SPEC, "h200", num_blocks=400, max_batched_tokens=256,
                                          efficiency="roofline"))
    assert res.settings["kv_sliding_full_pages"] is False and len(res.requests) == 6
