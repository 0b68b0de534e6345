"""Golden values from public numbers and hand-checked small cases."""

from __future__ import annotations

import math

import pytest

from llmperf.analysis import ForwardModel, attention_cost, estimate, op_time, weight_bytes_per_gpu
from llmperf.analysis.operators import attended_pairs, expected_experts_touched
from llmperf.analysis.roofline import OpCost
from llmperf.specs import Precision, load_hardware


def test_a100_ridge_point_is_153(a100):
    assert round(a100.ridge_point("fp16")) == 153
    assert round(load_hardware("a100-80gb-sxm").ridge_point("fp16")) == 153


def linear(batch: int, d_in: int, d_out: int, nbytes: int = 2) -> OpCost:
    return OpCost(name="linear", kind="matmul", flops=2 * batch * d_in * d_out,
                  weight_bytes=d_in * d_out * nbytes, act_read_bytes=batch * d_in * nbytes,
                  act_write_bytes=batch * d_out * nbytes)


def test_nvidia_linear_example():
    """NVIDIA's GPU performance guide: a 4096-out x 1024-in linear layer at fp16 has arithmetic
    intensity 315 FLOP/B at batch 512 and about 1 at batch 1."""
    assert round(linear(512, 1024, 4096).intensity) == 315
    assert linear(1, 1024, 4096).intensity == pytest.approx(1.0, abs=0.01)


def test_forward_model_linear_matches_hand_count(tiny_llama):
    fm = ForwardModel(model=tiny_llama, precision=Precision())
    q = fm.q_proj(3, 5, 5)
    assert q.flops == 2 * 15 * 64 * 64
    assert q.weight_bytes == 64 * 64 * 2
    assert q.act_read_bytes == 15 * 64 * 2 and q.act_write_bytes == 15 * 64 * 2
    k = fm.k_proj(3, 5, 5)  # GQA: 2 KV heads of 16
    assert k.flops == 2 * 15 * 64 * 32 and k.weight_bytes == 64 * 32 * 2


def test_roofline_time_is_max_of_roofs(a100):
    cost = linear(1, 4096, 4096)
    t = op_time(cost, a100, "fp16")
    assert t.compute_s == pytest.approx(cost.flops / 312e12)
    assert t.memory_s == pytest.approx(cost.bytes_total / 2039e9)
    assert t.time_s == t.memory_s and t.bound == "memory"
    big = linear(4096, 4096, 4096)
    assert op_time(big, a100, "fp16").bound == "compute"


def test_causal_pairs():
    assert attended_pairs(1, 100, True) == 100  # decode sees everything
    assert attended_pairs(100, 100, True) == 100 * 101 / 2  # prefill: the lower triangle
    assert attended_pairs(4, 10, True) == 7 + 8 + 9 + 10  # a chunk at the end of a longer cache
    assert attended_pairs(4, 10, False) == 40


def test_attention_naive_vs_fused_bytes():
    """FlashAttention's point: the fused kernel never writes the T x T matrices."""
    kw = dict(num_heads=32, num_kv_heads=32, head_dim=128, act_bytes=2, kv_bytes=2, causal=True)
    fused = attention_cost(1, 4096, 4096, impl="fused", **kw)
    naive = attention_cost(1, 4096, 4096, impl="naive", **kw)
    qkvo = 4 * 4096 * 32 * 128 * 2
    assert fused.bytes_total == qkvo
    # S written and read back, P written and read back: 4 x (H x T x T) elements
    assert naive.bytes_total == qkvo + 4 * 32 * 4096 * 4096 * 2
    # fused causal executes about half the square; naive computes it all
    assert fused.flops == pytest.approx(4 * 32 * 128 * 4096 * 4097 / 2)
    assert naive.flops > 2 * fused.flops * 0.99


def test_decode_attention_intensity_is_about_group_size():
    """Decode attention reads each K/V element once per KV head and uses it for g query heads."""
    for g in (1, 4, 8):
        c = attention_cost(1, 1, 8192, num_heads=32, num_kv_heads=32 // g, head_dim=128, impl="fused")
        assert c.intensity == pytest.approx(g, rel=0.02)


def test_llama2_7b_weights_and_kv(llama2_7b):
    assert llama2_7b.param_count == 6_738_415_616
    assert llama2_7b.kv_bytes_per_token("fp16") == 524_288  # 512 KiB
    assert 4096 * llama2_7b.kv_bytes_per_token("fp16") == 2 * 2**30  # 2 GiB at 4096 tokens
    assert weight_bytes_per_gpu(llama2_7b, Precision()) == 2 * 6_738_415_616
    # int4, groups of 128 with a 16-bit scale and a 4-bit zero each, embedding and lm_head at 16 bits:
    # per layer 202,375,168 matrix elements x 0.5 B + 1,581,056 groups x 2.5 B + 2 norms x 4096 x 2 B
    layer = 202_375_168 * 0.5 + 1_581_056 * 2.5 + 2 * 4096 * 2
    assert weight_bytes_per_gpu(llama2_7b, Precision(weights="int4")) == 32 * layer + 2 * 32000 * 4096 * 2 + 8192


def test_decode_batch1_is_memory_bound_near_one_flop_per_byte(llama2_7b, a100):
    est = estimate(llama2_7b, a100, batch=1, prompt_len=128, gen_len=16, precision="fp16")
    assert est.decode_first.bound == "memory"
    assert est.decode_first.intensity == pytest.approx(1.0, abs=0.05)
    # the step reads every weight once: time >= weights / bandwidth
    assert est.decode_first.time_s >= 2 * 6.5e9 / 2039e9
    assert est.prefill.bound == "memory"  # 128 tokens: ~120 FLOP/B, still under the ridge
    long = estimate(llama2_7b, a100, batch=1, prompt_len=1024, gen_len=2, precision="fp16")
    assert long.prefill.bound == "compute"
    # batching up to about the ridge point is nearly free for the linear layers
    assert 140 <= est.regimes.critical_batch_matmul <= 200


def test_13b_on_a100_40gb_budget():
    """Source article: a 13B model's fp16 weights take ~26 GB, about 65% of an A100-40GB."""
    from llmperf.specs import ModelSpec
    m = ModelSpec(name="llama-2-13b-code", vocab_size=32000, hidden_size=5120, num_layers=40, num_heads=40,
                  ffn_size=13824, max_positions=4096)
    assert m.param_count == 13_015_864_320
    assert weight_bytes_per_gpu(m, Precision()) / 1e9 == pytest.approx(26.0, abs=0.1)


def test_moe_touched_experts():
    assert expected_experts_touched(1, 8, 2) == pytest.approx(2.0)
    assert expected_experts_touched(1000, 8, 2) == pytest.approx(8.0)
    assert 2 < expected_experts_touched(4, 8, 2) < 8


def test_tensor_parallel_halves_weights_and_adds_allreduces(llama2_7b, a100):
    one = estimate(llama2_7b, a100, batch=1, prompt_len=64, gen_len=8, precision="fp16")
    two = estimate(llama2_7b, a100, batch=1, prompt_len=64, gen_len=8, precision="fp16", tp=2)
    assert two.memory.weights_bytes < 0.51 * one.memory.weights_bytes
    names = [o.cost.name for o in two.decode_first.ops]
    assert "attn_allreduce" in names and "mlp_allreduce" in names
    ar = two.decode_first.op("attn_allreduce").cost
    # ring all-reduce of 1 token x 4096 fp16 values over 2 GPUs: 2 (t-1)/t x message, every layer
    assert ar.comm_bytes == pytest.approx(32 * 2 * 0.5 * 4096 * 2)
    assert two.tpot_s < one.tpot_s


def test_pipeline_parallel_splits_layers(llama2_7b, a100):
    one = estimate(llama2_7b, a100, batch=1, prompt_len=64, gen_len=8, precision="fp16")
    four = estimate(llama2_7b, a100, batch=1, prompt_len=64, gen_len=8, precision="fp16", pp=4)
    assert four.memory.weights_bytes < 0.3 * one.memory.weights_bytes
    assert four.tpot_s > one.tpot_s  # latency: stages run one after another, plus transfers


def test_generation_rollup_consistency(llama2_7b, a100):
    est = estimate(llama2_7b, a100, batch=4, prompt_len=100, gen_len=50, precision="fp16")
    steps = est.decode_step_times_s()
    assert len(steps) == 49
    assert steps.sum() == pytest.approx(est.decode_total_s, rel=1e-9)
    assert est.e2e_s == pytest.approx(est.ttft_s + steps.sum())
    assert est.tokens_per_s == pytest.approx(4 * 50 / est.e2e_s)
    assert steps[0] == pytest.approx(est.decode_first.time_s)
    assert steps[-1] == pytest.approx(est.decode_last.time_s)
    assert all(steps[1:] >= steps[:-1])  # context grows, so does the step


def test_paged_kv_utilisation_beats_contiguous(llama2_7b, a100):
    est = estimate(llama2_7b, a100, batch=1, prompt_len=100, gen_len=100, precision="fp16",
                   max_seq_len=4096, block_size=16)
    assert est.memory.kv.contiguous_utilization == pytest.approx((100 + 50.5) / 4096)
    assert est.memory.kv.paged_utilization > 0.9
    assert est.memory.max_batch > est.memory.max_batch_contiguous


def test_fp8_falls_back_to_fp16_compute_on_a100(llama2_7b, a100):
    est = estimate(llama2_7b, a100, precision="fp8", prompt_len=64, gen_len=4)
    assert est.prefill.compute_dtype == "fp16"
    h100 = load_hardware("a100-80gb-sxm")
    assert h100.compute_dtype("int8") == "int8"
    assert math.isclose(est.memory.kv_bytes_per_token, llama2_7b.kv_bytes_per_token("fp8"))


def test_result_objects_convert_to_frames(llama2_7b, a100):
    est = estimate(llama2_7b, a100, batch=2, prompt_len=64, gen_len=8, precision="fp16")
    assert len(est.to_frame()) == 1 and len(est.memory.to_frame()) == 1 and len(est.regimes.to_frame()) == 1
    layer = est.prefill.layer_frame()
    assert "embed" not in set(layer["op"]) and "qkv_proj" in set(layer["op"])  # fused by default
    assert layer["time_s"].sum() == pytest.approx(est.prefill.layer_time_s)
    assert layer["time_share"].sum() == pytest.approx(1.0)
    ops = est.ops_frame()
    assert set(ops["phase"]) == {"prefill", "decode"}
    assert ops[ops.phase == "prefill"]["time_s"].sum() == pytest.approx(est.ttft_s)


def qwen15_moe_a27b():
    """Qwen1.5-MoE-A2.7B (config.json: hidden 2048, 24 layers, 16 heads, 60 routed experts of 1408,
    4 per token, one shared expert of 5632 = 4 x 1408, qkv biases). The model card: 14.3B parameters,
    2.7B activated. The shared expert is four always-active experts of 1408 (the same matrices, FLOPs
    and bytes); its one-output sigmoid gate (2048 weights a layer) is not modelled."""
    from llmperf.specs import ModelSpec
    return ModelSpec(name="qwen1.5-moe-a2.7b-code", vocab_size=151936, hidden_size=2048, num_layers=24,
                     num_heads=16, ffn_size=1408, num_experts=60, experts_per_token=4, shared_experts=4,
                     qkv_bias=True, max_positions=8192, rope_theta=1e6, norm_eps=1e-6)


def test_moe_with_shared_experts_costs_two_flops_per_active_parameter():
    """A token runs through its 4 routed experts and the shared ones: one token's matrix FLOPs are 2 per
    active matrix parameter (plus one add per bias), and a decode step at batch 1 reads the weights
    of exactly those 8 experts of 2048 x 1408 per matrix."""
    m = qwen15_moe_a27b()
    assert round(m.param_count / 1e9, 1) == 14.3 and round(m.active_param_count / 1e9, 1) == 2.7
    fm = ForwardModel(model=m, precision=Precision(), all_logits=True)
    matmul = sum(o.flops for o in fm.forward_ops(1, 1, 1) if o.kind == "matmul")
    biases = m.num_layers * (m.q_size + 2 * m.kv_size)
    not_matrices = m.embedding_params + (2 * m.num_layers + 1) * m.norm_params + biases
    assert matmul == 2 * (m.active_param_count - not_matrices) + biases
    layer = {o.name: o for o in fm.layer_ops(1, 1, 1)}
    for name in ("gate_proj", "up_proj", "down_proj"):  # the 4 routed experts, and the shared ones (4 x 1408)
        for op in (layer[name], layer["shared_" + name]):
            assert op.flops == 4 * 2 * 2048 * 1408
            assert op.weight_bytes == pytest.approx(4 * 2048 * 1408 * 2, rel=1e-12)
    # a large batch touches every routed expert; the shared ones are read once whatever the batch
    assert fm.gate_proj(64, 256, 256).weight_bytes == pytest.approx(60 * 2048 * 1408 * 2, rel=1e-12)
    big = {o.name: o for o in fm.layer_ops(64, 256, 256)}
    assert big["shared_gate_proj"].weight_bytes == pytest.approx(4 * 2048 * 1408 * 2, rel=1e-12)
