"""Instrumentation: operator names and order equal the analytical model's (`llmperf.analysis`), one
record per layer; off by default; recording does not change the tokens."""

from __future__ import annotations

import pytest
import torch

from llmperf.analysis.operators import ForwardModel
from llmperf.engine import NULL_RECORDER, OP_NAMES, Engine, Recorder, SamplingParams
from llmperf.engine.cpu import kernels as cpu_kernels
from llmperf.specs import Precision

from engine_testing import make_model


def _unique(names):
    return list(dict.fromkeys(names))


@pytest.mark.parametrize("backend", ["sdpa", "naive"])
@pytest.mark.parametrize("kind", ["llama", "gpt2", "mixtral"])
def test_operator_names_follow_the_analytical_model(kind, backend):
    model = make_model(kind, attention=backend)
    rec = Recorder()
    Engine(model).generate([[1, 2, 3, 4, 5]], SamplingParams(max_new_tokens=3), recorder=rec)
    df = rec.trace.to_frame()
    assert set(df["op"]) <= set(OP_NAMES)
    fm = ForwardModel(model=model.spec, precision=Precision.uniform("fp32"),
                      attention="naive" if backend == "naive" else "fused", fused_qkv=True, fused_gate_up=True)
    for phase, T in (("prefill", 5), ("decode", 1)):
        step = df[(df.phase == phase) & (df.step == 0)]
        head = step[step.layer.isna()]
        assert list(head.op) == [o.name for o in fm.head_ops(1, T, T)] + [o.name for o in fm.tail_ops(1, T, T)]
        for layer in range(model.spec.num_layers):
            ops = list(step[step.layer == layer].op)
            expected = [o.name for o in fm.layer_ops(1, T, T)]
            assert _unique(ops) == expected  # MoE: the FFN operators repeat once per expert used
            if kind != "mixtral":
                assert ops == expected
        assert (step.seconds >= 0).all() and (step.q_len == T).all() and (step.batch == 1).all()


def test_step_records_and_frames():
    model = make_model("llama")
    rec = Recorder()
    Engine(model).generate([[1, 2, 3], [4, 5, 6]], SamplingParams(max_new_tokens=4), recorder=rec)
    steps = rec.trace.steps_frame()
    assert list(steps.phase) == ["prefill"] + ["decode"] * 3
    assert list(steps.kv_len) == [3, 4, 5, 6] and list(steps.batch) == [2, 2, 2, 2]
    assert (steps.forward_seconds <= steps.seconds).all()
    totals = rec.trace.op_totals()
    df = rec.trace.to_frame()
    decode_qkv = df[(df.phase == "decode") & (df.op == "qkv_proj")]
    assert totals[("decode", "qkv_proj")] == pytest.approx(decode_qkv.seconds.sum())
    per_layer = df[df.op == "attention"].groupby(["phase", "step"]).size()
    assert (per_layer == model.spec.num_layers).all()


def test_recording_is_off_by_default_and_does_not_change_tokens():
    model = make_model("gpt2", seed=4)
    assert NULL_RECORDER.op("q_proj", 0) is NULL_RECORDER.op("lm_head")  # one shared no-op
    assert not NULL_RECORDER.active
    prompts = [[9, 8, 7, 6], [1, 2]]
    plain = [o.tokens for o in Engine(model).generate(prompts, SamplingParams(max_new_tokens=6))]
    rec = Recorder(ops=True)
    timed = [o.tokens for o in Engine(model).generate(prompts, SamplingParams(max_new_tokens=6), recorder=rec)]
    assert plain == timed and len(rec.trace.ops) > 0
    steps_only = Recorder(ops=False)
    Engine(model).generate(prompts, SamplingParams(max_new_tokens=6), recorder=steps_only)
    # one forward per step: the two prompts (4 and 2 tokens) prefill in ONE forward, then 5 decodes
    assert not steps_only.trace.ops and len(steps_only.trace.steps) == 1 + 5


@pytest.mark.parametrize("layout", ["in_out", "out_in"])
def test_recording_runs_the_same_fused_gemms(layout):
    """With a recorder the model runs exactly what it runs without one (the fused QKV / gate-up GEMMs,
    timed as `qkv_proj` / `gate_up_proj`): the logits are equal bit for bit."""
    model = make_model("llama", seed=6, weight_layout=layout)
    tokens = torch.randint(0, 256, (2, 7))
    rec = Recorder()
    with torch.no_grad():
        fused = model(tokens, all_logits=True)
        with rec.step("prefill", batch=2, q_len=7, kv_len=7, tokens_in_cache=0):
            recorded = model(tokens, all_logits=True, rec=rec)
    torch.testing.assert_close(fused, recorded, rtol=0, atol=0)
    ops = set(rec.trace.to_frame().op)
    assert {"qkv_proj", "gate_up_proj"} <= ops and not ops & {"q_proj", "k_proj", "v_proj", "gate_proj"}


def test_before_op_runs_once_per_operator_outside_the_clock(monkeypatch):
    """`before_op` (what calibrate uses to cool the caches) runs before every timed operator and its
    time is in no operator's figure; the tokens do not change. The recorder's clock is a fake one that
    the hook moves an hour forward, so the check holds however busy the machine is: an operator whose
    clock ran around the hook would read an hour."""
    import types

    from llmperf.engine import instrument

    hour = 3600.0
    clock = types.SimpleNamespace(offset=0.0)
    real = instrument.time.perf_counter
    monkeypatch.setattr(instrument, "time", types.SimpleNamespace(perf_counter=lambda: real() + clock.offset))
    model = make_model("llama")
    calls = []

    def hook():
        calls.append(1)
        clock.offset += hour

    plain = [o.tokens for o in Engine(model).generate([[1, 2, 3]], SamplingParams(max_new_tokens=3))]
    for one_call in (False, True):
        model.decode_in_one_call = one_call
        calls.clear()
        rec = Recorder(before_op=hook)
        timed = [o.tokens for o in Engine(model).generate([[1, 2, 3]], SamplingParams(max_new_tokens=3),
                                                          recorder=rec)]
        assert plain == timed
        assert calls and all(0 <= r.seconds < hour for r in rec.trace.ops)
        if not one_call:
            assert len(calls) == len(rec.trace.ops) > 0
        elif cpu_kernels.available():  # a decode step's layers run in one call, the hook once before it
            layer_ops = [r for r in rec.trace.ops if r.phase == "decode" and r.layer is not None]
            assert len(layer_ops) == 2 * len(cpu_kernels.LAYER_PARTS) * model.spec.num_layers
            assert len(calls) == len(rec.trace.ops) - len(layer_ops) + 2


def test_bad_recorder_arguments():
    with pytest.raises(ValueError, match="mode"):
        Recorder(mode="nvtx")
    rec = Recorder()
    with pytest.raises(ValueError, match="phase"):
        with rec.step("warmup", batch=1, q_len=1, kv_len=1, tokens_in_cache=1):
            pass


@pytest.mark.parametrize("cache", ["contiguous", "paged"])
def test_time_forward_records_the_requested_shape(cache):
    from llmperf.measure.timing import time_forward

    model = make_model("llama")
    trace = time_forward(model, batch=3, q_len=1, kv_len=40, cache=cache, reps=2, warmup=1)
    steps = trace.steps_frame()
    assert list(steps.phase) == ["decode", "decode"] and set(steps.kv_len) == {40} and set(steps.batch) == {3}
    df = trace.to_frame()
    assert (df.groupby("step").op.count() == len(df) // 2).all()
    prefill = time_forward(model, batch=2, q_len=16, kv_len=16, cache=cache, reps=1, warmup=0)
    assert set(prefill.to_frame().phase) == {"prefill"}
    with pytest.raises(ValueError, match="q_len"):
        time_forward(model, batch=1, q_len=8, kv_len=4)


def test_phases_come_from_the_scheduler_not_from_shapes():
    """A chunked-prefill step that carries decode tokens and a prompt chunk is `mixed` in the trace,
    even for its one-token forward; a recompute after preemption is `prefill`, whatever its shape."""
    model = make_model("llama")
    rec = Recorder()
    engine = Engine(model, chunked_prefill=True, max_batched_tokens=6)
    engine.generate([[1, 2, 3], list(range(10, 24))], SamplingParams(max_new_tokens=5), recorder=rec)
    scheduled = [log.phase.value for log in engine.last_schedule]
    assert "mixed" in scheduled
    steps = rec.trace.steps_frame()
    assert set(steps.phase) == set(scheduled)
    mixed = steps[steps.phase == "mixed"]
    assert set(mixed.q_len) > {1}, "a mixed step (its longest chunk) is recorded as mixed, not decode"
    # one record per step: a mixed step runs ONE forward over its decode tokens and prompt chunks
    assert len(steps) == len(engine.last_schedule)
    assert steps.batch.tolist() == [sum(len(i.seq_ids) for i in log.items) for log in engine.last_schedule]
