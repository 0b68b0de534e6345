"""The serving simulator on Gated DeltaNet hybrids (Qwen3-Next): linear layers hold no KV blocks but a
constant state per sequence, paged as pool blocks from admission to its end; the pool's capacity at a
context agrees with `estimate`'s max batch; `conv1d` and `deltanet` are priced per step from the
sequences (state read when a sequence continues, chunked or recurrent), so a static batch's steps are
`estimate`'s; `simulate` and `plan` run end to end, and `--streaming` is refused."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

import llmperf
from llmperf.analysis.rollup import Conventions
from llmperf.analysis.timemodel import time_model_for
from llmperf.cli import app
from llmperf.serving.blocks import BlockManager, HybridLayout, WindowedBlockManager, WindowGroup
from llmperf.serving.costmodel import StepCostModel, state_features
from llmperf.serving.simulator import ServingConfig, plan_memory, simulate
from llmperf.serving.workload import Workload
from llmperf.specs import load_hardware
from llmperf.specs.hf import model_spec_from_hf_config
from llmperf.specs.kvcache import KVCacheSpec
from tests.analysis.model_checks import assert_simulated_static_batch_is_estimate

# Qwen3-Next-80B-A3B's shape (transformers' Qwen3NextConfig defaults): 36 linear layers, 12 full
QWEN3_NEXT = dict(
    model_type="qwen3_next", architectures=["Qwen3NextForCausalLM"], torch_dtype="bfloat16", vocab_size=151936,
    hidden_size=2048, intermediate_size=5632, num_hidden_layers=48, num_attention_heads=16, num_key_value_heads=2,
    head_dim=256, hidden_act="silu", max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=False,
    attention_bias=False, linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
    linear_num_key_heads=16, linear_num_value_heads=32, decoder_sparse_step=1, moe_intermediate_size=512,
    shared_expert_intermediate_size=512, num_experts_per_tok=10, num_experts=512, norm_topk_prob=True,
    mlp_only_layers=[], layer_types=(["linear_attention"] * 3 + ["full_attention"]) * 12)


def _model(**kw):
    return model_spec_from_hf_config(dict(QWEN3_NEXT, **kw), name="qwen3-next-80b")


def _small():  # 8 layers (6 linear, 2 full), 16 experts: fast to price
    return _model(num_hidden_layers=8, num_experts=16, layer_types=QWEN3_NEXT["layer_types"][:8])


def _workload(n, prompt, out):
    return Workload(arrival_s=np.zeros(n), prompt_tokens=np.full(n, prompt), output_tokens=np.full(n, out),
                    shared_prefix_tokens=np.zeros(n, dtype=int))


# ---- the pool ----------------------------------------------------------------------------------------

def test_hybrid_layout_ignores_linear_layers():
    assert HybridLayout.of([("linear", None), ("linear", None), ("full", None)]) is None
    lay = HybridLayout.of([("linear", None), ("full", None), ("sliding", 8), ("linear", None), ("full", None)])
    assert lay.full == (1, 4) and lay.members == ((2,),) and lay.num_layers == 3
    assert [(g.attention, g.window, g.layers, g.full_layers) for g in lay.groups] == [("sliding", 8, 1, 2)]


@pytest.mark.parametrize("windowed", [False, True])
def test_a_sequence_holds_its_state_blocks_from_allocate_to_free(windowed):
    kw = dict(state_blocks=5)
    kv = (WindowedBlockManager(60, 4, groups=[WindowGroup("sliding", 4, 1, 1)], **kw) if windowed
          else BlockManager(60, 4, **kw))
    assert kv.blocks_for(10) == (3 if not windowed else kv.blocks_for(10) - 5) + 5
    assert kv.allocate(0, 10, prefix=list(range(10)))
    held = kv.num_used_blocks
    assert held >= 3 + 5
    kv.publish(0, list(range(10)), 10)
    assert kv.cached_prefix(list(range(10)), 9) == 0  # a state is no prefix's: nothing is shared
    assert kv.reserve(0, 1)
    before = kv.num_used_blocks
    kv.fork(0, 1)  # the child's own copy of the state; the rest shared
    assert kv.num_used_blocks == before + 5
    kv.check_invariants()
    kv.free(0)
    kv.free(1)
    kv.check_invariants()
    assert kv.num_used_blocks == 0
    full = BlockManager(12, 4, state_blocks=5)
    assert not full.allocate(0, 29) and full.allocate(0, 28) and full.num_free_blocks == 0  # 7 + 5 blocks


def test_the_memory_plan_pages_the_state_beside_the_full_layers_kv():
    m = _model()
    mem = plan_memory(ServingConfig.build(m, "h200", tp=2))
    kv = KVCacheSpec.from_model(m, mem_prec := llmperf.specs.Precision.uniform("bf16")).sharded(tp=2)
    assert mem.kv_bytes_per_token == kv.bytes_per_token == 12 * 256 * 2 * 2  # the 12 full layers, one KV head
    assert mem.state_bytes == kv.state_bytes == 36 * (32 * 128 * 128 + 3 * (2 * 16 * 128 + 32 * 128)) * 2 / 2
    assert mem.state_blocks == math.ceil(mem.state_bytes / mem.block_bytes) == 101
    assert not mem.window_groups and not mem.kv_sliding_full_pages and mem_prec.kv == "bf16"
    assert mem.blocks_for(2048) == 128 + 101


@pytest.mark.parametrize("tp, precision, est_batch, sim_batch", [(1, "fp8", 846, 846), (2, "bf16", 1237, 1235)])
def test_the_pools_sequences_at_2k_context_are_estimates_max_batch(tp, precision, est_batch, sim_batch):
    """Qwen3-Next-80B on one H200 (fp8) and two (bf16) at a 2,048-token context: the sequences the
    simulator's pool holds (KV blocks and each one's state blocks) and `estimate`'s max batch (exact
    bytes) agree within the state's padding to whole blocks (under a block a sequence)."""
    m = _model()
    est = llmperf.estimate(m, "h200", batch=1, prompt_len=2047, gen_len=1, tp=tp, precision=precision)
    mem = plan_memory(ServingConfig.build(m, "h200", tp=tp, precision=precision))
    fits = mem.num_blocks // mem.blocks_for(2048)
    assert (est.memory.max_batch, fits) == (est_batch, sim_batch)
    per_seq = mem.blocks_for(2048)
    assert 0 <= est.memory.max_batch - fits <= math.ceil(est.memory.max_batch / per_seq) + 1
    # and the manager admits exactly that many
    kv = mem.manager()
    n = 0
    while kv.allocate(n, 2048):
        n += 1
    assert n == fits


def test_admission_and_the_reported_kv_count_the_state():
    """A pool of three sequences' blocks (KV and state) runs at most three at once; the KV reported
    reserved includes their state blocks."""
    m = _small()
    cfg0 = ServingConfig.build(m, "h200", num_blocks=100, watermark=0.0, efficiency="roofline")
    mem0 = plan_memory(cfg0)
    per = mem0.blocks_for(300)
    # three sequences' blocks and the scheduler's headroom (a block a running sequence, to grow)
    cfg = ServingConfig.build(m, "h200", num_blocks=3 * per + 3, watermark=0.0, efficiency="roofline")
    res = simulate(_workload(8, 290, 10), cfg)
    assert res.steps["batch"].max() == 3 and res.settings["state_blocks"] == mem0.state_blocks > 0
    st = res.steps[res.steps["batch"] == 3]
    assert (st["kv_reserved_bytes"] >= 3 * mem0.state_blocks * mem0.block_bytes).all()
    assert res.summary()["requests"] == 8


# ---- pricing -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("tp, eff, batch, prompt", [(1, "roofline", 4, 200), (2, "typical", 3, 40),
                                                    (2, "roofline", 8, 64), (4, "typical", 5, 129)])
def test_a_static_batch_is_priced_as_estimate(tp, eff, batch, prompt):
    m, hw = _model(), load_hardware("h200")
    tm = None if eff == "roofline" else time_model_for(hw, eff, "bf16")
    est = llmperf.estimate(m, hw, batch=batch, prompt_len=prompt, gen_len=6, tp=tp, time_model=tm)
    cm = StepCostModel(model=est.model, hardware=hw, precision=est.precision, tp=tp, time_model=tm,
                       conventions=Conventions())
    assert cm.step_time_s([prompt] * batch, [prompt] * batch, batch) == pytest.approx(est.ttft_s, rel=1e-9)
    steps = [cm.step_time_s([1] * batch, [prompt + j] * batch, batch) for j in range(1, 6)]
    assert np.allclose(steps, est.decode_step_times_s(), rtol=1e-9)


def _state_counts(cm, q, kv):
    f = cm.features(q, kv)[len(cm.groups):].reshape(-1)[:6]
    return [p.coef @ f * p.layers for p in cm.state_parts]


def test_a_mixed_step_is_the_sum_of_its_sequences_and_a_continued_chunk_reads_the_state():
    m = _model()
    cm = StepCostModel(model=m, hardware=load_hardware("h200"), precision=llmperf.specs.Precision.uniform("bf16"),
                       tp=2, conventions=Conventions())
    assert [p.ref.name for p in cm.state_parts] == ["conv1d", "deltanet"] and not cm.simple
    q, kv = [1, 1, 1, 256, 100], [500, 900, 3000, 512, 100]  # three decodes, a second chunk, a first chunk
    fields = ("flops", "weight_bytes", "act_read_bytes", "act_write_bytes", "kv_read_bytes", "kv_write_bytes")
    mixed = _state_counts(cm, q, kv)
    for i, name in enumerate(("conv1d", "deltanet")):
        ops = [getattr(cm.fm, name)(1.0, a, b) for a, b in zip(q, kv)]
        for j, f in enumerate(fields):
            expect = sum(getattr(op, f) for op in ops) if f != "weight_bytes" else 0.0  # weights: once a step
            assert mixed[i][j] == pytest.approx(36 * expect, rel=1e-9, abs=1e-3)
    state = KVCacheSpec.from_model(m, cm.precision).sharded(tp=2)
    dn = [p for p in cm.state_parts if p.ref.name == "deltanet"][0]
    read = fields.index("kv_read_bytes")
    first, second = _state_counts(cm, [256], [256]), _state_counts(cm, [256], [512])
    recurrent = 36 * 32 // 2 * 128 * 128 * 2  # the recurrent state (bf16), this GPU's heads, every linear layer
    assert first[1][read] == pytest.approx(0, abs=1e-3) and second[1][read] == pytest.approx(recurrent, rel=1e-9)
    assert first[0][read] == pytest.approx(0, abs=1e-3)
    assert second[0][read] + second[1][read] == pytest.approx(36 * state.state_bytes_per_layer, rel=1e-9)
    assert dn.layers == 36
    # the chunk is priced by its state read: a continued chunk costs more than a first one
    assert cm.step_time_s([256], [512], 1) > cm.step_time_s([256], [256], 1)
    assert np.array_equal(state_features([1, 70], [5, 70]), [[2, 71, 1, 1], [70 * 64, 2, 0, 0]])


@pytest.mark.parametrize("eff, tp", [("roofline", 1), ("typical", 2), ("typical", 1)])
def test_the_state_time_from_cached_rates_is_op_times(eff, tp):
    """`state_time_s` reads each part's rates once per rows; its time equals `op_time` of the step's cost."""
    from dataclasses import replace

    from llmperf.analysis import op_time
    hw = load_hardware("h100-sxm")
    tm = None if eff == "roofline" else time_model_for(hw, eff, "bf16")
    cm = StepCostModel(model=_small(), hardware=hw, precision=llmperf.specs.Precision.uniform("bf16"), tp=tp,
                       time_model=tm, conventions=Conventions())
    fields = ("flops", "weight_bytes", "act_read_bytes", "act_write_bytes", "kv_read_bytes", "kv_write_bytes",
              "comm_bytes")
    for q, kv in (([1], [9]), ([1] * 3 + [256], [500, 900, 3000, 512]), ([100, 7], [100, 7]), ([1] * 64, [4000] * 64)):
        F = cm.features(q, kv)
        f = F[len(cm.groups):].reshape(-1)[:6]
        expect = 0.0
        for p in cm.state_parts:
            counts = dict(zip(fields, (float(x) for x in p.coef @ f)), weight_bytes=p.weight_bytes)
            cost = replace(p.ref, rows=float(f[1]), **counts).scaled(p.layers)
            expect += float(op_time(cost, hw, "bf16", tm).time_s)
        assert cm.state_time_s(F) == pytest.approx(expect, rel=1e-12)
        assert cm.state_time_s(F) == cm.state_time_s(F)  # the second read comes from the cache


def test_the_simulators_own_sums_price_a_static_batch_and_chunks_as_estimate():
    m = _small()
    cfg = assert_simulated_static_batch_is_estimate(m)  # every decode step as estimate's
    # one request's prompt in chunks of 64: each chunk after the first reads the state
    chunked = ServingConfig.build(m, "h200", tp=2, max_batched_tokens=64, num_blocks=4000, efficiency="roofline")
    res = simulate(_workload(1, 150, 2), chunked)
    cm = StepCostModel(model=m, hardware=cfg.hardware, precision=cfg.precision, tp=2, conventions=cfg.conventions())
    expect = sum(cm.step_time_s([q], [kv], int(kv == 150)) for q, kv in ((64, 64), (64, 128), (22, 150)))
    assert res.requests["ttft_s"].iloc[0] == pytest.approx(expect, rel=1e-9)


# ---- the command line --------------------------------------------------------------------------------

def _config_dir(tmp_path):
    d = tmp_path / "qwen3-next"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(QWEN3_NEXT))
    return d


def test_simulate_runs_and_streaming_is_refused(tmp_path):
    runner, d = CliRunner(), _config_dir(tmp_path)
    res = runner.invoke(app, ["simulate", str(d), "-H", "h200", "--tp", "2", "--requests", "30", "--rate", "5",
                              "--prompt-len", "uniform:50:300", "--output-len", "uniform:5:30", "-f", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["summary"]["requests"] == 30 and "Gated DeltaNet" in doc["settings"]["kv_note"]
    bad = runner.invoke(app, ["simulate", str(d), "-H", "h200", "--tp", "2", "--requests", "5",
                              "--streaming", "4:1000"])
    assert bad.exit_code == 2 and "--streaming" in bad.output and "Gated DeltaNet" in bad.output
    assert "Traceback" not in bad.output


def test_plan_runs(tmp_path):
    res = CliRunner().invoke(app, ["plan", str(_config_dir(tmp_path)), "--rate", "4", "-H", "h200", "--precisions",
                                   "bf16", "--tp", "2", "--slo-ttft", "0.5", "--slo-tpot", "0.05", "--requests", "30",
                                   "--prompt-len", "uniform:100:400", "--output-len", "uniform:10:60", "-f", "json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["rows"]
    assert any(r["feasible"] for r in rows)
