"""Speculative decoding priced (`llmperf.analysis.speculative`): the expected tokens per cycle, each
cycle's parts against the same model's own decode and verify steps, the sum over cycles, memory, the
time model named, and bad input refused naming the field."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from llmperf.analysis import estimate
from llmperf.analysis.phase import estimate_phase
from llmperf.analysis.rollup import forward_model
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


def _verify_fm(est):
    """The target's forward model with logits at every position, as a verify computes them."""
    return forward_model(est.model, est.precision, replace(est.conventions, all_logits=True), est.tp)


@pytest.mark.parametrize("time_model", [None, TYPICAL], ids=["roofline", "typical"])
def test_a_cycle_is_k_draft_steps_and_one_verify_of_the_models_own(time_model):
    k = 3
    s = speculate(**PAIR, num_draft_tokens=k, acceptance=0.7, batch=4, prompt_len=300, gen_len=64, tp=4,
                  time_model=time_model)
    draft, target = s.draft, s.target
    d_over = step_overhead_s(draft.time_model)
    # the draft's decode steps 1..k read contexts prompt + 1 .. prompt + k: its own estimate's steps
    assert s.first_draft_s == pytest.approx(float(np.sum(draft.decode_step_times_s(1, k + 1))) - k * d_over)
    # the verify's logits at all its k + 1 positions (the engine's verify runs with all_logits)
    verify = estimate_phase(_verify_fm(target), target.hardware, 4, k + 1, 300 + 1 + k, phase="verify",
                            compute_dtype=target.prefill.compute_dtype, time_model=target.time_model)
    last_only = estimate_phase(target.forward_model(), target.hardware, 4, k + 1, 300 + 1 + k, phase="verify",
                               compute_dtype=target.prefill.compute_dtype, time_model=target.time_model)
    v_over = step_overhead_s(phase_time_model(target.time_model, "verify"))
    assert s.first_verify_s == pytest.approx(verify.time_s - v_over)
    assert verify.time_s > last_only.time_s
    assert s.cycle_overhead_s == pytest.approx(step_overhead_s(phase_time_model(target.time_model, "decode")))
    assert s.summary()["cycle_s"] == pytest.approx(s.first_draft_s + s.first_verify_s + s.cycle_overhead_s)


def test_every_cycle_is_priced_at_its_context():
    """a = 1: each cycle emits k + 1 tokens; (gen_len - 1) / (k + 1) whole cycles, summed one by one."""
    k, prompt, gen = 4, 200, 51
    s = speculate(**PAIR, num_draft_tokens=k, acceptance=1.0, prompt_len=prompt, gen_len=gen, tp=2)
    assert s.cycles == pytest.approx(10.0)
    fm_t, fm_d = _verify_fm(s.target), s.draft.forward_model()
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
    (dict(draft="early-exit:8", tp=4, draft_tp=1), "draft_tp"),
    (dict(model="qwen3-30b-a3b", draft="qwen3-8b", tp=4, ep=4, dp_attention=True, draft_tp=1), "draft_tp"),
    (dict(model="qwen3-30b-a3b", draft="qwen3-8b", tp=4, ep=3), "ep"),
])
def test_bad_input_is_refused_naming_the_field(kw, field):
    args = dict(PAIR, num_draft_tokens=2, acceptance=0.7)
    args.update(kw)
    with pytest.raises(SpecError, match=f"^{field}: "):
        speculate(**args)


def test_the_mtp_layer_is_the_models_last_kind():
    from llmperf.analysis.speculative import mtp_spec
    from llmperf.specs import load_model
    for name in ("deepseek-v3", "glm-4.5"):
        m = load_model(name)
        d = mtp_spec(m)
        assert d.num_layers == 1 and d.layer_kinds() == (m.layer_kinds()[-1],) and d.is_moe
        assert (d.vocab_size, d.hidden_size, d.is_mla) == (m.vocab_size, m.hidden_size, m.is_mla)
    with pytest.raises(SpecError, match="^draft: mtp needs .* llama-3.1-8b has none"):
        mtp_spec(load_model("llama-3.1-8b"))


def test_an_mtp_draft_adds_its_layer_eh_proj_and_norms_not_a_second_head():
    from llmperf.analysis.speculative import mtp_ops, mtp_spec
    from llmperf.specs import load_model
    m = load_model("deepseek-v3")
    s = speculate("deepseek-v3", "MTP", "h200", num_draft_tokens=2, acceptance=0.8, tp=8, precision="fp8",
                  time_model=TYPICAL)
    assert s.summary()["draft"] == "deepseek-v3 MTP"
    one = s.draft.memory.weights_bytes
    two = speculate("deepseek-v3", "mtp", "h200", num_draft_tokens=2, acceptance=0.8, tp=8, precision="fp8")
    assert s.draft_weights_bytes == pytest.approx(two.draft_weights_bytes)  # weights do not depend on the time model
    C = m.hidden_size
    p = s.draft.precision
    layer = s.draft_weights_bytes - p.matrix_bytes(2 * C, C, module="attention") - 3 * C * p.act_bytes
    assert 0 < layer < one  # one layer, without the embedding and LM head the 1-layer model also holds
    assert layer == pytest.approx(1.2e10 / 8, rel=0.1)  # ~11.6 B parameters of one MoE layer at fp8, over 8 GPUs
    # each draft step: the 1-layer model's decode step and the module's own three operators
    ops = mtp_ops(s.draft.forward_model(), s.draft.batch * 1, C)
    assert [o.name for o in ops] == ["mtp_enorm", "mtp_hnorm", "mtp_eh_proj"]
    assert ops[2].weight_bytes == pytest.approx(p.matrix_bytes(2 * C, C, module="attention"))
    plain = speculate("deepseek-v3", mtp_spec(m), "h200", num_draft_tokens=2, acceptance=0.8, tp=8, precision="fp8",
                      time_model=TYPICAL)
    assert s.first_draft_s > plain.first_draft_s and s.first_verify_s == pytest.approx(plain.first_verify_s)
    assert s.draft_weights_bytes < plain.draft_weights_bytes and s.draft_prefill_s > plain.draft_prefill_s


def test_an_early_exit_draft_shares_its_weights_and_keeps_its_own_kv():
    from llmperf.analysis.speculative import early_exit_spec
    from llmperf.specs import load_model
    s = speculate("llama-3.1-70b", "early-exit:8", "h100-sxm", num_draft_tokens=3, acceptance=0.7, tp=4)
    assert s.draft_name == "llama-3.1-70b first 8 layers" and s.draft.model.num_layers == 8
    assert s.draft_weights_bytes == 0.0 and s.draft.memory.kv_cache_bytes > 0
    other = speculate("llama-3.1-70b", early_exit_spec(load_model("llama-3.1-70b"), 8), "h100-sxm",
                      num_draft_tokens=3, acceptance=0.7, tp=4)  # the same layers as a separate model
    assert s.decode_s == pytest.approx(other.decode_s) and s.memory_bytes < other.memory_bytes
    for bad in ("early-exit:0", "early-exit:80", "early-exit:x", "early-exit:"):
        with pytest.raises(SpecError, match="^draft: early-exit:N needs N in 1 .. 79"):
            speculate("llama-3.1-70b", bad, "h100-sxm", num_draft_tokens=3, acceptance=0.7)
    with pytest.raises(SpecError, match="^draft: deepseek-v3 cannot stop after 2 layers"):
        speculate("deepseek-v3", "early-exit:2", "h200", num_draft_tokens=3, acceptance=0.7)


def test_an_expert_parallel_target_drafts_with_its_layout():
    """DeepSeek-V3's MTP layer (a MoE layer) runs with the target's experts and attention split as the
    target's are; a dense draft beside a MoE target keeps ep 1 (its FFN split by tp); a draft at
    another degree is split neither way, as `simulate` prices it (`llmperf.serving.speculative`)."""
    kw = dict(num_draft_tokens=2, acceptance=0.8, batch=64, hardware="h200")
    mtp = speculate("deepseek-v3", "mtp", tp=8, ep=8, dp_attention=True, **kw)
    assert (mtp.draft.conventions.ep, mtp.draft.conventions.dp_attention) == (8, True)
    plain = estimate("deepseek-v3", "h200", batch=64, gen_len=128, tp=8, ep=8, dp_attention=True)
    assert mtp.target.tpot_s == pytest.approx(plain.tpot_s, rel=1e-12)
    s = mtp.summary()
    assert (s["tp"], s["draft_tp"], s["ep"], s["dp_attention"]) == (8, 8, 8, True)
    dense = speculate("qwen3-30b-a3b", "qwen3-8b", tp=4, ep=4, **kw)
    assert (dense.target.conventions.ep, dense.draft.conventions.ep) == (4, 1)
    one = speculate("qwen3-30b-a3b", "qwen3-8b", tp=4, ep=4, draft_tp=1, **kw)
    assert (one.draft.tp, one.draft.conventions.ep, one.draft.conventions.dp_attention) == (1, 1, False)
