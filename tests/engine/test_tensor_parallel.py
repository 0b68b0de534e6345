"""Tensor parallelism (`llmperf.engine.tensor_parallel`): the shards of a model reproduce its logits and its
greedy tokens (fp32), with the vocabulary split (a padded one too) or whole, the sums and the logits' gather
sit where the analytical model prices them, what cannot be split exactly is refused by name, and ranks run
as real processes (gloo on CPU; NCCL where two GPUs exist).

The shard math is checked in one process: each shard runs in a thread whose `all_reduce` adds the
shards' partial outputs behind a barrier (deterministic: every thread sums rank 0's part then rank 1's).
Two runs spawn processes (about 4 s each on 2 cores): a generation and a failing rank.
"""

from __future__ import annotations

import math
import threading

import pytest
import torch

from llmperf.engine import Engine, Recorder, SamplingParams, build_model
from llmperf.engine.tensor_parallel import (
    COLLECTIVE_OPS,
    REDUCE_OPS,
    run_ranks,
    shard_model,
    shard_spec,
    tp_generate,
    vocab_rows,
)
from llmperf.errors import SpecError
from llmperf.specs import ModelSpec

from engine_testing import tiny

SPECS = {
    "llama": lambda: tiny("llama-3.1-8b"),  # GQA 4:2
    # q/k/v, o and FFN biases (the row-parallel ones added once), learned sinks (per head)
    "llama_biases_sinks": lambda: tiny("llama-3.1-8b", qkv_bias=True, out_bias=True, mlp_bias=True, attn_sinks=True),
    "qwen3": lambda: tiny("qwen3-8b", head_dim=32),  # q/k RMSNorm per head; q_size 128 != hidden 64
    # sandwich norms (the sums come before them), soft-caps, (1 + w) norms, GeGLU, a window of 4, biases
    "gemma2": lambda: tiny("gemma-2-9b", sliding_window=4, attn_softcap=5.0, final_softcap=8.0, qkv_bias=True,
                           out_bias=True, mlp_bias=True),
    "gemma3": lambda: tiny("gemma-3-27b", sliding_window=4, layer_types=("sliding", "full"), qkv_bias=True,
                           out_bias=True, mlp_bias=True),  # q/k norms, local and global rotary bases
    "gpt2": lambda: tiny("gpt2", num_kv_heads=4, ffn_size=256),  # LayerNorm, GELU, biases, tied embeddings
    "llama_vocab_255": lambda: tiny("llama-3.1-8b", vocab_size=255),  # a vocabulary tp 2 does not divide: padded
}
TOKENS = torch.randint(0, 255, (2, 7), generator=torch.Generator().manual_seed(1))  # longer than the windows


def _reducers(world: int) -> list:
    """`world` in-place sums over threads: each writes its part, all sum the parts in rank order."""
    barrier = threading.Barrier(world, timeout=60)
    parts: list = [None] * world

    def reducer(rank: int):
        def all_reduce(t: torch.Tensor) -> None:
            parts[rank] = t.clone()
            barrier.wait()
            total = parts[0].clone()
            for p in parts[1:]:
                total += p
            barrier.wait()  # every rank has read every part before any is overwritten
            t.copy_(total)
        return all_reduce

    return [reducer(r) for r in range(world)]


def _in_threads(fns: list) -> list:
    """Each of `fns` run in a thread of its own; their results in order (a failure is raised)."""
    out: list = [None] * len(fns)
    errors: list = []

    def run(i: int) -> None:
        try:
            out[i] = fns[i]()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    return out


# ---- shard_spec ---------------------------------------------------------------------------------
def test_a_rank_runs_a_spec_of_its_heads_and_ffn_columns():
    spec = SPECS["qwen3"]()
    shard = shard_spec(spec, 2)
    assert (shard.num_heads, shard.num_kv_heads, shard.ffn_size) == (2, 1, 64)
    assert (shard.head_dim, shard.rotary_dim) == (spec.head_dim, spec.rotary_dim) == (32, 32)
    changed = {f for f, v in shard.to_dict().items() if v != spec.to_dict()[f]}
    assert changed == {"num_heads", "num_kv_heads", "ffn_size"}
    assert shard_spec(spec, 1) == spec


def _mla_spec() -> ModelSpec:
    return ModelSpec(name="mla", vocab_size=128, hidden_size=64, num_layers=2, num_heads=4, head_dim=32, ffn_size=96,
                     max_positions=64, kv_lora_rank=32, q_lora_rank=48, qk_nope_head_dim=16, qk_rope_head_dim=16,
                     v_head_dim=24, rotary_dim=16, rope_interleaved=True)


@pytest.mark.parametrize("spec,world,match", [
    (lambda: tiny("llama-3.1-8b"), 3, r"--tp 3: num_heads=4 is not divisible by 3"),
    (lambda: tiny("llama-3.1-8b"), 4, r"--tp 4: num_kv_heads=2 is not divisible by 4"),
    (lambda: tiny("llama-3.1-8b", num_kv_heads=4, ffn_size=130), 4, r"--tp 4: ffn_size=130 is not divisible by 4"),
    (lambda: tiny("mixtral-8x7b"), 2, r"num_experts: .*mixture of experts \(num_experts=8\)"),
    (_mla_spec, 2, r"kv_lora_rank: .*latent attention \(kv_lora_rank=32\)"),
    (lambda: tiny("llama-3.1-8b"), 0, r"world: must be a positive integer, got 0"),
])
def test_what_cannot_be_split_exactly_is_refused_by_name(spec, world, match):
    with pytest.raises(SpecError, match=match):
        shard_spec(spec(), world)
    with pytest.raises(SpecError, match=match):  # before any process is spawned
        tp_generate(spec(), [[1, 2, 3]], world, max_new_tokens=1)


@pytest.mark.parametrize("kw,match", [
    (dict(prompts=[[1, 256]]), r"prompts: token ids \[256\] are outside the vocabulary of 256"),
    (dict(prompts=[[]]), r"prompts: expected at least one non-empty prompt"),
    (dict(max_new_tokens=254), r"max_new_tokens: 3 prompt \+ 254 new tokens exceed the model's max_positions=256"),
    (dict(attention="flash"), r"attention: must be one of sdpa, naive, triton"),
    (dict(device="mps"), r"device: must be 'cpu' or 'cuda'"),
])
def test_bad_requests_are_refused_before_any_process_starts(kw, match):
    args = dict(prompts=[[1, 2, 3]], max_new_tokens=2) | kw
    with pytest.raises(ValueError, match=match):
        tp_generate(SPECS["llama"](), args.pop("prompts"), 2, **args)


# ---- the shards' math, in one process -------------------------------------------------------------
def _gatherers(world: int) -> list:
    """`world` all-gathers over threads along the last dimension, in rank order (exact copies)."""
    barrier = threading.Barrier(world, timeout=60)
    parts: list = [None] * world

    def gatherer(rank: int):
        def all_gather(t: torch.Tensor) -> torch.Tensor:
            parts[rank] = t.clone()
            barrier.wait()
            out = torch.cat(parts, dim=-1)
            barrier.wait()
            return out
        return all_gather

    return [gatherer(r) for r in range(world)]


@pytest.mark.parametrize("vocab_parallel", [True, False])
@pytest.mark.parametrize("layout", ["auto", "in_out"])
@pytest.mark.parametrize("name", list(SPECS))
def test_shards_sum_to_the_whole_models_logits(name, layout, vocab_parallel):
    model = build_model(SPECS[name](), seed=0, weight_layout=layout)
    ref = model(TOKENS, all_logits=True)  # (B, T, V)
    shards = [shard_model(model, r, 2, red, gat, vocab_parallel=vocab_parallel)
              for r, (red, gat) in enumerate(zip(_reducers(2), _gatherers(2)))]
    outs = _in_threads([lambda s=s: s(TOKENS, all_logits=True) for s in shards])
    assert outs[0].shape == ref.shape  # the padded vocabulary's tail cut
    assert torch.equal(outs[0], outs[1])  # every rank holds the same logits
    err = (outs[0] - ref).abs().max() / ref.abs().max()
    assert err <= 1e-5, f"{name} ({layout}): relative error {float(err):.2e}"


@pytest.mark.parametrize("name,world", [("llama", 2), ("gpt2", 4), ("llama_vocab_255", 2), ("gpt2_vocab_250", 4)])
def test_vocabulary_shards_give_the_whole_models_logits_without_an_all_gather(name, world):
    """The default gather (made of the sum: each rank's slice in place, zeros elsewhere) is exact too;
    4 ranks of a 250-token tied vocabulary: 63 rows each, the last holding 61 and 2 rows of padding."""
    spec = tiny("gpt2", num_kv_heads=4, ffn_size=256, vocab_size=250) if name == "gpt2_vocab_250" else SPECS[name]()
    model = build_model(spec, seed=0)
    tokens = TOKENS % spec.vocab_size
    ref = model(tokens, all_logits=True)
    shards = [shard_model(model, r, world, red) for r, red in enumerate(_reducers(world))]
    outs = _in_threads([lambda s=s: s(tokens, all_logits=True) for s in shards])
    assert all(torch.equal(o, outs[0]) for o in outs) and outs[0].shape == ref.shape
    assert float((outs[0] - ref).abs().max() / ref.abs().max()) <= 1e-5


def test_a_shard_holds_its_slices_and_the_row_parallel_biases_once():
    spec = SPECS["llama_biases_sinks"]()
    model = build_model(spec, seed=0)
    first, second = (shard_model(model, r, 2, lambda t: None) for r in range(2))
    whole, b0, b1 = model.layers[0], first.layers[0], second.layers[0]
    q, kv = spec.q_size, spec.kv_size  # 64, 32: [q | k | v] rows of the (out, in) matrix
    assert b1.qkv_weight.equal(torch.cat([whole.qkv_weight[32:64], whole.qkv_weight[q + 16:q + 32],
                                          whole.qkv_weight[q + kv + 16:]]))
    assert b1.up_weight.equal(torch.cat([whole.up_weight[64:128], whole.up_weight[192:]]))  # [gate | up]
    assert b1.o_weight.equal(whole.o_weight[:, 32:]) and b1.down_weight.equal(whole.down_weight[:, 64:])
    assert b1.sinks.equal(whole.sinks[2:]) and b1.attn_norm.weight.equal(whole.attn_norm.weight)
    assert b0.o_bias.equal(whole.o_bias) and b0.down_bias.equal(whole.down_bias)
    assert b1.o_bias is None and b1.down_bias is None
    # the vocabulary's second half: embedding rows, LM head rows ((V, C), out_in)
    assert second.embed_weight.equal(model.embed_weight[128:])
    assert second.lm_head_weight.equal(model.lm_head_weight[128:])
    assert (first.vocab_start, second.vocab_start) == (0, 128)
    whole_head = shard_model(model, 1, 2, lambda t: None, vocab_parallel=False)
    assert whole_head.lm_head_weight.equal(model.lm_head_weight) and whole_head.embed_weight.equal(model.embed_weight)
    assert whole_head.gather_logits is None and whole_head.embed_reduce is None
    assert not first.decode_in_one_call and model.decode_in_one_call and whole.reduce is None
    with pytest.raises(ValueError, match="rank: must be an integer in"):
        shard_model(model, 2, 2, lambda t: None)


def test_a_tied_padded_vocabulary_shards_one_tensor():
    """GPT-2's LM head is its embedding: one (V_r, C) tensor a rank, zero rows past the vocabulary."""
    spec = tiny("gpt2", num_kv_heads=4, ffn_size=256, vocab_size=250)
    model = build_model(spec, seed=0)
    assert vocab_rows(250, 3, 4) == (189, 63)
    last = shard_model(model, 3, 4, lambda t: None)
    assert last.lm_head_weight is last.embed_weight and last.embed_weight.shape == (63, spec.hidden_size)
    assert last.embed_weight[:61].equal(model.embed_weight[189:]) and not last.embed_weight[61:].any()


def test_the_sums_come_after_the_projections_and_before_the_post_norms():
    """Gemma's sandwich norms normalise the whole sum: o_proj, attn_allreduce, post_attn_norm,
    attn_residual; down_proj, mlp_allreduce, post_mlp_norm, mlp_residual, each allreduce once a layer
    and named as the analytical model prices it; the vocabulary's two once a pass: embed,
    embed_allreduce, embed_scale; lm_head, logits_gather, final_softcap."""
    model = build_model(SPECS["gemma2"](), seed=0)
    shapes = []
    shard = shard_model(model, 0, 2, lambda t: shapes.append(tuple(t.shape)))
    rec = Recorder("cpu")
    B, T = TOKENS.shape
    with rec.step("prefill", batch=B, q_len=T, kv_len=T, tokens_in_cache=B * T):
        shard(TOKENS, rec=rec)
    # the embedding's sum, two a layer, and the logits' gather (made of the sum: B rows of the whole vocabulary)
    C, V = model.spec.hidden_size, model.spec.vocab_size
    assert shapes == [(1, B * T, C)] * (1 + 2 * model.spec.num_layers) + [(B, V)]
    model_level = [r.op for r in rec.trace.ops if r.layer is None]
    assert [op for op in model_level if op in COLLECTIVE_OPS] == ["embed_allreduce", "logits_gather"]
    for before, after in (("embed", "embed_allreduce"), ("embed_allreduce", "embed_scale"),
                          ("lm_head", "logits_gather"), ("logits_gather", "final_softcap")):
        assert model_level.index(before) < model_level.index(after)
    for vocab_parallel, world in ((False, 2), (True, 1)):  # the vocabulary whole: no collective of its own
        rec = Recorder("cpu")
        with rec.step("prefill", batch=B, q_len=T, kv_len=T, tokens_in_cache=B * T):
            shard_model(model, 0, world, lambda t: None, vocab_parallel=vocab_parallel)(TOKENS, rec=rec)
        assert not {r.op for r in rec.trace.ops if r.layer is None} & set(COLLECTIVE_OPS)
    for layer in range(model.spec.num_layers):
        ops = [r.op for r in rec.trace.ops if r.layer == layer]
        assert [op for op in ops if op in REDUCE_OPS] == ["attn_allreduce", "mlp_allreduce"]
        for before, after in zip(("o_proj", "attn_allreduce", "post_attn_norm", "down_proj", "mlp_allreduce",
                                  "post_mlp_norm"),
                                 ("attn_allreduce", "post_attn_norm", "attn_residual", "mlp_allreduce",
                                  "post_mlp_norm", "mlp_residual")):
            assert ops.index(before) < ops.index(after)


def _generate(model, prompts, n: int) -> list[list[int]]:
    B, T = len(prompts), max(len(p) for p in prompts)
    engine = Engine(model, cache="contiguous", max_batch=B, max_seq_len=T + n)
    return [o.tokens for o in engine.generate(prompts, SamplingParams(max_new_tokens=n))]


@pytest.mark.parametrize("name", ["llama", "gemma3", "gpt2", "llama_vocab_255"])
def test_shards_generate_the_whole_models_tokens(name):
    """The engine's greedy generation on two shards (prefill and decode steps through their KV caches
    of half the heads) equals the whole model's, token for token."""
    model = build_model(SPECS[name](), seed=0)
    prompts = TOKENS.tolist()
    shards = [shard_model(model, r, 2, red) for r, red in enumerate(_reducers(2))]
    out = _in_threads([lambda s=s: _generate(s, prompts, 6) for s in shards])
    assert out[0] == out[1] == _generate(model, prompts, 6)


def test_a_shard_never_decodes_in_one_call():
    """The CPU's one-call decode step would skip the sums: a shard's layers run one by one even when
    `decode_in_one_call` is turned back on (one rank: the sum over ranks is the identity)."""
    model = build_model(SPECS["llama"](), seed=0)
    calls = []
    shard = shard_model(model, 0, 1, lambda t: calls.append(1))
    shard.decode_in_one_call = True
    engine = Engine(shard, cache="contiguous", max_batch=2, max_seq_len=7 + 5)
    tokens = [o.tokens for o in engine.generate(TOKENS.tolist(), SamplingParams(max_new_tokens=5))]
    assert tokens == _generate(model, TOKENS.tolist(), 5)
    assert len(calls) == 2 * model.spec.num_layers * len(engine.last_steps)


# ---- processes --------------------------------------------------------------------------------------
def test_two_gloo_processes_generate_the_whole_models_tokens():
    spec = SPECS["llama_biases_sinks"]()
    prompts = TOKENS[:, :6]
    res = tp_generate(spec, prompts, 2, max_new_tokens=8, threads_per_rank=1, record=True)
    assert res.tokens == _generate(build_model(spec, seed=0), prompts.tolist(), 8)
    assert (res.world, res.backend, res.threads_per_rank) == (2, "gloo", 1)
    assert [s[:4] for s in res.steps] == [("prefill", 2, 6, 6)] + [("decode", 2, 1, 6 + i) for i in range(1, 8)]
    assert all(s[4] > 0 for s in res.steps)
    assert len(res.allreduce_s) == 8 and all(math.isfinite(t) and t >= 0 for t in res.allreduce_s)
    assert res.vocab_parallel  # the real all-gather between processes (`_gather_over_ranks`)
    assert list(res.to_frame().columns) == ["phase", "batch", "q_len", "kv_len", "seconds", "allreduce_s"]


def _fails_on_rank_1(rank: int, world: int) -> int:
    import torch.distributed as dist

    if rank == 1:
        raise ValueError("rank 1 refuses")
    dist.all_reduce(torch.ones(1))  # rank 0 waits for a partner that has gone
    return rank


def test_a_failing_rank_raises_in_the_parent_with_its_message():
    with pytest.raises(RuntimeError, match="rank 1 of 2 failed: ValueError: rank 1 refuses"):
        run_ranks(2, _fails_on_rank_1, backend="gloo", threads_per_rank=1, timeout_s=120)


@pytest.mark.parametrize("world", [
    # one GPU (every lent machine so far): the NCCL group, the spawned CUDA rank, the timed collectives' hooks
    pytest.param(1, marks=pytest.mark.skipif(torch.cuda.device_count() < 1, reason="needs a CUDA device")),
    pytest.param(2, marks=pytest.mark.skipif(torch.cuda.device_count() < 2,
                                             reason="needs a CUDA device per rank (two)")),
])
def test_nccl_processes_generate_the_whole_models_tokens(world):
    spec = SPECS["llama"]()
    prompts = TOKENS[:, :6]
    res = tp_generate(spec, prompts, world, max_new_tokens=8, device="cuda", record=True)
    assert res.backend == "nccl"
    assert res.tokens == _generate(build_model(spec, seed=0, device="cuda"), prompts.tolist(), 8)
    assert res.allreduce_s is not None and len(res.allreduce_s) == len(res.steps)
