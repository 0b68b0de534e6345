"""Memory of today's models (issue 22): weights summed over each stage's real layers (dense and MoE
layers, MLA's matrices, shared experts, routers), KV per stage from its layers' kinds (capped or full
pages), the exact max batch with mixed caps, the activation peak over layer kinds, and expert
parallelism / DP attention. Golden values are computed by hand in the comment beside them; the specs
are built from the public configs (`data/hf-configs/`), independent of the YAML catalog."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmperf.analysis.memory import estimate_memory, kv_bytes_per_token_per_gpu, weight_bytes_per_gpu
from llmperf.analysis.rollup import (
    Conventions,
    activation_peak_bytes,
    layer_weight_bytes,
    memory_arrays,
    stage_layers,
    stage_weight_bytes,
)
from llmperf.errors import SpecError
from llmperf.specs import HardwareSpec, ModelSpec, Precision, load_model
from llmperf.specs.model import LayerKind

GIB = 2**30
BF16 = Precision.uniform("bf16")

from todays_specs import DEEPSEEK_V3, GPT_OSS_20B, SCOUT  # noqa: E402  (tests/ is on sys.path)

#: a Gemma-3-like dense model: 5 sliding (1024) : 1 full, q/k norms, sandwich norms, tied embeddings
GEMMA_LIKE = dict(name="gemma-like", vocab_size=262144, hidden_size=3840, num_layers=12, num_heads=16,
                  num_kv_heads=8, head_dim=256, ffn_size=15360, max_positions=131072, sliding_window=1024,
                  layer_types=tuple("full" if (i + 1) % 6 == 0 else "sliding" for i in range(12)),
                  qk_norm="rmsnorm", sandwich_norms=True, tied_embeddings=True, dtype="bf16")
TODAYS = [DEEPSEEK_V3, GPT_OSS_20B, SCOUT, GEMMA_LIKE]


def _hw(nbytes: float, name: str = "device") -> HardwareSpec:
    """A device with exactly `nbytes` of memory (exact in GiB: a division by 2**30)."""
    return HardwareSpec(name=name, peak_tflops={"fp32": 60, "fp16": 990, "bf16": 990, "fp8": 1979, "int8": 1979},
                        memory_bandwidth_gbps=4800, memory_gib=nbytes / GIB, interconnect_gbps=450, num_sms=132,
                        sram_per_sm_kib=228, l2_cache_mib=50)


H200 = _hw(141 * 10**9, "h200-like")


# ---- weights ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", TODAYS, ids=lambda s: s["name"])
def test_stages_sum_to_the_parameter_count(spec):
    """At one precision the stages hold every parameter once (an untied lm_head on the last stage; a
    tied one a second time there when pp > 1), DeepSeek's router score-correction bias in fp32 (2 bytes
    more per expert and MoE layer at bf16)."""
    m = ModelSpec(**spec)
    fp32_bias = 2 * m.num_experts * sum(n for kind, n in m.layer_groups() if kind.moe) if m.router_score_bias else 0
    for pp in (1, 2, 3, 5):
        total = sum(stage_weight_bytes(m, BF16, pp=pp))
        tied_copy = m.vocab_size * m.hidden_size * 2 if (m.tied_embeddings and pp > 1) else 0
        assert total == 2 * m.param_count + tied_copy + fp32_bias
    assert weight_bytes_per_gpu(m, Precision.uniform("fp32")) == 4 * m.param_count


def test_deepseek_v3_mla_attention_by_hand():
    """q_a 7168 x 1536 + q_a_layernorm 1536 + q_b 1536 x 128 x 192 + kv_a 7168 x 576 + kv_a_layernorm
    512 + kv_b 512 x 128 x 256 + o 128 x 128 x 7168 = 187,107,328 parameters. At tp 8 the
    down-projections and norms are replicated, q_b, kv_b and o split by heads:
    11,010,048 + 4,128,768 + (37,748,736 + 16,777,216 + 117,440,512) / 8 + 2048 = 36,636,672."""
    m = ModelSpec(**DEEPSEEK_V3)
    assert m.attn_params_per_layer == 187_107_328
    dense = LayerKind(attention="full", window=None, rope=True, moe=False)
    ffn, norms = 3 * 7168 * 18432 * 2, 2 * 7168 * 2  # the dense FFN splits 8 ways, the norms do not
    assert layer_weight_bytes(m, BF16, dense) == 187_107_328 * 2 + ffn + norms
    assert layer_weight_bytes(m, BF16, dense, 8) == 36_636_672 * 2 + ffn / 8 + norms
    # DP attention: every GPU holds the whole attention
    assert layer_weight_bytes(m, BF16, dense, 8, dp_attention=True) == 187_107_328 * 2 + ffn / 8 + norms


def test_deepseek_v3_dense_layers_sit_on_the_first_stage():
    """61 layers on 2 stages: [31, 30]; stage 0 = the embedding + dense layers 0..2 + 28 MoE layers,
    stage 1 = 30 MoE layers + final norm + lm_head. Dense layer: attention + 3 x 7168 x 18432 + 2
    norms (bf16); MoE layer: attention + (256 + 1) x 3 x 7168 x 2048 + router 7168 x 256 + 2 norms
    (bf16) + 256 score biases (fp32, as every engine keeps them)."""
    m = ModelSpec(**DEEPSEEK_V3)
    attn = 187_107_328
    dense = (attn + 3 * 7168 * 18432 + 2 * 7168) * 2
    moe = (attn + 257 * 3 * 7168 * 2048 + 7168 * 256 + 2 * 7168) * 2 + 256 * 4
    vocab = 129280 * 7168 * 2
    assert stage_layers(m, 2) == [31, 30]
    assert stage_weight_bytes(m, BF16, pp=2) == [vocab + 3 * dense + 28 * moe, 30 * moe + 7168 * 2 + vocab]
    assert sum(stage_weight_bytes(m, BF16, pp=2)) == 2 * 671_026_419_200 + 58 * 256 * 2


def test_expert_parallelism_moves_whole_experts():
    """DeepSeek-V3 bf16 at tp 8: 256 experts each split 8 ways or 32 whole experts a GPU (ep 8) or 64
    split 2 ways (ep 4) hold the same matrix bytes. gpt-oss-20b keeps a bias per expert (2 x 2880 +
    2880 = 8640 values), so at tp 4 a GPU holds 32 experts' biases (ep 1) or 8 (ep 4):
    24 layers x 24 experts x 8640 x 2 B fewer."""
    ds = ModelSpec(**DEEPSEEK_V3)
    plain = stage_weight_bytes(ds, BF16, tp=8)
    assert stage_weight_bytes(ds, BF16, tp=8, ep=8) == plain == stage_weight_bytes(ds, BF16, tp=8, ep=4)
    oss = ModelSpec(**GPT_OSS_20B)
    diff = weight_bytes_per_gpu(oss, BF16, tp=4) - weight_bytes_per_gpu(oss, BF16, tp=4, ep=4)
    assert diff == 24 * 24 * 8640 * 2


def test_dp_attention_replicates_attention_weights():
    """Llama-3.1-8B at tp 4: attention split 4 ways, or whole on every GPU (3/4 of it more a GPU):
    32 layers x 3/4 x (4096 x 4096 x 2 + 4096 x 1024 x 2) x 2 B."""
    m = load_model("llama-3.1-8b")
    more = weight_bytes_per_gpu(m, BF16, tp=4, dp_attention=True) - weight_bytes_per_gpu(m, BF16, tp=4)
    assert more == 32 * 3 / 4 * (4096 * 4096 * 2 + 4096 * 1024 * 2) * 2
    assert weight_bytes_per_gpu(m, BF16, tp=1, dp_attention=True) == weight_bytes_per_gpu(m, BF16)


@pytest.mark.parametrize("kwargs,needle", [
    (dict(ep=3, tp=6, dp_attention=True), "ep: 3 does not divide deepseek-v3-code's num_experts=256"),
    (dict(ep=8, tp=4), "ep: 8 does not divide tp=4"),
    (dict(ep=0), "ep: must be a positive integer, got 0"),
    (dict(dp_attention=1), "dp_attention: must be true or false"),
])
def test_bad_parallelism(kwargs, needle):
    with pytest.raises(SpecError, match=needle):
        stage_weight_bytes(ModelSpec(**DEEPSEEK_V3), BF16, **kwargs)
    with pytest.raises(SpecError, match="ep: 2 needs a mixture-of-experts model, llama-3.1-8b has no experts"):
        weight_bytes_per_gpu(load_model("llama-3.1-8b"), BF16, tp=2, ep=2)


# ---- KV, max batch ---------------------------------------------------------------------------------
def test_gpt_oss_max_batch_is_exact_with_mixed_caps():
    """gpt-oss-20b at 8192 tokens (8000 + 192), blocks of 16, mem_util 1: a sequence takes
    12 x (8192 + 128) x 2048 B = 204,472,320 B capped, 24 x 8192 x 2048 = 402,653,184 B with full
    pages. On a device holding weights + activations + exactly 7 capped sequences, 7 fit and 8 do
    not; full pages fit floor(7 x 8320 / 16384) = 3."""
    m = ModelSpec(**GPT_OSS_20B)
    kw = dict(prompt_len=8000, gen_len=192, mem_util=1.0)
    probe = estimate_memory(m, BF16, H200, batch=1, **kw)
    per_seq = 12 * (8192 + 128) * 2048
    assert probe.kv_cache_bytes == per_seq == 204_472_320 and probe.kv_bytes_per_token == 49_152
    fixed = probe.weights_bytes + probe.activation_peak_bytes
    for extra, expected in ((7 * per_seq, 7), (7 * per_seq - 1, 6), (per_seq - 1, 0)):
        hw = _hw(fixed + extra)
        mem = estimate_memory(m, BF16, hw, batch=max(expected, 1), **kw)
        assert mem.max_batch == expected and mem.fits == (expected > 0)
        assert not estimate_memory(m, BF16, hw, batch=expected + 1, **kw).fits
    full = estimate_memory(m, BF16, _hw(fixed + 7 * per_seq), batch=1, kv_window="full", **kw)
    assert full.kv_cache_bytes == 24 * 8192 * 2048 and full.max_batch == 3


def test_dp_attention_holds_each_latent_once():
    """DeepSeek-V3 (fp8 weights, bf16 KV) on 8 GPUs of 141 GB (H200) at 4096 + 1024 tokens: a
    sequence's latent is 70,272 B x 5120 = 359,792,640 B. Plain TP replicates it on all 8 GPUs; DP
    attention keeps it on one, so the group holds 8 x what one GPU's free memory holds (despite the
    replicated attention weights and shared experts): here 632 sequences instead of 114."""
    m = ModelSpec(**DEEPSEEK_V3)
    p = Precision(weights="fp8", activations="bf16", kv="bf16")
    per_seq = 70_272 * 5120
    kw = dict(batch=64, prompt_len=4096, gen_len=1024, tp=8, ep=8)
    tp, dp = (estimate_memory(m, p, H200, dp_attention=d, **kw) for d in (False, True))
    for mem, groups in ((tp, 1), (dp, 8)):
        free = mem.usable_bytes - mem.weights_bytes - mem.activation_peak_bytes
        assert mem.max_batch == groups * np.floor(free / per_seq)
        assert mem.kv_bytes_per_token == 70_272
    assert (tp.max_batch, dp.max_batch) == (114, 632)
    assert tp.kv_cache_bytes == 64 * per_seq and dp.kv_cache_bytes == 8 * per_seq  # 64 sequences over 8 GPUs
    assert dp.weights_bytes > tp.weights_bytes


def test_dp_attention_keeps_every_kv_head_of_its_sequences():
    """Llama-3.1-8B at tp 4: 2 of 8 KV heads a GPU for every sequence, or all 8 for a quarter of them."""
    m = load_model("llama-3.1-8b")
    assert kv_bytes_per_token_per_gpu(m, BF16, tp=4) == 32 * 2 * 2 * 128 * 2
    assert kv_bytes_per_token_per_gpu(m, BF16, tp=4, dp_attention=True) == 32 * 2 * 8 * 128 * 2
    mem = estimate_memory(m, BF16, H200, batch=10, prompt_len=1000, gen_len=24, tp=4, dp_attention=True)
    assert mem.kv_cache_bytes == 3 * 1024 * 131_072  # ceil(10 / 4) sequences of 1024 tokens


def test_kv_per_stage_from_its_own_layers():
    """gpt-oss-20b on 5 stages (layers 0-4, 5-9, ...): stage 1 has 3 full + 2 sliding layers, the
    most KV; at 8192 tokens it holds (3 x 8192 + 2 x 128) x 2048 B a sequence."""
    m = ModelSpec(**GPT_OSS_20B)
    mem = memory_arrays(m, BF16, H200, Conventions(), tp=1, pp=5, batch=[1], prompt_len=[8000], gen_len=[192])
    assert mem["kv_cache_bytes"][0] == (3 * 8192 + 2 * 128) * 2048
    assert mem["kv_bytes_per_token"][0] == 5 * 2048


def test_mean_kv_over_a_generation_matches_a_step_by_step_sum():
    """The closed-form means (`_capped_sum` per group) equal the sum over every length of the
    generation, for full, sliding (40) and chunked (24) layers of a small model."""
    m = ModelSpec(name="mix", vocab_size=256, hidden_size=64, num_layers=6, num_heads=4, num_kv_heads=2,
                  ffn_size=128, max_positions=4096, sliding_window=40, attention_chunk_size=24,
                  layer_types=("sliding", "full", "chunked", "chunked", "sliding", "chunked"))
    per_layer = 2 * 2 * 16 * 2
    prompt, gen, bs = 13, 90, 16
    mem = memory_arrays(m, Precision(), H200, Conventions(block_size=bs), tp=1, pp=1, batch=[1],
                        prompt_len=[prompt], gen_len=[gen])
    lengths = np.arange(prompt + 1, prompt + gen + 1)
    use = {"full": lengths, "sliding": np.minimum(lengths, 40), "chunked": (lengths - 1) % 24 + 1}
    counts = {"full": 1, "sliding": 2, "chunked": 3}
    used = sum(counts[k] * use[k] for k in use) * per_layer
    paged = sum(counts[k] * np.ceil(use[k] / bs) * bs for k in use) * per_layer
    assert mem["kv_used_bytes"][0] == pytest.approx(used.mean(), rel=1e-12)
    assert mem["kv_paged_bytes"][0] == pytest.approx(paged.mean(), rel=1e-12)
    # the allocation bound at the end: chunked layers a whole chunk, sliding ones the window
    assert mem["kv_cache_bytes"][0] == (1 * 112 + 2 * 48 + 3 * 32) * per_layer


# ---- activations -----------------------------------------------------------------------------------
def test_deepseek_v3_prefill_activation_peak_by_hand():
    """8192 tokens, bf16, tp 1: stream 2 x 8192 x 7168 x 2 B; unabsorbed MLA materialises per token
    Q and K of 128 x 192, V and the output of 128 x 128, and the latents 512 + 64 + 1536: 84,032
    values; the FFNs (dense 18432, or 8 routed + 1 shared of 2048: also 18432) x 3 = 55,296 are
    fewer; logits of the last position 129,280 x 4 B. 234,881,024 + 1,376,780,288 + 517,120."""
    m = ModelSpec(**DEEPSEEK_V3)
    assert activation_peak_bytes(m, BF16, 1, 8192, 8192) == 234_881_024 + 8192 * 84_032 * 2 + 517_120
    # a dense FFN 4x as wide dominates, and it counts only while some layer is dense
    wide = m.scaled(ffn_size=4 * 18432)
    assert activation_peak_bytes(wide, BF16, 1, 8192, 8192) == 234_881_024 + 8192 * 73_728 * 3 * 2 + 517_120
    assert activation_peak_bytes(wide.scaled(dense_layers=()), BF16, 1, 8192, 8192) == \
        activation_peak_bytes(m, BF16, 1, 8192, 8192)


def test_activation_with_dp_attention_and_expert_parallelism():
    """Llama-3.1-8B at tp 4 with DP attention: all 32 + 8 heads on a GPU's own tokens; the FFN shard
    (14336 / 4) sees the tokens of the 4 GPUs. Experts split ep ways: the same bytes on average."""
    m = load_model("llama-3.1-8b")
    t = 1000
    got = activation_peak_bytes(m, BF16, 1, t, t, tp=4, dp_attention=True)
    attn = t * (2 * 32 + 2 * 8) * 128 * 2
    ffn = 4 * t * 3584 * 3 * 2
    assert got == 2 * t * 4096 * 2 + max(attn, ffn) + 32_064 * 4
    ds = ModelSpec(**DEEPSEEK_V3)
    assert activation_peak_bytes(ds, BF16, 2, 512, 512, tp=8, ep=8) == \
        activation_peak_bytes(ds, BF16, 2, 512, 512, tp=8)


# ---- unchanged -------------------------------------------------------------------------------------
def test_uniform_models_unchanged_bit_for_bit():
    """Values the code before issue 22 returned (every catalog model, three precisions, five
    parallelisms, both conventions were compared bit for bit; two are kept here)."""
    a10 = HardwareSpec(name="a10-test", peak_tflops={"fp32": 31.2, "fp16": 125, "bf16": 125, "int8": 250},
                       memory_bandwidth_gbps=600, memory_gib=22.5, interconnect_gbps=64, num_sms=72,
                       sram_per_sm_kib=128, l2_cache_mib=6)
    arrays = dict(batch=[1, 7, 64], prompt_len=[100, 5000, 10000], gen_len=[1, 300, 9000])
    mix = load_model("mixtral-8x7b")
    p = Precision(weights="int4", activations="bf16", kv="fp8")
    assert stage_weight_bytes(mix, p, 4, 2) == [3_082_682_368.0, 3_082_690_560.0]
    mem = memory_arrays(mix, p, a10, Conventions(), tp=4, pp=2, **arrays)
    assert mem["max_batch"].tolist() == [19808, 417, 116]
    assert mem["kv_used_bytes"].tolist() == [827_392.0, 42_192_896.0, 118_788_096.0]
    mistral = load_model("mistral-7b")
    conv = Conventions(attention="naive", block_size=32, max_seq_len=20000, all_logits=True)
    mem = memory_arrays(mistral, BF16, a10, conv, tp=2, pp=1, **arrays)
    assert stage_weight_bytes(mistral, BF16, 2, 1) == [7_241_998_336.0]
    assert mem["max_batch"].tolist() == [1128, 35, 35]
    assert mem["kv_used_bytes"].tolist() == [6_619_136.0, 268_435_456.0, 268_435_456.0]
    assert activation_peak_bytes(mistral, BF16, np.array([1, 3]), np.array([17, 4096]), np.array([17, 9000]),
                                 tp=2, attention="naive").tolist() == [1_073_664.0, 6_769_012_224.0]


def test_kv_window_is_a_convention():
    with pytest.raises(SpecError, match="kv_window: must be one of capped, full, got 'ideal'"):
        Conventions(kv_window="ideal")
    m = load_model("mistral-7b")  # every layer slides (4096): full pages give back the whole context
    capped, full = (estimate_memory(m, BF16, H200, batch=1, prompt_len=9000, gen_len=1000, kv_window=w)
                    for w in ("capped", "full"))
    assert capped.kv_cache_bytes == 4096 * 131_072 and full.kv_cache_bytes == 10_000 * 131_072


# ---- properties ------------------------------------------------------------------------------------
@st.composite
def mixed_models(draw):  # noqa: ANN001, ANN201
    """Small models with every per-layer feature: attention kinds, MLA or GQA, dense and MoE layers,
    shared experts, biases, norms."""
    layers = draw(st.integers(1, 7))
    types = tuple(draw(st.lists(st.sampled_from(["full", "sliding", "chunked"]), min_size=layers, max_size=layers)))
    experts = draw(st.sampled_from([1, 4, 8]))
    mla = draw(st.booleans())
    kw = dict(name="mixed", vocab_size=draw(st.integers(50, 300)), hidden_size=64, num_layers=layers,
              num_heads=4, num_kv_heads=draw(st.sampled_from([1, 2, 4])), ffn_size=draw(st.sampled_from([64, 128])),
              max_positions=4096, layer_types=types, sliding_window=draw(st.integers(1, 300)),
              attention_chunk_size=draw(st.integers(1, 300)), sandwich_norms=draw(st.booleans()),
              tied_embeddings=draw(st.booleans()), qkv_bias=draw(st.booleans()), out_bias=draw(st.booleans()),
              mlp_bias=draw(st.booleans()), norm_kind=draw(st.sampled_from(["rmsnorm", "layernorm"])))
    if mla:
        kw.update(kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
                  q_lora_rank=draw(st.sampled_from([None, 24])))
    else:
        kw.update(qk_norm=draw(st.sampled_from([None, "rmsnorm"])), attn_sinks=draw(st.booleans()))
    if experts > 1:
        kw.update(num_experts=experts, experts_per_token=2, moe_ffn_size=draw(st.sampled_from([32, 64])),
                  shared_experts=draw(st.integers(0, 2)), router_bias=draw(st.booleans()),
                  router_score_bias=draw(st.booleans()),
                  dense_layers=tuple(i for i in range(layers - 1) if draw(st.booleans())))
    return ModelSpec(**kw)


@settings(max_examples=60, deadline=None)
@given(mixed_models(), st.sampled_from([1, 2, 3]))
def test_stages_sum_to_the_parameter_count_for_mixed_layers(m, pp):
    pp = min(pp, m.num_layers)
    tied_copy = m.vocab_size * m.hidden_size if (m.tied_embeddings and pp > 1) else 0
    assert sum(stage_weight_bytes(m, Precision.uniform("fp32"), pp=pp)) == 4 * (m.param_count + tied_copy)


@settings(max_examples=60, deadline=None)
@given(mixed_models(), st.integers(1, 64), st.integers(1, 3000), st.integers(1, 3000), st.integers(1, 2000),
       st.sampled_from([1, 16, 32]))
def test_kv_linear_in_batch_monotone_in_context_and_capped_below_full(m, batch, p1, p2, gen, block):
    """KV bytes are linear in the batch and non-decreasing in the context; capped <= full pages and so
    max batch capped >= full; what max batch promises fits and one more does not."""
    hw = _hw(2 * GIB)
    conv = Conventions(block_size=block, mem_util=1.0)
    run = lambda c, **kw: memory_arrays(m, BF16, hw, c, tp=1, pp=1, **kw)  # noqa: E731
    lo, hi = sorted((p1, p2))
    mem = run(conv, batch=[1, batch, 1], prompt_len=[lo, lo, hi], gen_len=[gen] * 3)
    kv = mem["kv_cache_bytes"]
    assert kv[1] == batch * kv[0] and kv[0] <= kv[2]
    full = run(replace(conv, kv_window="full"), batch=[1, batch, 1], prompt_len=[lo, lo, hi], gen_len=[gen] * 3)
    assert np.all(kv <= full["kv_cache_bytes"]) and np.all(mem["max_batch"] >= full["max_batch"])
    fixed = mem["weights_bytes"] + mem["activation_bytes"]
    per_seq = [kv / [1, batch, 1], full["kv_cache_bytes"] / [1, batch, 1]]
    for mb, per_seq in zip((mem["max_batch"], full["max_batch"]), per_seq):
        assert np.all((mb == 0) | (fixed + mb * per_seq <= mem["usable_bytes"]))
        assert np.all(fixed + (mb + 1) * per_seq > mem["usable_bytes"])
