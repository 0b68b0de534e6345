"""The one roll-up (issue 7): the memory rule, sliding windows, fused projections, group scales,
pipeline stages, the time-model hook, and a single estimate equal to its sweep row. Every golden
value is computed by hand in the comment beside it."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmperf.analysis import (
    Efficiency,
    ForwardModel,
    attention_cost,
    bound_label,
    estimate,
    kv_utilization,
    op_time,
    sweep,
    weight_bytes_per_gpu,
)
from llmperf.analysis.memory import estimate_memory, kv_bytes_per_token_per_gpu, max_batch_that_fits
from llmperf.analysis.operators import attended_pairs
from llmperf.analysis.rollup import stage_layers, stage_weight_bytes, sum_max_lines
from llmperf.analysis.schema import COLUMNS, to_json
from llmperf.errors import SpecError
from llmperf.specs import ModelSpec, Precision, load_hardware, load_model
from llmperf.specs.quantization import QuantizationSpec

GIB = 2**30


# ---- the memory rule -------------------------------------------------------------------------------
def test_max_batch_is_what_kv_memory_holds_after_one_activation_reservation():
    """Llama-3.1-8B (bf16) on an A100-80GB, prompt 512 + 128 generated, vLLM defaults.
    usable = 0.9 x 80 GiB = 77,309,411,328 B; weights = 8,030,261,248 x 2 = 16,060,522,496 B.
    Activations, one forward of 8192 tokens: residual + normed copy 2*8192*4096*2 = 134,217,728,
    the FFN (larger than attention) 8192*14336*2*3 = 704,643,072, fp32 logits of one row
    128,256*4 = 513,024: 839,373,824 B. KV per sequence: 640 tokens (40 blocks of 16) x 131,072 B =
    83,886,080 B. Max batch = floor((77,309,411,328 - 16,060,522,496 - 839,373,824) / 83,886,080) = 720
    (the KV memory alone would hold 730; charging each sequence its own prefill peak gave 447)."""
    est = estimate("llama-3.1-8b", "a100-80gb-sxm", batch=1, prompt_len=512, gen_len=128)
    assert est.memory.activation_peak_bytes == 839_373_824
    assert est.memory.weights_bytes == 16_060_522_496
    assert est.memory.max_batch == 720
    assert math.floor((0.9 * 80 * GIB - 16_060_522_496) / 83_886_080) == 730
    # the reservation does not grow with the batch: 700 sequences fit, 721 do not
    assert estimate("llama-3.1-8b", batch=700).memory.fits
    big = estimate("llama-3.1-8b", batch=721)
    assert not big.memory.fits and big.memory.activation_peak_bytes == 839_373_824
    # a smaller token budget reserves less and leaves room for more sequences
    assert estimate("llama-3.1-8b", max_batched_tokens=2048).memory.max_batch > 720


def test_paged_block_rounding_and_utilisation_are_exact(llama2_7b, a100):
    """prompt 100, gen 28, blocks of 16: lengths 101..128 during the generation; paged tokens
    ceil(L/16)*16 -> 112 (L <= 112) or 128; the final 128 tokens are 8 whole blocks."""
    est = estimate(llama2_7b, a100, batch=3, prompt_len=100, gen_len=28, block_size=16, max_seq_len=4096)
    lengths = np.arange(101, 129)
    paged = np.ceil(lengths / 16) * 16
    assert est.memory.kv.paged_utilization == pytest.approx(lengths.mean() / paged.mean(), rel=1e-12)
    assert est.memory.kv.contiguous_utilization == pytest.approx(lengths.mean() / 4096, rel=1e-12)
    assert est.memory.kv_cache_bytes == 3 * 128 * 524_288
    # 130 final tokens round up to 144 (9 blocks)
    assert estimate(llama2_7b, a100, prompt_len=100, gen_len=30).memory.kv_cache_bytes == 144 * 524_288


def test_max_batch_that_fits_is_floored_not_rounded():
    """Llama-2-7B at fp16 on a 24 GiB card, 4096-token sequences (2 GiB of KV each): the 12.2 GB left
    after 13.5 GB of weights hold 5.72 sequences, so 5 fit, not 6. At an exact fit of 5 all 5 fit;
    one byte less and only 4 do."""
    weights, per_seq = 2 * 6_738_415_616, 4096 * 524_288
    assert (24 * GIB - weights) / per_seq == pytest.approx(5.72, abs=0.005)
    assert max_batch_that_fits(24 * GIB, weights, per_seq) == 5
    assert max_batch_that_fits(weights + 5 * per_seq, weights, per_seq) == 5
    assert max_batch_that_fits(weights + 5 * per_seq - 1, weights, per_seq) == 4
    assert max_batch_that_fits(weights + per_seq - 1, weights, per_seq) == 0
    assert max_batch_that_fits(weights - 1, weights, per_seq) == 0  # weights alone do not fit
    assert max_batch_that_fits(np.array([24 * GIB, 16 * GIB]), weights, per_seq).tolist() == [5, 1]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**12), st.integers(1, 10**10), st.integers(-(10**12), 10**12))
def test_max_batch_that_fits_is_the_largest_batch_that_fits(weights, per_seq, free):
    mb = max_batch_that_fits(weights + free, weights, per_seq)
    assert mb >= 0 and (mb == 0 or weights + mb * per_seq <= weights + free)
    assert weights + (mb + 1) * per_seq > weights + free


def _device_holding(a100, nbytes: int):
    """The A100 fixture with exactly `nbytes` of memory (exact in GiB: a division by 2**30)."""
    from dataclasses import replace
    return replace(a100, name="a100-sized", memory_gib=nbytes / GIB)


def test_max_batch_at_an_exact_and_at_a_fractional_fit(llama2_7b, a100):
    """Llama-2-7B fp16, 100 + 28 tokens = 8 whole blocks = 64 MiB of KV a sequence, mem_util 1: on a
    device holding weights + activations + exactly 7 sequences, 7 fit and 8 do not; with 0.6 of a
    sequence more, still 7 (a rounded 7.6 would promise 8); one byte short of 7, 6."""
    probe = estimate_memory(llama2_7b, Precision(), a100, batch=1, prompt_len=100, gen_len=28, mem_util=1.0)
    per_seq = 128 * 524_288
    assert probe.kv_cache_bytes == per_seq
    fixed = int(probe.weights_bytes + probe.activation_peak_bytes)
    for extra, expected in ((7 * per_seq, 7), (7 * per_seq + 6 * per_seq // 10, 7), (7 * per_seq - 1, 6),
                            (per_seq - 1, 0)):
        hw = _device_holding(a100, fixed + extra)
        mem = estimate_memory(llama2_7b, Precision(), hw, batch=expected, prompt_len=100, gen_len=28, mem_util=1.0)
        assert mem.max_batch == expected and (mem.fits or expected == 0)
        assert not estimate_memory(llama2_7b, Precision(), hw, batch=expected + 1, prompt_len=100, gen_len=28,
                                   mem_util=1.0).fits
        rows = sweep([llama2_7b], [hw], batch=[max(expected, 1), expected + 1], prompt_len=[100], gen_len=[28],
                     mem_util=1.0)
        assert rows["max_batch"].tolist() == [expected] * 2 and rows["fits"].tolist() == [expected > 0, False]


@settings(max_examples=40, deadline=None)
@given(mib=st.integers(14_000, 80_000), prompt=st.integers(1, 3000), gen=st.integers(1, 1000),
       block=st.sampled_from([1, 8, 16, 32]), max_seq=st.sampled_from([None, 4096]))
def test_reported_max_batch_fits_and_one_more_does_not(a100, mib, prompt, gen, block, max_seq):
    """Paged and contiguous: weights + activations + max_batch sequences fit in the usable memory, one
    more sequence does not (every byte count an integer, so the comparison is exact)."""
    hw = _device_holding(a100, mib * 2**20)
    mem = estimate_memory(load_model("llama-2-7b"), Precision(), hw, batch=1, prompt_len=prompt, gen_len=gen,
                          mem_util=1.0, block_size=block, max_seq_len=max_seq)
    fixed = mem.weights_bytes + mem.activation_peak_bytes
    for mb, per_seq in ((mem.max_batch, mem.kv_cache_bytes), (mem.max_batch_contiguous,
                                                             mem.kv.contiguous_reserved_bytes)):
        assert mb >= 0
        assert mb == 0 or fixed + mb * per_seq <= mem.usable_bytes
        assert fixed + (mb + 1) * per_seq > mem.usable_bytes


def test_max_seq_len_shorter_than_the_context_is_refused(llama2_7b, a100):
    with pytest.raises(SpecError, match="max_seq_len: 600"):
        estimate(llama2_7b, a100, prompt_len=512, gen_len=128, max_seq_len=600)
    # a context of exactly max_seq_len fits: the contiguous cache reserves exactly it
    exact = estimate(llama2_7b, a100, prompt_len=512, gen_len=88, max_seq_len=600)
    assert exact.memory.kv.contiguous_reserved_bytes == 600 * 524_288
    assert kv_utilization([599, 600], 1.0, max_seq_len=600, block_size=16).paged_reserved_bytes == 608
    with pytest.raises(SpecError, match="max_seq_len: 600 is shorter than a sequence of 601 tokens"):
        kv_utilization([601], 1.0, max_seq_len=600)
    with pytest.raises(SpecError, match="max_seq_len: 600"):
        sweep([llama2_7b], [a100], prompt_len=[64, 512], gen_len=[128], max_seq_len=600)


# ---- tensor and pipeline parallelism ------------------------------------------------------------------
def test_tp_beyond_kv_heads_replicates_them():
    """Llama-3.1-8B has 8 KV heads; at tp 16 each GPU keeps one (replicated), never zero:
    KV per token per GPU = 2 x 32 layers x 1 head x 128 x 2 B = 16,384; k_proj reads 4096 x 128 x 2 B."""
    m = load_model("llama-3.1-8b")
    assert kv_bytes_per_token_per_gpu(m, Precision.uniform("bf16"), tp=16) == 16_384
    fm = ForwardModel(model=m, precision=Precision.uniform("bf16"), tp=16)
    assert fm.k_proj(1, 1, 10).weight_bytes == 4096 * 128 * 2
    assert fm.attention_ops(1, 1, 1000)[0].kv_read_bytes == 2 * 1000 * 1 * 128 * 2


def test_a_vocabulary_tp_does_not_divide_is_split_into_rounded_up_shards():
    """GPT-2's 50,257 tokens over 2 GPUs: the larger shard has 25,129 rows, and that GPU's lm_head
    and (tied) embedding are what bound the step and the memory."""
    m = load_model("gpt2")
    fm = ForwardModel(model=m, precision=Precision(), tp=2)
    assert fm.lm_head(1, 1, 1).flops == 2 * 768 * 25_129
    assert fm.lm_head(1, 1, 1).weight_bytes == 768 * 25_129 * 2
    shard = lambda vocab: weight_bytes_per_gpu(m.scaled(vocab_size=vocab), Precision(), tp=2)  # noqa: E731
    assert shard(50_257) == shard(50_258) == shard(50_256) + 768 * 2  # one row of 768 more than 25,128


def test_pipeline_stages_follow_vllm_partition(llama2_7b):
    """32 layers on 3 stages: 10 each, the 2 left over to the stages before the last -> [11, 11, 10].
    Stage 0 holds 11 layers + the embedding; the last 10 layers + final norm + lm_head."""
    assert stage_layers(llama2_7b, 3) == [11, 11, 10]
    p = Precision()
    layer = (4 * 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096) * 2
    vocab = 32000 * 4096 * 2
    assert stage_weight_bytes(llama2_7b, p, pp=3) == [11 * layer + vocab, 11 * layer, 10 * layer + 4096 * 2 + vocab]
    assert weight_bytes_per_gpu(llama2_7b, p, pp=3) == 11 * layer + vocab
    assert kv_bytes_per_token_per_gpu(llama2_7b, p, pp=3) == 11 * 2 * 32 * 128 * 2


def test_peak_fraction_is_per_gpu_with_pipeline_stages(llama2_7b, a100):
    """The FLOP columns are per tensor-parallel rank over all stages; the pp GPUs run one after
    another, so each is busy 1/pp of the time. Llama-2-7B, pp 2: prefill FLOPs as pp 1 (the
    whole model), and the achieved fraction of ONE GPU's peak about half of pp 1's (it read 91%)."""
    one, two = (estimate(llama2_7b, a100, batch=8, prompt_len=512, gen_len=16, pp=p) for p in (1, 2))
    assert two.summary()["prefill_flops"] == one.summary()["prefill_flops"]
    row = two.summary()
    assert row["peak_fraction"] == pytest.approx(row["total_flops"] / row["e2e_s"] / (2 * 312e12), rel=1e-12)
    assert two.peak_fraction == pytest.approx(row["peak_fraction"], rel=1e-12)
    assert two.prefill.peak_fraction == pytest.approx(two.prefill.flops / two.prefill.time_s / (2 * 312e12))
    assert 0.49 < two.prefill.peak_fraction / one.prefill.peak_fraction < 0.5


def test_tied_lm_head_sits_on_the_last_stage():
    """GPT-2 small ties lm_head to the embedding: one copy at pp 1, a copy on the last stage at pp 2."""
    m = load_model("gpt2")
    p = Precision.uniform("fp16")
    one = stage_weight_bytes(m, p, pp=1)[0]
    first, last = stage_weight_bytes(m, p, pp=2)
    vocab = m.vocab_size * m.hidden_size * 2
    assert one == m.param_count * 2  # tied: counted once, as HF counts parameters
    assert first + last == one + vocab
    assert last >= vocab


# ---- quantisation ---------------------------------------------------------------------------------
def test_group_scales_and_16_bit_embeddings():
    """int4, groups of 128: 0.5 B per weight + (2 B scale + 0.5 B zero) / 128 = 0.51953125 B;
    int8 per channel: 1 B + 2 B per output row; lm_head stays at 16 bits, tied or not."""
    assert Precision(weights="int4").matrix_bytes(4096, 4096) == 4096 * 4096 * 0.51953125
    assert Precision(weights="int4", group_size=64, zero_point=False).matrix_bytes(4096, 4096) == \
        4096 * 4096 * 0.5 + 4096 * 64 * 2
    assert Precision(weights="int8").matrix_bytes(4096, 1000) == 4096 * 1000 + 1000 * 2
    fm = ForwardModel(model=load_model("llama-3.1-8b"), precision=Precision(weights="int4", activations="bf16"))
    assert fm.lm_head(1, 1, 1).weight_bytes == 4096 * 128_256 * 2
    assert fm.embed(2, 3, 3).weight_bytes == 6 * 4096 * 2
    tied = ForwardModel(model=load_model("gpt2"), precision=Precision(weights="int4"))
    assert tied.lm_head(1, 1, 1).weight_bytes == 768 * 50257 * 2
    assert ForwardModel(model=load_model("gpt2"), precision=Precision(weights="int4", embeddings="int4")) \
        .lm_head(1, 1, 1).weight_bytes == 768 * 50257 * 0.5 + 50257 * 6 * 2.5  # ceil(768/128) = 6 groups


def test_int4_gpt2_xl_weights_with_partial_groups():
    """GPT-2 XL at int4, groups of 128 with zeros (as AutoGPTQ stores it: ceil(in / 128) groups a row).
    Per layer: q, k, v, o are 1600 x 1600 and up 1600 x 6400, whose 1600 inputs are 12.5 groups: 13 a
    row, 4 x 1600 x 13 + 6400 x 13 = 166,400 groups; down 6400 x 1600: 50 a row, 80,000 groups;
    (30,720,000 x 0.5 B) + 246,400 x 2.5 B + 14,400 biases and 6,400 LayerNorm values at 2 B =
    16,017,600 B. 48 layers, tied fp16 embeddings 50257 x 1600 and 1024 positions, the final
    LayerNorm: 932,950,400 B."""
    layer = 30_720_000 * 0.5 + 246_400 * 2.5 + (14_400 + 6_400) * 2
    assert layer == 16_017_600
    total = 48 * layer + (50_257 + 1024) * 1600 * 2 + 3200 * 2
    assert weight_bytes_per_gpu(load_model("gpt2-xl"), Precision(weights="int4")) == total == 932_950_400


def test_quantised_checkpoint_sets_the_default_weight_precision(tiny_llama, a100):
    q = tiny_llama.scaled(quantization=QuantizationSpec(method="gptq", bits=4, group_size=32, zero_point=False))
    est = estimate(q, a100)
    assert est.precision.weights == "int4" and est.precision.effective_group_size == 32
    assert not est.precision.effective_zero_point
    assert est.summary()["group_size"] == 32
    assert estimate(q, a100, weights="fp16").precision.weights == "fp16"  # an explicit choice wins
    per_channel = tiny_llama.scaled(quantization=QuantizationSpec(method="gptq", bits=4, group_size=None))
    assert estimate(per_channel, a100).precision.effective_group_size is None
    # the label says so in words (it read "(gchannel)")
    assert estimate(per_channel, a100).summary()["precision"] == "w:int4/a:fp16/kv:fp16 (per-channel, zp)"
    assert Precision(weights="int8").label() == "w:int8/a:fp16/kv:fp16 (per-channel)"


# ---- fused projections ------------------------------------------------------------------------------
def test_fused_qkv_reads_the_input_once(llama2_7b):
    """Llama-2-7B prefill of 1024 tokens at fp16, Q K V fused (4096 -> 12288):
    2*1024*4096*12288 FLOPs / 2*(4096*12288 + 1024*4096 + 1024*12288) B = 768.0 FLOP/B."""
    fm = ForwardModel(model=llama2_7b, precision=Precision(), fused_qkv=True, fused_gate_up=True)
    qkv = fm.qkv_proj(1, 1024, 1024)
    assert qkv.intensity == 768.0
    split = [fm.q_proj(1, 1024, 1024), fm.k_proj(1, 1024, 1024), fm.v_proj(1, 1024, 1024)]
    assert qkv.flops == sum(o.flops for o in split) and qkv.weight_bytes == sum(o.weight_bytes for o in split)
    assert qkv.act_read_bytes == split[0].act_read_bytes  # read once, not three times
    gu = fm.gate_up_proj(1, 1024, 1024)
    assert gu.act_read_bytes == 1024 * 4096 * 2 and gu.weight_bytes == 2 * 4096 * 11008 * 2
    names = [o.name for o in fm.layer_ops(1, 8, 8)]
    assert "qkv_proj" in names and "gate_up_proj" in names and "q_proj" not in names
    assert estimate(llama2_7b, fused_qkv=False).prefill.op("q_proj")


# ---- sliding window ------------------------------------------------------------------------------
def test_sliding_window_caps_pairs_keys_and_memory(tiny_llama, a100):
    """Window 4, prefill of 10: pairs = 1 + 2 + 3 + 4 x 7 = 34; a decode step at context 100 reads
    4 keys; the KV a sequence keeps is capped at 4 tokens (one block of 16)."""
    assert attended_pairs(10, 10, True, window=4) == 34
    assert attended_pairs(1, 100, True, window=4) == 4
    assert attended_pairs(3, 10, True, window=4) == 12
    kw = dict(num_heads=4, num_kv_heads=2, head_dim=16)
    dec = attention_cost(2, 1, 100, window=4, **kw)
    assert dec.kv_read_bytes == 2 * 2 * 4 * 2 * 16 * 2
    assert dec.flops == 4 * 2 * 4 * 4 * 16
    m = tiny_llama.scaled(sliding_window=4)
    est = estimate(m, a100, batch=2, prompt_len=20, gen_len=30)
    assert est.memory.kv_cache_bytes == 2 * 16 * m.kv_bytes_per_token("fp16")
    # the closed form crosses the window exactly
    w = tiny_llama.scaled(sliding_window=40)
    est = estimate(w, a100, batch=3, prompt_len=20, gen_len=50)
    steps = est.decode_step_times_s()
    assert steps.sum() == pytest.approx(est.decode_total_s, rel=1e-12)
    assert steps[-1] == steps[-2]  # past the window a step costs the same


# ---- time model and the bound rule -------------------------------------------------------------------
class HalfSpeed:
    """Half the compute roof, 80% of bandwidth, 2 µs per launch; bigger GEMMs do better."""

    name = "half-speed"
    step_overhead_s = 5e-6  # per forward pass, outside the operators

    def efficiency(self, cost, hardware):  # noqa: ANN001, ANN201
        rows = np.asarray(cost.rows, dtype=float)
        return Efficiency(e_compute=np.where(rows >= 64, 0.6, 0.5), e_memory=0.8, overhead_s=2e-6)


def test_time_model_reaches_every_time_and_keeps_the_closed_form(tiny_llama, a100):
    tm = HalfSpeed()
    est = estimate(tiny_llama, a100, batch=5, prompt_len=30, gen_len=40, time_model=tm)
    steps = est.decode_step_times_s()
    assert steps.sum() == pytest.approx(est.decode_total_s, rel=1e-12)
    assert est.ttft_s == pytest.approx(est.prefill.time_s, rel=1e-12)
    assert est.summary()["time_model"] == "half-speed"
    base = estimate(tiny_llama, a100, batch=5, prompt_len=30, gen_len=40)
    assert base.summary()["time_model"] == "roofline" and est.ttft_s > base.ttft_s
    n_ops = len(est.prefill.ops)
    assert est.prefill.time_s >= n_ops * 2e-6 + 5e-6
    row = sweep([tiny_llama], [a100], batch=[5], prompt_len=[30], gen_len=[40], time_model=tm).iloc[0]
    assert row.tpot_s == est.tpot_s and row.ttft_s == est.ttft_s


def test_attention_is_timed_at_the_matrix_peak_and_softmax_at_the_vector_peak(a100):
    fused = attention_cost(1, 512, 512, num_heads=8, num_kv_heads=8, head_dim=64)
    assert op_time(fused, a100, "fp16").compute_s == fused.flops / 312e12
    naive = ForwardModel(model=ModelSpec(name="t", vocab_size=10, hidden_size=512, num_layers=1, num_heads=8,
                                         ffn_size=64, max_positions=1024), precision=Precision(),
                         attention="naive").attention_ops(1, 512, 512)
    score, softmax = naive[0], naive[1]
    assert op_time(score, a100, "fp16").compute_s == score.flops / 312e12
    assert op_time(softmax, a100, "fp16").compute_s == softmax.flops / 19.5e12


def test_kv_write_counts_k_and_v(tiny_llama):
    """3 sequences x 5 tokens x 2 KV heads x 16 dims, K and V: 2 x 240 values, 2 B each."""
    c = ForwardModel(model=tiny_llama, precision=Precision(kv="fp8")).kv_write(3, 5, 5)
    assert c.kv_write_bytes == 2 * 3 * 5 * 2 * 16 * 1 and c.act_read_bytes == 2 * 3 * 5 * 2 * 16 * 2


def test_ties_go_to_memory_everywhere():
    assert bound_label(1.0, 1.0) == "memory" and bound_label(1.0 + 1e-9, 1.0) == "compute"
    assert bound_label(0.0, 0.0, 0.0) == "memory" and bound_label(1.0, 1.0, 1.0) == "memory"
    assert list(bound_label(np.array([1.0, 2.0]), np.array([1.0, 1.0]))) == ["memory", "compute"]


# ---- one roll-up -----------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:context 131200")
def test_no_overflow_a_row_does_not_depend_on_its_neighbours(a100):
    one = sweep(["llama-3.1-8b"], [a100], batch=[100_000], prompt_len=[131_072], gen_len=[128])
    two = sweep(["llama-3.1-8b"], [a100], batch=[100_000, 1], prompt_len=[131_072], gen_len=[128])
    pd.testing.assert_frame_equal(one, two.iloc[:1])
    est = estimate("llama-3.1-8b", a100, batch=100_000, prompt_len=131_072, gen_len=128)
    assert est.ttft_s == one.ttft_s.iloc[0] and est.memory.kv_cache_bytes / GIB == one.kv_cache_gib.iloc[0]


def test_a_billion_tokens_is_a_closed_form(a100):
    est = estimate("llama-3.1-8b", a100, prompt_len=512, gen_len=10**9)
    assert est.decode_first.time_s <= est.tpot_s <= est.decode_last.time_s
    assert 0.99 < est.memory.kv.paged_utilization <= 1.0
    # a slice of the per-step series on demand
    tail = est.decode_step_times_s(start=10**9 - 3)
    assert len(tail) == 3 and tail[-1] == pytest.approx(est.decode_last.time_s, rel=1e-12)


def test_columns_are_documented_and_json_is_strict(a100):
    frame = sweep(["llama-3.1-8b", "mixtral-8x7b"], [a100], batch=[1, 4], tp=[1, 2], weights=["bf16", "int4"])
    assert list(frame.columns) == list(COLUMNS)
    assert len(frame) == 2 * 2 * 2 * 2
    assert list(estimate("llama-3.1-8b", a100).summary()) == list(COLUMNS)
    frame.loc[0, "ttft_s"] = float("nan")
    text = to_json(frame)
    assert "NaN" not in text and '"ttft_s": null' in text
    mix = frame[frame.model == "mixtral-8x7b"].iloc[0]
    assert mix.params_total == 46_702_792_704 and mix.params_active < mix.params_total
    assert set(frame.gpus) == {1, 2}


def test_schema_page_renders_every_column_with_a_description():
    """docs/schemas.md renders `COLUMNS` itself (its `llmperf-columns` marker, expanded when the site is built,
    in schema order: tests/docs checks the built page), so every column needs a description."""
    from pathlib import Path
    text = (Path(__file__).resolve().parents[2] / "docs" / "schemas.md").read_text()
    section = text.split("## estimate and sweep", 1)[1].split("\n## ", 1)[0]
    assert "<!-- llmperf-columns: llmperf.analysis.schema.COLUMNS -->" in section
    assert all(isinstance(text, str) and text.strip() for text in COLUMNS.values())


def _assert_row_equal(row: dict, summary: dict) -> None:
    assert list(row) == list(summary)
    for key, value in summary.items():
        got = row[key]
        if value is None:
            assert got is None or got != got or got is pd.NA, key
        elif isinstance(value, float):
            assert got == pytest.approx(value, rel=1e-12, abs=0), key
        else:
            assert got == value, key


heads = st.sampled_from([(8, 8), (8, 4), (8, 2), (4, 1)])


@st.composite
def small_models(draw) -> ModelSpec:  # noqa: ANN001
    h, kvh = draw(heads)
    return ModelSpec(name="m", vocab_size=draw(st.integers(100, 3000)), hidden_size=h * 32,
                     num_layers=draw(st.integers(2, 7)), num_heads=h, num_kv_heads=kvh,
                     ffn_size=8 * draw(st.integers(2, 64)), ffn_kind=draw(st.sampled_from(["swiglu", "gelu"])),
                     tied_embeddings=draw(st.booleans()), max_positions=1 << 20,
                     sliding_window=draw(st.sampled_from([None, 50, 300])),
                     num_experts=draw(st.sampled_from([1, 4])), experts_per_token=1)


@settings(max_examples=25, deadline=None)
@given(small_models(), st.lists(st.integers(1, 300), min_size=1, max_size=2), st.integers(1, 400),
       st.integers(1, 400), st.sampled_from([[1], [1, 2], [2, 4]]), st.sampled_from([[1], [1, 2]]),
       st.sampled_from([["fp16"], ["fp16", "int4"], ["int8", "fp8"]]), st.sampled_from(["fused", "naive"]),
       st.booleans(), st.sampled_from([[None], ["fp8", "fp16"]]),
       st.fixed_dictionaries({"attention_flops": st.sampled_from(["executed", "dense"]),
                              "block_size": st.sampled_from([1, 16, 32]), "mem_util": st.sampled_from([0.5, 0.9]),
                              "max_batched_tokens": st.sampled_from([256, 8192]),
                              "max_seq_len": st.sampled_from([None, 2048]),
                              "group_size": st.sampled_from([None, 32]),
                              "embeddings": st.sampled_from([None, "fp8"])}))
def test_single_estimate_equals_its_sweep_row(a100, m, batches, prompt, gen, tps, pps, weights, attn, fused, kvs,
                                              extra):
    if extra["group_size"] is not None and weights == ["fp16"]:
        extra = {**extra, "group_size": None}  # group scales need integer weights (refused otherwise)
    if extra["group_size"] is not None and (m.ffn_size % extra["group_size"] or m.hidden_size % extra["group_size"]):
        extra = {**extra, "group_size": None}  # a group must tile each row's inputs (refused otherwise)
    frame = sweep([m], [a100], batch=batches, prompt_len=[prompt], gen_len=[gen], tp=tps, pp=pps,
                  weights=weights, kv=kvs, attention=attn, fused_qkv=fused, all_logits=not fused, **extra)
    rows = frame.to_dict(orient="records")
    assert len(rows) == len(batches) * len(tps) * len(pps) * len(weights) * len(kvs)
    for row in rows:
        quantized = row["weights"] in ("int4", "int8")
        est = estimate(m, a100, batch=row["batch"], prompt_len=prompt, gen_len=gen, tp=row["tp"], pp=row["pp"],
                       weights=row["weights"], kv=row["kv"], attention=attn, fused_qkv=fused, all_logits=not fused,
                       **{**extra, "group_size": extra["group_size"] if quantized else None})
        _assert_row_equal(row, est.summary())
        assert est.prefill.time_s == pytest.approx(est.ttft_s, rel=1e-12)
        assert est.prefill.bound == row["prefill_bound"] and est.decode_first.bound == row["decode_bound"]


@given(st.lists(st.tuples(st.floats(-5, 5), st.floats(-1, 1)), min_size=1, max_size=3),
       st.integers(-20, 20), st.integers(0, 40))
def test_sum_max_lines_matches_a_loop(lines, lo, n):
    hi = lo + n - 1
    xs = np.arange(lo, hi + 1)
    expected = np.max([a + b * xs for a, b in lines], axis=0).sum() if n else 0.0
    got = sum_max_lines([a for a, _ in lines], [b for _, b in lines], lo, hi)
    assert float(got) == pytest.approx(expected, abs=1e-9)


def test_hardware_with_no_interconnect_refuses_pp_by_name(tiny_llama):
    hw = load_hardware("a100-80gb-sxm")
    from dataclasses import replace
    lonely = replace(hw, interconnect_gbps=0.0)
    with pytest.raises(SpecError, match="pp: 2"):
        estimate(tiny_llama, lonely, pp=2)
    with pytest.raises(SpecError, match="tp: 2 needs an interconnect, but a100-80gb-sxm has interconnect_gbps 0"):
        estimate(tiny_llama, lonely, tp=2)  # it said "cannot time attn_allreduce", naming neither tp nor 2
    with pytest.raises(SpecError, match="tp: 2 needs an interconnect"):
        sweep([tiny_llama], [lonely], tp=[1, 2], prompt_len=[64], gen_len=[16])


class Broken:
    name = "broken"

    def efficiency(self, cost, hardware):  # noqa: ANN001, ANN201
        return (1.5, 1.0, 0.0)


def test_a_time_model_out_of_range_is_refused_by_name(tiny_llama, a100):
    with pytest.raises(ValueError, match="time model 'broken': e_compute for .* must be in \\(0, 1\\], got 1.5"):
        estimate(tiny_llama, a100, time_model=Broken())
    with pytest.raises(TypeError, match="time_model"):
        estimate(tiny_llama, a100, time_model=object())


def test_time_model_check_agrees_with_the_protocol():
    """`roofline._is_time_model` (the fast check `op_time` uses) says what `isinstance(x, TimeModel)` says."""
    import functools
    import types

    from llmperf.analysis import timemodel
    from llmperf.analysis.roofline import ROOFLINE, RooflineTimeModel, TimeModel, _is_time_model

    class NoName:
        def efficiency(self, cost, hardware):  # noqa: ANN001, ANN202
            return (1.0, 1.0, 0.0)

    class NoneEfficiency:
        name = "x"
        efficiency = None

    from llmperf.specs import load_hardware
    hw = load_hardware("a100-80gb-sxm")
    typical = timemodel.time_model_for(hw, efficiency="typical", compute_dtype="fp16")
    objs = [ROOFLINE, RooflineTimeModel(name="r"), typical,
            NoName(), NoneEfficiency(), types.SimpleNamespace(name="s", efficiency=lambda c, h: (1, 1, 0)),
            types.SimpleNamespace(name="s"), object(), None, 3, "roofline",
            functools.partial(timemodel.time_model_for, efficiency="typical")]
    for obj in objs:
        assert _is_time_model(obj) == isinstance(obj, TimeModel), obj


def test_memory_bound_mask_is_the_bound_rule():
    """`roofline.memory_bound` (the roll-up's memory-bound time) is `bound_label(...) == "memory"`,
    ties, NaN and the interconnect included."""
    from llmperf.analysis.roofline import bound_label, memory_bound

    vals = np.array([0.0, 1.0, 2.0, np.nan])
    c, m, k = (a.ravel() for a in np.meshgrid(vals, vals, vals))
    np.testing.assert_array_equal(memory_bound(c, m, k), bound_label(c, m, k) == "memory")
    np.testing.assert_array_equal(memory_bound(c[:, None], m[:5], 0.0), bound_label(c[:, None], m[:5]) == "memory")
    assert bool(memory_bound(1.0, 2.0)) and not bool(memory_bound(2.0, 1.0)) and bool(memory_bound(1.0, 1.0))
