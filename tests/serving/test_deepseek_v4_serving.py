"""DeepSeek-V4 in the serving simulator: its steps priced as `estimate` prices them (a static batch exactly), its
pages (`llmperf.serving.v4cache`) what `KVCacheSpec` says its cache holds, in whole blocks, its partial windows and
overlaps a per-sequence state at their largest; the pool's sequences against `estimate`'s max batch. Tiny structures
of our own and the config class's default shape (`tests/specs/test_deepseek_v4.py`)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import llmperf
from llmperf.analysis.rollup import Conventions
from llmperf.analysis.timemodel import time_model_for
from llmperf.errors import SpecError
from llmperf.serving.costmodel import StepCostModel
from llmperf.serving.simulator import ServingConfig, plan_memory, simulate
from llmperf.serving.speculative import SpeculativeConfig
from llmperf.serving.v4cache import V4BlockManager, V4Pages
from llmperf.serving.workload import Workload
from llmperf.specs import load_hardware
from llmperf.specs.kvcache import KVCacheSpec
from tests.analysis.model_checks import assert_simulated_static_batch_is_estimate
from tests.specs.test_deepseek_v4 import STRUCTURES, TINY, read

CONTEXTS = (0, 1, 3, 7, 8, 15, 16, 17, 63, 64, 65, 100, 127, 128, 129, 1000, 4097)


@pytest.mark.parametrize("name", sorted(STRUCTURES))
def test_a_static_batch_is_estimate(name):
    assert_simulated_static_batch_is_estimate(read(STRUCTURES[name]), tp=1)


def test_a_static_batch_is_estimate_with_dp_attention():
    assert_simulated_static_batch_is_estimate(read(TINY), batch=8, tp=2, ep=2, dp_attention=True)
    default = read({"model_type": "deepseek_v4"})
    assert_simulated_static_batch_is_estimate(default, batch=16, prompt=300, gen=4, tp=8, ep=8, dp_attention=True)


@pytest.mark.parametrize("default", [False, True])
def test_step_costs_equal_estimate_under_the_typical_time_model(default):
    """The cost model's prefill and decode steps of a static batch are `estimate`'s under a calibrated time model
    too (its efficiencies by rows and shape: the one operator a step is `estimate`'s operator)."""
    spec = read({"model_type": "deepseek_v4"} if default else TINY)
    par = dict(tp=8, ep=8, dp_attention=True) if default else {}
    batch, prompt, gen = (16, 2000, 4) if default else (4, 150, 6)
    tm = time_model_for(load_hardware("h200"), "typical", "fp16")
    est = llmperf.estimate(spec, "h200", batch=batch, prompt_len=prompt, gen_len=gen, time_model=tm, **par)
    conv = Conventions(ep=par.get("ep", 1), dp_attention=par.get("dp_attention", False))
    cm = StepCostModel(model=est.model, hardware=est.hardware, precision=est.precision, tp=par.get("tp", 1),
                       time_model=tm, conventions=conv)
    assert cm.step_time_s([prompt] * batch, [prompt] * batch, batch) == pytest.approx(est.ttft_s, rel=1e-12)
    steps = [cm.step_time_s([1] * batch, [prompt + j] * batch, batch) for j in range(1, gen)]
    assert np.allclose(steps, est.decode_step_times_s(), rtol=1e-12)


@pytest.mark.parametrize("name", sorted(STRUCTURES))
@pytest.mark.parametrize("kv", ["bf16", "fp8"])
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_one_sequence_reserves_the_cache_spec_in_whole_blocks(name, kv, block_size):
    """Driven as the scheduler drives it (a prompt, then one token a step), one sequence holds, at every context,
    KVCacheSpec's paged groups in whole blocks of `block_size` units plus its partial windows and overlaps at their
    largest (rate - 1 tokens, rate slots) in whole pages; that state is never below what the cache holds."""
    spec = read(STRUCTURES[name])
    cache = KVCacheSpec.from_model(spec, kv)
    pages = V4Pages.of(cache, block_size)
    buffers = [g for g in cache.groups if not g.paged]
    capacity = sum(g.bytes_per_token * (g.window - 1 if g.attention == "partial" else g.window) for g in buffers)
    assert pages.state_bytes == capacity and pages.state_pages == math.ceil(capacity / pages.page_bytes)
    for prompt in (1, 5, 40):
        kvm = V4BlockManager(10 ** 6, pages)
        assert kvm.allocate(0, prompt)
        for context in range(prompt, 300):
            if context > prompt:
                assert kvm.reserve(0, 1)
            paged = sum(g.paged_tokens(context, block_size) * g.bytes_per_token for g in cache.groups if g.paged)
            assert kvm.held(0) * pages.page_bytes == pytest.approx(paged + pages.state_pages * pages.page_bytes,
                                                                   rel=1e-12)
            assert sum(g.bytes_for_context(context) for g in buffers) <= pages.state_bytes
            used, reserved = kvm.slot_counts()
            assert reserved * pages.page_bytes / block_size == kvm.held(0) * pages.page_bytes
            assert used * pages.page_bytes / block_size == pytest.approx(cache.bytes_for_context(context), rel=1e-9)
        kvm.check_invariants()
        kvm.free(0)
        assert kvm.num_free_blocks == kvm.num_blocks
    for context in CONTEXTS:  # the page divides every group's block: nothing padded
        paged = cache.paged_bytes_for_context(context, block_size) - sum(g.bytes_for_context(context) for g in buffers)
        assert pages.kv_pages(context) * pages.page_bytes == pytest.approx(paged, rel=1e-12)


def test_the_default_shapes_pages():
    """At the class's default shape, fp8: pages of 8 KiB (16 units of a 43-layer window of 512 B); at 8,192 and
    131,072 tokens the paged groups are KVCacheSpec's paged bytes less its partial windows and overlap, the state
    3.24 MiB a sequence (rate - 1 partial tokens in every compressed layer, the csa overlaps)."""
    cache = KVCacheSpec.from_model(read({"model_type": "deepseek_v4"}), "fp8")
    pages = V4Pages.of(cache, 16)
    assert pages.page_bytes == 8192 and pages.groups[0] == ("window", 127, 1, 43)
    assert pages.state_bytes == 3_400_704 and pages.state_pages == 416
    for context in (8192, 131072):
        unpaged = sum(g.bytes_for_context(context) for g in cache.groups if not g.paged)
        assert pages.kv_pages(context) * 8192 == cache.paged_bytes_for_context(context, 16) - unpaged


def _estimate_and_plan(spec, hw: str, context: int, **par):  # noqa: ANN001, ANN202
    est = llmperf.estimate(spec, hw, batch=1, prompt_len=context - 8, gen_len=8, precision="fp8", **par)
    return est.summary(), plan_memory(ServingConfig.build(spec, hw, precision="fp8", **par))


@pytest.mark.parametrize("context", [64, 1000, 4097])
def test_the_pool_holds_estimates_max_batch_without_buffers(context):
    """Sliding layers only (no partial window, no overlap): the pool is estimate's free memory in whole pages and
    holds exactly estimate's max batch, on one GPU and over a dp-attention group (each GPU its own)."""
    spec = read(STRUCTURES["sliding-only"])
    for par in ({}, dict(tp=2, ep=2, dp_attention=True)):
        row, mem = _estimate_and_plan(spec, "h200", context, **par)
        free = mem.usable_bytes - (row["weights_gib"] + row["activation_peak_gib"]) * 2 ** 30
        assert mem.blocks_per_gpu == int(free // mem.block_bytes)
        assert mem.num_blocks // mem.blocks_for(context) == row["max_batch"]


@pytest.mark.parametrize("name", ["tiny", "default"])
def test_the_pool_holds_fewer_by_the_buffers_capacity(name):
    """With compressed layers the simulator reserves each sequence's partial windows at their largest: it holds
    what estimate's free memory holds at that reservation, GPU by GPU, at most estimate's max batch (which counts
    the partial windows a sequence holds at that context)."""
    spec = read({"model_type": "deepseek_v4"} if name == "default" else TINY)
    par = dict(tp=8, ep=8, dp_attention=True) if name == "default" else {}
    for context in (1000, 8192, 131072):
        row, mem = _estimate_and_plan(spec, "h200", context, **par)
        free = mem.usable_bytes - (row["weights_gib"] + row["activation_peak_gib"]) * 2 ** 30
        assert mem.blocks_per_gpu == int(free // mem.block_bytes)
        shards = mem.kv_shards
        fits = shards * int(free // (mem.blocks_for(context) * mem.block_bytes))
        # the replica's pages are counted as one pool (balanced over its GPUs): a GPU's remainders may add up
        assert mem.num_blocks // mem.blocks_for(context) in range(fits, fits + shards)
        assert fits <= row["max_batch"]


def test_a_mixed_run_with_preemption_completes():
    """Chunked prefill, staggered arrivals, a pool too small for all at once: every request finishes, the pool's
    reservation never exceeds it, and the pages go back at the end."""
    spec = read(TINY)
    cfg = ServingConfig.build(spec, "h200", num_blocks=3000, max_batched_tokens=64, block_size=4)
    rng = np.random.default_rng(0)
    n = 24
    work = Workload(arrival_s=np.sort(rng.uniform(0, 1e-4, n)), prompt_tokens=rng.integers(5, 200, n),
                    output_tokens=rng.integers(1, 40, n), shared_prefix_tokens=np.zeros(n, dtype=int))
    res = simulate(work, cfg)
    assert np.isfinite(res.requests["e2e_s"]).all()
    page = res.memory.block_bytes
    assert (res.steps["kv_reserved_bytes"] <= 3000 * page).all() and res.steps["kv_reserved_bytes"].max() > 0
    assert "DeepSeek-V4's window and compressed entries" in res.settings["kv_note"]


def test_what_is_not_simulated_is_refused_by_name():
    spec = read(TINY)
    with pytest.raises(SpecError, match="pp: DeepSeek-V4 is simulated on one pipeline stage"):
        ServingConfig.build(spec, "h200", pp=2)
    with pytest.raises(SpecError, match="speculative: speculative decoding is not simulated for DeepSeek-V4"):
        ServingConfig.build(spec, "h200", speculative=SpeculativeConfig(draft=read(TINY), num_draft_tokens=2,
                                                                                  acceptance=0.5))
    one = Workload(arrival_s=np.zeros(1), prompt_tokens=np.full(1, 9), output_tokens=np.full(1, 2),
                   shared_prefix_tokens=np.zeros(1, dtype=int))
    with pytest.raises(SpecError, match="tp: DeepSeek-V4's attention"):  # heads split: dp_attention only
        simulate(one, ServingConfig.build(spec, "h200", tp=2))


def test_simulate_and_plan_run_on_the_saved_default_config(tmp_path):
    """`llmperf simulate` and `plan` on transformers' save of DeepseekV4Config() (fp8, tp 8 with data-parallel
    attention, ep 8; a few requests) run and name their time model; plan's head-split layouts lose on layout."""
    transformers = pytest.importorskip("transformers")
    from typer.testing import CliRunner

    from llmperf.cli import app

    transformers.AutoConfig.for_model("deepseek_v4").save_pretrained(tmp_path)
    small = ["--requests", "12", "--prompt-len", "uniform:500:3000", "--output-len", "uniform:4:30"]
    res = CliRunner().invoke(app, ["simulate", str(tmp_path), "-H", "h200", "--tp", "8", "--ep", "8", "--dp-attention",
                                   "--dtype", "fp8", "--rate", "4", *small, "-f", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["settings"]["time_model"] == "typical" and doc["summary"]["requests"] == 12
    res = CliRunner().invoke(app, ["plan", str(tmp_path), "--rate", "2", "-H", "h200", "--precisions", "fp8", "--tp",
                                   "8", "--slo-ttft", "5", "--slo-tpot", "0.2", *small, "-f", "json"])
    assert res.exit_code == 0, res.output
    rows = {r["layout"]: r for r in json.loads(res.stdout)["rows"]}
    assert rows["dp+ep"]["feasible"] and rows["dp+ep"]["time_model"] == "typical"
    assert rows["tp"]["binding"] == rows["tp+ep"]["binding"] == "layout"


def test_data_parallel_attention_prices_the_busiest_gpus_share():
    """With dp attention over tp GPUs a step's attention is the busiest GPU's ceil(N / tp) sequences (a static
    batch: estimate's `local_batch`): a decode step of sequences at distinct contexts costs about what it costs
    with them all at one context, not every sequence on one GPU."""
    spec = read({"model_type": "deepseek_v4"})
    cm = StepCostModel(model=spec, hardware=load_hardware("h200"), precision=llmperf.estimate(
        spec, "h200", batch=8, prompt_len=100, gen_len=2, tp=8, ep=8, dp_attention=True).precision, tp=8,
        conventions=Conventions(ep=8, dp_attention=True))
    same = cm.v4_time_s(cm.v4_features(np.ones(64), np.full(64, 5000.0)))
    spread = cm.v4_time_s(cm.v4_features(np.ones(64), 5000.0 + np.arange(64)))
    assert spread == pytest.approx(same, rel=0.02)
