"""Gated DeltaNet hybrids (Qwen3-Next, Qwen3.5) in the analytical model: matrix FLOPs exactly
`torch.utils.flop_counter`'s on transformers' own model (its chunked delta rule included), every weight
read once at batch 1, the state read and written once a sequence and step (and not read by a fresh
prefill), tensor parallelism over the linear heads, and memory that holds each sequence's constant state
beside its KV."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from typer.testing import CliRunner

from llmperf.analysis import ForwardModel
from llmperf.analysis.memory import estimate_memory
from llmperf.analysis.operators import DELTANET_CHUNK, DELTANET_GATE_FLOPS, NORM_FLOPS
from llmperf.errors import SpecError
from llmperf.specs import HardwareSpec, KVCacheSpec, Precision
from llmperf.specs.hf import model_spec_from_hf_config

CFG = dict(model_type="qwen3_next", vocab_size=320, hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
           head_dim=32, max_position_embeddings=512, linear_num_key_heads=2, linear_num_value_heads=4,
           linear_key_head_dim=32, linear_value_head_dim=16, linear_conv_kernel_dim=4, num_hidden_layers=4,
           intermediate_size=192, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
           shared_expert_intermediate_size=96, decoder_sparse_step=2)
SPEC = model_spec_from_hf_config(CFG, name="tiny-qwen3-next")
DENSE = model_spec_from_hf_config({**CFG, "model_type": "qwen3_5_text", "torch_dtype": "bfloat16"}, name="tiny-q35")
BF16 = Precision.uniform("bf16")


def _linear_layers(spec) -> int:  # noqa: ANN001
    return spec.layer_types.count("linear")


@pytest.mark.parametrize("batch,seq", [(2, 21), (1, 70)])
def test_matrix_flops_match_the_flop_counter(batch, seq):
    """transformers' chunked delta rule (padded to blocks of 64) counts as `deltanet` does, less what the
    counter does not see: the two triangular solves (C^2 (dk + dv) a block and head), the gates and the q/k
    L2 norms; the counter sees the causal convolution, which llmperf counts as elementwise work."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from torch.utils.flop_counter import FlopCounterMode

    config = transformers.AutoConfig.for_model(**CFG)
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    logging.disable(logging.WARNING)
    try:
        model = transformers.AutoModelForCausalLM.from_config(config).eval()
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(torch.randint(0, 320, (batch, seq)))
    finally:
        logging.disable(logging.NOTSET)
    counts = {str(k): v for k, v in counter.get_flop_counts()["Global"].items()}
    fm = ForwardModel(model=SPEC, precision=Precision(), attention="naive", all_logits=True, attention_flops="dense")
    analytical = sum(o.flops for o in fm.forward_ops(batch, seq, seq) if o.kind in ("matmul", "attention"))
    L, nv, dk, dv = _linear_layers(SPEC), 4, 32, 16
    blocks, c, tokens = -(-seq // DELTANET_CHUNK), DELTANET_CHUNK, batch * seq
    unseen = L * (batch * nv * blocks * c * c * (dk + dv) + tokens * nv * DELTANET_GATE_FLOPS
                  + tokens * 2 * 2 * dk * NORM_FLOPS["l2"])
    assert counter.get_total_flops() - counts["aten.convolution"] == analytical - unseen


def test_every_weight_is_read_once_at_batch_one():
    """A dense Qwen3.5-like decode step at batch 1 reads every parameter but the embedding table once
    (the gated q_proj, the convolution, A_log and dt_bias, the gated norm's weight included)."""
    fm = ForwardModel(model=DENSE, precision=BF16, fused_qkv=True, fused_gate_up=True)
    ops = fm.forward_ops(1, 1, 100)
    read = sum(o.weight_bytes for o in ops if o.name != "embed")
    assert read == pytest.approx(2 * (DENSE.param_count - DENSE.vocab_size * DENSE.hidden_size), rel=1e-12)


def test_state_read_and_written_once_a_sequence():
    fm = ForwardModel(model=SPEC, precision=BF16)
    state = 4 * 32 * 16 * 2  # value heads x dk x dv at the activations' bf16 (no state_dtype)
    conv = 3 * (2 * 2 * 32 + 4 * 16) * 2  # K - 1 inputs of every channel
    decode = {o.name: o for o in fm.linear_ops(8, 1, 500)}
    assert decode["deltanet"].kv_read_bytes == decode["deltanet"].kv_write_bytes == 8 * state
    assert decode["conv1d"].kv_read_bytes == decode["conv1d"].kv_write_bytes == 8 * conv
    fresh = {o.name: o for o in fm.linear_ops(8, 300, 300)}  # a whole prompt: no state to read
    assert fresh["deltanet"].kv_read_bytes == 0 and fresh["deltanet"].kv_write_bytes == 8 * state
    chunk = {o.name: o for o in fm.linear_ops(8, 300, 600)}  # a second chunk continues the state
    assert chunk["deltanet"].kv_read_bytes == 8 * state
    fp32 = ForwardModel(model=SPEC.scaled(state_dtype="fp32"), precision=BF16)
    assert {o.name: o for o in fp32.linear_ops(8, 1, 500)}["deltanet"].kv_write_bytes == 16 * state
    # arrays of configurations give the same counts row by row
    many = {o.name: o for o in fm.linear_ops(np.array([8.0, 8.0]), np.array([1.0, 300.0]), np.array([500.0, 300.0]))}
    assert many["deltanet"].kv_read_bytes.tolist() == [8 * state, 0.0]
    assert many["deltanet"].flops.tolist() == [decode["deltanet"].flops, fresh["deltanet"].flops]


def test_the_full_layers_gate_their_output():
    fm = ForwardModel(model=SPEC, precision=BF16)
    full = next(k for k, _ in SPEC.layer_groups() if k.attention == "full")
    names = [o.name for o in fm.layer_ops(1, 4, 4, full)]
    assert names.index("attn_gate") == names.index("o_proj") - 1
    assert fm.q_proj(1, 1, 1).flops == 2 * 128 * (2 * 4 * 32)
    assert fm.o_proj(1, 1, 1).flops == 2 * 128 * 128  # the attention's, not a linear layer's out_proj


def test_tensor_parallel_splits_the_linear_heads():
    one, two = (ForwardModel(model=SPEC, precision=BF16, tp=t) for t in (1, 2))
    for name in ("in_proj_qkvz", "in_proj_ba", "deltanet", "conv1d", "gated_norm"):
        a, b = getattr(one, name)(4, 1, 50), getattr(two, name)(4, 1, 50)
        assert b.flops == pytest.approx(a.flops / 2) and b.kv_write_bytes == pytest.approx(a.kv_write_bytes / 2)
    assert SPEC.kv_cache("bf16").sharded(tp=2).state_bytes == SPEC.kv_cache("bf16").state_bytes / 2
    with pytest.raises(SpecError, match="tp: 4 does not divide tiny-qwen3-next's linear_num_key_heads=2"):
        ForwardModel(model=SPEC, precision=BF16, tp=4)


def test_kv_cache_keeps_state_apart_from_the_kv_groups():
    kv = SPEC.kv_cache("bf16")
    assert [g.attention for g in kv.groups] == ["full"] and kv.kv_layers == 1 and kv.linear_layers == 3
    per_layer = 4 * 32 * 16 * 2 + 3 * 192 * 2
    assert kv.state_bytes == 3 * per_layer and kv.bytes_per_token == 2 * 2 * 32 * 2
    assert kv.bytes_for_context(1000) == 1000 * kv.bytes_per_token  # the KV alone; the state is per sequence
    assert SPEC.kv_cache("fp8").state_bytes == kv.state_bytes  # fp8 KV does not quantise the state
    with pytest.raises(SpecError, match="state_bytes_per_layer must be a finite number, > 0 when some layer is"):
        KVCacheSpec(num_layers=2, num_kv_heads=1, head_dim=8, element_bytes=2, layer_types=("linear", "full"))
    # a pipeline stage of full layers only holds no state
    assert kv.layers(3, 4).state_bytes == 0 and kv.layers(0, 3).state_bytes == kv.state_bytes
    pp4 = SPEC.scaled(num_layers=8, layer_types=("linear",) * 6 + ("full",) * 2)
    from llmperf.analysis.rollup import Conventions, memory_arrays
    mem = memory_arrays(pp4, BF16, HardwareSpec(name="dev", peak_tflops={"fp32": 60, "bf16": 990},
                                                 memory_bandwidth_gbps=3350, memory_gib=80.0),
                        Conventions(), tp=1, pp=4, batch=[1], prompt_len=[100], gen_len=[10])
    assert mem["max_batch"][0] > 0


def test_max_batch_counts_each_sequence_state():
    """Memory = weights + batch x (paged KV + state) + activations: the largest batch, by hand."""
    hw = HardwareSpec(name="dev", peak_tflops={"fp32": 60, "bf16": 990}, memory_bandwidth_gbps=3350,
                      memory_gib=1.0)
    mem = estimate_memory(SPEC, BF16, hw, batch=4, prompt_len=1000, gen_len=24, mem_util=0.9)
    kv = SPEC.kv_cache(BF16)
    per_seq = kv.bytes_per_token * 1024 + kv.state_bytes  # 1,024 tokens: 64 whole blocks of 16
    free = 0.9 * 2**30 - mem.weights_bytes - mem.activation_peak_bytes
    assert mem.max_batch == int(free // per_seq)
    assert mem.kv_cache_bytes == pytest.approx(4 * per_seq)


def test_estimate_reads_a_qwen3_next_config(tmp_path):
    from llmperf.cli import app

    (tmp_path / "config.json").write_text(json.dumps({**CFG, "torch_dtype": "bfloat16"}))
    out = CliRunner().invoke(app, ["estimate", str(tmp_path), "-H", "h100-sxm", "-b", "4", "-p", "256", "-g", "16",
                                   "--format", "json"])
    assert out.exit_code == 0, out.output
    row = json.loads(out.output)["configurations"][0]
    assert row["params_total"] == SPEC.param_count and row["ttft_s"] > row["ttft_bound_s"] > 0
    text = CliRunner().invoke(app, ["estimate", str(tmp_path), "-H", "h100-sxm", "-b", "4", "-p", "256", "-g", "16"],
                              env={"COLUMNS": "160"})
    assert "Gated DeltaNet state" in text.output
