"""Tensor parallelism's vocabulary collectives (`ForwardModel.embed_allreduce`, `ForwardModel.logits_gather`):
absent at tp 1, once a forward pass at tp > 1 with their exact bus bytes and collective kind, a step's
time grows by exactly their priced times, and pipeline stages, data-parallel attention and tied
embeddings leave them once a pass. Their source: vLLM's `VocabParallelEmbedding.forward` (mask, look
up, all-reduce) and `LogitsProcessor._gather_logits` (gather the vocabulary slices before sampling)."""

from __future__ import annotations

import numpy as np
import pytest

from llmperf.analysis import ForwardModel
from llmperf.analysis.collectives import OP_COLLECTIVE, latency_share, load_collectives
from llmperf.analysis.rollup import decode_sums, phase_arrays, stage_weight_bytes
from llmperf.analysis.roofline import op_time
from llmperf.analysis.timemodel import time_model_for
from llmperf.specs import Precision, load_hardware, load_model

VOCAB_OPS = ("embed_allreduce", "logits_gather")
H100 = load_hardware("h100-sxm")


class _WithoutVocabComm(ForwardModel):
    """The same model without the two collectives (what the pass cost before them)."""

    def head_ops(self, batch, q_len, kv_len):  # noqa: ANN001, ANN201
        return [c for c in super().head_ops(batch, q_len, kv_len) if c.name not in VOCAB_OPS]

    def tail_ops(self, batch, q_len, kv_len):  # noqa: ANN001, ANN201
        return [c for c in super().tail_ops(batch, q_len, kv_len) if c.name not in VOCAB_OPS]


def _vocab_ops(fm: ForwardModel, batch, q_len, kv_len) -> dict:  # noqa: ANN001
    return {c.name: c for c in fm.forward_ops(batch, q_len, kv_len) if c.name in VOCAB_OPS}


@pytest.mark.parametrize("name", ["llama-3.1-8b", "gpt2", "gemma-2-9b"])
def test_none_at_tp_1(name):
    fm = ForwardModel(model=load_model(name), precision=Precision())
    assert not _vocab_ops(fm, 4, 1, 100) and not _vocab_ops(fm, 2, 64, 64)


@pytest.mark.parametrize("tp", [2, 4, 8])
@pytest.mark.parametrize("all_logits", [False, True])
def test_their_bus_bytes_and_collectives(tp, all_logits):
    """embed_allreduce: a ring all-reduce of tokens x hidden at the activation dtype, 2(t-1)/t of it on
    the bus; logits_gather: an all-gather of rows x padded vocabulary (t x ceil(V / t)) at the
    activation dtype (the LM head's output dtype), (t-1)/t of it (nccl-tests' bus bytes)."""
    m = load_model("llama-3.1-8b").scaled(vocab_size=32001)  # padded at every tp: 32002, 32004, 32008
    p = Precision()
    fm = ForwardModel(model=m, precision=p, tp=tp, all_logits=all_logits)
    B, T = 3, 17
    ops = _vocab_ops(fm, B, T, T)
    e, g = ops["embed_allreduce"], ops["logits_gather"]
    padded = tp * -(-32001 // tp)
    rows = B * T if all_logits else B
    assert e.comm_bytes == pytest.approx(2 * (tp - 1) / tp * B * T * m.hidden_size * p.act_bytes, rel=1e-15)
    assert g.comm_bytes == pytest.approx((tp - 1) / tp * rows * padded * p.act_bytes, rel=1e-15)
    assert (e.rows, g.rows, e.comm_gpus, g.comm_gpus) == (B * T, rows, tp, tp)
    assert (e.kind, g.kind, e.per_layer, g.per_layer) == ("comm", "comm", False, False)
    assert (OP_COLLECTIVE["embed_allreduce"], OP_COLLECTIVE["logits_gather"]) == ("all_reduce", "all_gather")
    assert latency_share("embed_allreduce") == 1.0 and latency_share("logits_gather") == 0.5
    names = [c.name for c in fm.forward_ops(B, 1, 50)]
    assert names[:2] == ["embed", "embed_allreduce"] and names[-2:] == ["lm_head", "logits_gather"]
    assert names.count("embed_allreduce") == names.count("logits_gather") == 1


def test_the_gather_is_priced_as_an_all_gather_by_the_collectives_model():
    """Under `typical`: half an all-reduce's latency over the same GPUs plus its bus bytes at the
    all-reduce's bus bandwidth (`Collectives.time_s(..., "all_gather")`)."""
    fm = ForwardModel(model=load_model("llama-3.1-70b"), precision=Precision(), tp=8)
    tm = time_model_for(H100, "typical", "bf16")
    g = _vocab_ops(fm, 16, 1, 1000)["logits_gather"]
    e = _vocab_ops(fm, 16, 1, 1000)["embed_allreduce"]
    coll = load_collectives()
    link = H100.interconnect_bytes_per_s
    t = op_time(g, H100, "bf16", tm)
    assert float(t.comm_s) == pytest.approx(coll.time_s(H100.name, link, 8, g.comm_bytes, "all_gather"), rel=1e-12)
    assert float(op_time(e, H100, "bf16", tm).comm_s) == pytest.approx(
        coll.time_s(H100.name, link, 8, e.comm_bytes, "all_reduce"), rel=1e-12)


@pytest.mark.parametrize("efficiency", ["roofline", "typical"])
@pytest.mark.parametrize("name,tp", [("llama-3.1-70b", 8), ("gemma-2-9b", 2), ("gpt2", 4)])
def test_a_step_costs_exactly_their_priced_times_more(name, tp, efficiency):
    """A decode step (and a prefill) with them minus without them is their two priced times; the decode
    steps' sum grows by that times the steps (their counts do not depend on the context)."""
    m, p = load_model(name), Precision()
    kw = dict(model=m, precision=p, tp=tp, fused_qkv=True, fused_gate_up=True)
    fm, without = ForwardModel(**kw), _WithoutVocabComm(**kw)
    tm = time_model_for(H100, efficiency, "bf16")
    for B, q, kv in ((8, 1, 300), (2, 128, 128)):
        extra = sum(float(op_time(c, H100, "bf16", tm).time_s) for c in _vocab_ops(fm, B, q, kv).values())
        assert extra > 0
        got = phase_arrays(fm, H100, B, q, kv, pp=1, compute_dtype="bf16", time_model=tm).time_s
        base = phase_arrays(without, H100, B, q, kv, pp=1, compute_dtype="bf16", time_model=tm).time_s
        assert float(got - base) == pytest.approx(extra, rel=1e-9)
    steps_with = decode_sums(fm, H100, 8, 300, 33, pp=1, compute_dtype="bf16", time_model=tm)[0]
    steps_without = decode_sums(without, H100, 8, 300, 33, pp=1, compute_dtype="bf16", time_model=tm)[0]
    one = sum(float(op_time(c, H100, "bf16", tm).time_s) for c in _vocab_ops(fm, 8, 1, 301).values())
    assert float(steps_with - steps_without) == pytest.approx(32 * one, rel=1e-9)


def test_pipeline_stages_run_them_once_a_pass():
    """With pp stages the embedding sits on the first stage and the LM head on the last: each
    collective once a pass (a pp = 2 step differs from a pp = 1 step by the stage-to-stage send only),
    and the vocabulary shards' bytes on the first and the last stage."""
    m, p = load_model("llama-3.1-70b"), Precision()
    fm = ForwardModel(model=m, precision=p, tp=4)
    tm = time_model_for(H100, "typical", "bf16")
    one = phase_arrays(fm, H100, 8, 1, 500, pp=1, compute_dtype="bf16", time_model=tm)
    two = phase_arrays(fm, H100, 8, 1, 500, pp=2, compute_dtype="bf16", time_model=tm)
    send = load_collectives().time_s(H100.name, H100.interconnect_bytes_per_s, 2, 8 * m.hidden_size * p.act_bytes,
                                     "send")
    assert float(two.time_s - one.time_s) == pytest.approx(send, rel=1e-9)
    assert float(two.op_time_s) == pytest.approx(float(one.op_time_s), rel=1e-12)
    first, last = stage_weight_bytes(m, p, tp=4, pp=2)
    small = stage_weight_bytes(m.scaled(vocab_size=4), p, tp=4, pp=2)  # one vocabulary row a GPU
    shard = (-(-m.vocab_size // 4) - 1) * m.hidden_size * p.embedding_bytes
    assert first - small[0] == pytest.approx(shard) and last - small[1] == pytest.approx(shard)


def test_data_parallel_attention_sums_the_groups_tokens():
    """With dp_attention the embedding stays vocabulary-split (`stage_weight_bytes`), so its
    all-reduce covers the group's tokens, as the dense FFN's collective does; the LM head runs the
    group's rows at vocab / tp, gathered the same way."""
    m = load_model("deepseek-v3")
    fm = ForwardModel(model=m, precision=Precision(), tp=8, ep=8, dp_attention=True)
    ops = _vocab_ops(fm, 16, 1, 500)
    a = Precision().act_bytes
    assert ops["embed_allreduce"].comm_bytes == pytest.approx(2 * 7 / 8 * 16 * m.hidden_size * a)
    assert ops["logits_gather"].comm_bytes == pytest.approx(7 / 8 * 16 * 8 * -(-m.vocab_size // 8) * a)


def test_a_tied_head_gathers_the_same_logits():
    """GPT-2's LM head is its embedding: the same collectives as an untied head of the same shape."""
    tied = load_model("gpt2")
    untied = tied.scaled(tied_embeddings=False)
    a, b = (_vocab_ops(ForwardModel(model=m, precision=Precision(), tp=4), 4, 1, 100) for m in (tied, untied))
    assert {k: v.comm_bytes for k, v in a.items()} == {k: v.comm_bytes for k, v in b.items()}
    assert np.isclose(a["logits_gather"].comm_bytes, 3 / 4 * 4 * 4 * -(-50257 // 4) * Precision().act_bytes)
