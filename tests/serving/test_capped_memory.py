"""The simulator's pool for a model whose every layer slides with one window (Mistral 7B v0.1, a
StreamingLLM model): `plan_memory` counts a sequence's capped blocks (`CappedBlockManager`, the engine's
rule), so at long contexts more sequences run at once than with kv_window "full"; every output says
which pool it priced, and mixed windows without a full layer or a draft keep full pages."""

from __future__ import annotations

import numpy as np

from llmperf.serving.blocks import BlockManager, CappedBlockManager
from llmperf.serving.simulator import ServingConfig, capped_window, kv_note, plan_memory, simulate
from llmperf.serving.workload import Workload
from llmperf.specs import load_model
from llmperf.specs.streaming import streaming


def test_mistral_memory_plan_counts_the_window_blocks():
    capped = ServingConfig.build("mistral-7b", "a100-80gb-sxm", max_batched_tokens=2048)
    full = ServingConfig.build("mistral-7b", "a100-80gb-sxm", kv_window="full", max_batched_tokens=2048)
    mc, mf = plan_memory(capped), plan_memory(full)
    assert mc.capped_window == ("sliding", 4096) and mf.capped_window is None and not mc.window_groups
    assert (mc.num_blocks, mc.kv_bytes_per_token) == (mf.num_blocks, mf.kv_bytes_per_token)  # a block: every layer
    # a 32k-token sequence: a 2048-token step and the 4095 keys before it, 384 blocks and one straddling
    assert mc.blocks_for(32_000) == -(-(2048 + 4095) // 16) + 1 == 385 and mf.blocks_for(32_000) == 2000
    assert mc.blocks_for(1000) == mf.blocks_for(1000) == 63  # within the window: the same
    assert isinstance(mc.manager(), CappedBlockManager) and type(mf.manager()) is BlockManager
    assert not mc.kv_sliding_full_pages and mf.kv_sliding_full_pages
    assert capped.settings()["kv_sliding_full_pages"] is False and full.settings()["kv_sliding_full_pages"] is True
    assert kv_note(capped.model).startswith("KV: every layer sliding (4096 tokens)")
    assert kv_note(full.model, "full") == "KV: sliding layers given full pages"


def test_at_long_contexts_the_capped_pool_runs_more_sequences_at_once():
    """Twelve 12k-token prompts in a pool of 2000 blocks (32k tokens): full pages hold two at a time,
    the capped pool five (385 blocks each)."""
    w = Workload(arrival_s=np.zeros(12), prompt_tokens=np.full(12, 12_000), output_tokens=np.full(12, 20),
                 shared_prefix_tokens=np.zeros(12, dtype=int))
    running = {}
    for window in ("capped", "full"):
        config = ServingConfig.build("mistral-7b", "a100-80gb-sxm", kv_window=window, num_blocks=2000,
                                     max_batched_tokens=2048, efficiency="roofline")
        res = simulate(w, config)
        running[window] = max(g.num_running for g in res.log)
        assert res.settings["kv_sliding_full_pages"] is (window == "full")
    assert running["full"] == 2 < 5 <= running["capped"]


def test_streaming_models_are_capped_and_mixed_windows_or_drafts_are_not():
    llama = load_model("llama-3.1-8b")
    assert capped_window(llama) is None and capped_window(streaming(llama, 4, 1020)) == ("sliding", 1024)
    assert capped_window(streaming(llama, 4, 1020), pp=2) == ("sliding", 1024)  # every stage slides alike
    assert capped_window(streaming(llama, 4, 1020), speculative=True) is None  # a draft's KV shares the blocks
    mixed = llama.scaled(num_layers=4, layer_types=("sliding", "chunked") * 2, sliding_window=64,
                         attention_chunk_size=128)
    assert capped_window(mixed) is None
    config = ServingConfig.build(mixed, "a100-80gb-sxm")
    memory = plan_memory(config)
    assert memory.kv_sliding_full_pages and memory.capped_window is None and not memory.window_groups
    assert config.settings()["kv_sliding_full_pages"] is True
    assert kv_note(mixed).startswith("KV: sliding layers given full pages (the capped pool needs")


def test_the_service_rate_bound_counts_a_window_not_the_context():
    """`plan`'s floor on replicas: at 16k-token prompts the capped pool's batch is bounded by the window,
    so its optimistic rate is higher than full pages'; without windows the pools are one."""
    from llmperf.serving.simulator import service_rate_bound
    from llmperf.serving.workload import WorkloadSpec

    spec = WorkloadSpec(arrival="poisson:1", prompt_len="16000", output_len="2000", num_requests=100)
    rates = {}
    for model in ("mistral-7b", "llama-3.1-8b"):
        for window in ("capped", "full"):
            config = ServingConfig.build(model, "h100-sxm", kv_window=window, efficiency="roofline")
            rates[model, window] = service_rate_bound(config, spec, plan_memory(config).num_blocks)
    assert rates["mistral-7b", "capped"] > 1.2 * rates["mistral-7b", "full"]
    assert rates["llama-3.1-8b", "capped"] == rates["llama-3.1-8b", "full"]
