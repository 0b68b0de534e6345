"""The simulator's memory plan under today's layouts: with data-parallel attention the replica's KV
pool is tp GPUs' pools (each GPU holds its own sequences' latent), weights per GPU are the layout's,
and a model with sliding layers says its pool gives them full pages."""

from __future__ import annotations

import numpy as np
import pytest

from llmperf.analysis.memory import kv_bytes_per_token_per_gpu, weight_bytes_per_gpu
from llmperf.errors import SpecError
from llmperf.serving.simulator import ServingConfig, check_fits, plan_memory, simulate
from llmperf.serving.workload import Workload
from llmperf.specs import Precision, load_hardware, load_model

FP8 = Precision(weights="fp8", activations="fp8", kv="fp8")


def _config(**kw):
    return ServingConfig(model=load_model("deepseek-v3"), hardware=load_hardware("h200"), precision=FP8, tp=8, **kw)


def test_dp_attention_pools_every_gpus_kv():
    tp, dp = plan_memory(_config()), plan_memory(_config(ep=8, dp_attention=True))
    m = load_model("deepseek-v3")
    # MLA's latent is one per token on every GPU under tp (not split), and on its own GPU under dp
    assert tp.kv_bytes_per_token == dp.kv_bytes_per_token == kv_bytes_per_token_per_gpu(m, FP8)
    assert (tp.kv_shards, dp.kv_shards) == (1, 8)
    assert dp.weights_bytes == weight_bytes_per_gpu(m, FP8, 8, ep=8, dp_attention=True) > tp.weights_bytes
    free = dp.usable_bytes - dp.weights_bytes - dp.activation_bytes
    per_gpu = int(free // (dp.kv_bytes_per_token * dp.block_size))
    assert dp.num_blocks == 8 * per_gpu and dp.blocks_per_gpu == per_gpu
    assert dp.kv_pool_bytes == per_gpu * dp.block_bytes  # one GPU's pool
    assert tp.num_blocks == tp.blocks_per_gpu


def test_dp_attention_num_blocks_is_one_gpus_and_a_sequence_fits_one_gpu():
    cfg = _config(ep=8, dp_attention=True, num_blocks=4, block_size=16)
    mem = plan_memory(cfg)
    assert (mem.num_blocks, mem.blocks_per_gpu) == (32, 4)
    ok = Workload(arrival_s=np.zeros(8), prompt_tokens=np.full(8, 60), output_tokens=np.full(8, 4),
                  shared_prefix_tokens=np.zeros(8, dtype=int))
    # 64-token sequences of 4 blocks each: one GPU's pool holds one at a time, the replica's 32 blocks
    # several (the scheduler keeps a watermark and room to grow)
    assert simulate(ok, cfg).steps["batch"].max() >= 6
    assert simulate(ok, _config(ep=8, num_blocks=4, block_size=16)).steps["batch"].max() == 1
    big = Workload(arrival_s=np.zeros(1), prompt_tokens=np.full(1, 70), output_tokens=np.full(1, 4),
                   shared_prefix_tokens=np.zeros(1, dtype=int))
    with pytest.raises(SpecError, match=r"needs .* more than the .* pool \(4 blocks of 16 tokens\)"):
        check_fits(cfg, mem, big)


def test_a_hybrid_models_pool_caps_its_sliding_layers_or_says_it_gives_them_full_pages():
    """gpt-oss-20b (12 sliding layers of W = 128, 12 full): capped, a block holds the full layers'
    tokens (half the bytes) and the sliding layers hold their window's blocks besides; with full
    pages every layer holds the whole context, and every output says so."""
    capped = ServingConfig.build("gpt-oss-20b", "h100-sxm", max_batched_tokens=2048)
    full = ServingConfig.build("gpt-oss-20b", "h100-sxm", kv_window="full", max_batched_tokens=2048)
    mc, mf = plan_memory(capped), plan_memory(full)
    assert mc.kv_bytes_per_token == mf.kv_bytes_per_token / 2
    assert [(g.attention, g.window, g.layers, g.full_layers) for g in mc.window_groups] == [("sliding", 128, 12, 12)]
    assert not mc.kv_sliding_full_pages and mf.kv_sliding_full_pages and not mf.window_groups
    assert mc.num_blocks == pytest.approx(2 * mf.num_blocks, abs=1)
    # a 4096-token sequence: 256 full-layer blocks + the window's (128 + a 2048-token step) blocks
    assert mc.blocks_for(4096) == 256 + (-(-(2048 + 127) // 16) + 1)
    assert mf.blocks_for(4096) == 256
    assert capped.settings()["kv_sliding_full_pages"] is False
    assert full.settings()["kv_sliding_full_pages"] is True
    w = Workload(arrival_s=np.zeros(2), prompt_tokens=np.full(2, 100), output_tokens=np.full(2, 5),
                 shared_prefix_tokens=np.zeros(2, dtype=int))
    assert simulate(w, full).settings["kv_note"] == "KV: sliding layers given full pages"
    assert simulate(w, capped).settings["kv_note"].startswith("KV: sliding/chunked layers hold their window")
    assert not ServingConfig.build("llama-3.1-8b", "h100-sxm").settings()["kv_sliding_full_pages"]


def test_a_capped_pool_serves_more_long_sequences_at_once():
    """The same bytes of pool: long gpt-oss-20b sequences run several at a time with capped sliding
    layers, fewer with full pages."""
    w = Workload(arrival_s=np.zeros(8), prompt_tokens=np.full(8, 3000), output_tokens=np.full(8, 8),
                 shared_prefix_tokens=np.zeros(8, dtype=int))
    blocks = 800  # 800 blocks of every layer (full pages): 12,800 tokens; capped: blocks of the full layers
    full = simulate(w, ServingConfig.build("gpt-oss-20b", "h100-sxm", kv_window="full", num_blocks=blocks))
    capped = simulate(w, ServingConfig.build("gpt-oss-20b", "h100-sxm", num_blocks=2 * blocks))
    assert capped.steps["batch"].max() > full.steps["batch"].max()
    assert capped.summary()["makespan_s"] < full.summary()["makespan_s"]
