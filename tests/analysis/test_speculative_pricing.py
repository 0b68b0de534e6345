"""Speculative decoding priced (`llmperf.analysis.speculative`): the expected tokens per cycle, each
cycle's parts against the same model's own decode and verify steps, the sum over cycles, memory, the
time model named, and bad input refused naming the field."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmperf.analysis.phase import estimate_phase
from llmperf.analysis.roofline import phase_time_model, step_overhead_s
from llmperf.analysis.speculative import expected_tokens, speculate
from llmperf.analysis.timemodel import time_model_for
from llmperf.errors import SpecError

TYPICAL = lambda hw, dtype: time_model_for(hw, "typical", dtype)  # noqa: E731
PAIR = dict(model="llama-3.1-70b", draft="llama-3.1-8b", hardware="h100-sxm")


@pytest.mark.parametrize("k", [1, 2, 5, 8])
@pytest.mark.parametrize("a", [0.0, 0.3, 0.75, 0.99, 1.0])
def test_expected_tokens_is_the_geometric_sum(k, a):
    assert expected_tokens(a, k) == pytest.approx(sum(a ** i for i in range(k + 1)))
    assert 1.0 <= expected_tokens(a, k) <= k + 1


def test_expected_tokens_grows_with_acceptance_and_draft_length():
    assert expected_tokens(0.0, 7) == 1.0 and expected_tokens(1.0, 7) == 8.0
    assert expected_tokens(0.8, 4) > expected_tokens(0.7, 4) and expected_tokens(0.8, 5) > expected_tokens(0.8, 4)


@pytest.mark.parametrize("time_model", [None, TYPICAL], ids=["roofline", "typical"])
def test_a_cycle_is_k_draft_steps_and_one_verify_of_the_models_own(time_model):
    k = 3
    s = speculate(**PAIR, num_draft_tokens=k, acceptance=0.7, batch=4, prompt_len=300, gen_len=64, tp=4,
                  time_model=time_model)
    draft, target = s.draft, s.target
    d_over = step_overhead_s(draft.time_model)
    # the draft's decode steps 1..k read contexts prompt + 1 .. prompt + k: its own estimate's steps
    assert s.first_draft_s == pytest.approx(float(np.sum(draft.decode_step_times_s(1, k + 1))) - k * d_over)
    verify = estimate_phase(target.forward_model(), target.hardware, 4, k + 1, 300 + 1 + k, phase="verify",
                            compute_dtype=target.prefill.compute_dtype, time_model=target.time_model)
    v_over = step_overhead_s(phase_time_model(target.time_model, "verify"))
    assert s.first_verify_s == pytest.approx(verify.time_s - v_over)
    assert s.cycle_overhead_s == pytest.approx(step_overhead_s(phase_time_model(target.time_model, "decode")))
    assert s.summary()["cycle_s"] == pytest.approx(s.first_draft_s + s.first_verify_s + s.cycle_overhead_s)


def test_every_cycle_is_priced_at_its_context():
    """a = 1: each cycle emits k + 1 tokens; (gen_len - 1) / (k + 1) whole cycles, summed one by one."""
    k, prompt, gen = 4, 200, 51
    s = speculate(**PAIR, num_draft_tokens=k, acceptance=1.0, prompt_len=prompt, gen_len=gen, tp=2)
    assert s.cycles == pytest.approx(10.0)
    fm_t, fm_d = s.target.forward_model(), s.draft.forward_model()
    dtype = s.target.prefill.compute_dtype
    total = 0.0
    for c in range(10):
        n = prompt + 1 + c * (k + 1)
        total += sum(estimate_phase(fm_d, s.target.hardware, 1, 1, n + i, phase="decode", compute_dtype=dtype).time_s
                     for i in range(k))
        total += estimate_phase(fm_t, s.target.hardware, 1, k + 1, n + k, phase="verify", compute_dtype=dtype).time_s
    assert s.decode_s == pytest.approx(total)
    assert s.tpot_s == pytest.approx(total / (gen - 1))
    assert s.decode_bound_s == s.decode_s  # the roofline is its own bound


def test_a_fractional_last_cycle_counts_its_fraction():
    s = speculate(**PAIR, num_draft_tokens=2, acceptance=0.5, gen_len=40, tp=4)
    assert s.cycles == pytest.approx(39 / 1.75)
    assert math.ceil(s.cycles) == 23


def test_speedup_follows_acceptance_and_names_its_time_model():
    rows = [speculate(**PAIR, num_draft_tokens=4, acceptance=a, tp=4, time_model=TYPICAL) for a in (0.0, 0.6, 0.9)]
    assert rows[0].speedup < 1.0 < rows[1].speedup < rows[2].speedup  # a = 0: every cycle emits one token
    s = rows[2].summary()
    assert (s["time_model"], s["engine"]) == ("typical", "compiled")
    assert s["tpot_bound_s"] < s["tpot_s"] and s["tpot_plain_bound_s"] < s["tpot_plain_s"]
    assert s["speedup"] == pytest.approx(s["tpot_plain_s"] / s["tpot_s"])
    plain = speculate(**PAIR, num_draft_tokens=4, acceptance=0.9, tp=4).summary()
    assert (plain["time_model"], plain["engine"]) == ("roofline", "none")


def test_memory_holds_both_models_and_ttft_both_prefills():
    s = speculate(**PAIR, num_draft_tokens=3, acceptance=0.7, tp=4, draft_tp=1, batch=8)
    t, d = s.target.memory, s.draft.memory
    assert s.draft.tp == 1 and s.target.tp == 4
    assert s.memory_bytes == pytest.approx(t.weights_bytes + d.weights_bytes + t.kv_cache_bytes + d.kv_cache_bytes
                                           + max(t.activation_peak_bytes, d.activation_peak_bytes))
    assert s.fits and s.ttft_s == pytest.approx(s.target.ttft_s + s.draft.ttft_s)
    assert not speculate(**PAIR, num_draft_tokens=3, acceptance=0.7).fits  # 70B in bf16 on one H100


@pytest.mark.parametrize(("kw", "field"), [
    (dict(num_draft_tokens=0), "num_draft_tokens"), (dict(num_draft_tokens=True), "num_draft_tokens"),
    (dict(num_draft_tokens=2.0), "num_draft_tokens"), (dict(acceptance=1.5), "acceptance"),
    (dict(acceptance=-0.1), "acceptance"), (dict(acceptance=float("nan")), "acceptance"),
    (dict(acceptance=True), "acceptance"), (dict(draft="qwen3-8b"), "draft"), (dict(pp=2), "pp"),
    (dict(tp=4, draft_tp=3), "draft_tp"), (dict(draft_tp=0), "draft_tp"),
])
def test_bad_input_is_refused_naming_the_field(kw, field):
    args = dict(PAIR, num_draft_tokens=2, acceptance=0.7)
    args.update(kw)
    with pytest.raises(SpecError, match=f"^{field}: "):
        speculate(**args)
