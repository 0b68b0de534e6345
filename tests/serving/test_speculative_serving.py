"""Speculative decoding in the serving simulator (`llmperf.serving.speculative`): acceptance 0 is plain
decoding's schedule with dearer steps, acceptance 1 emits k + 1 tokens a cycle, the mean tokens per
cycle is E(a, k), one cycle's step is `llmperf speculate`'s cycle, batch-1 TPOT agrees with
`speculate`, the KV pool never leaks, the CLI options, and bad input refused naming the field."""

from __future__ import annotations

import math

import numpy as np
import pytest
from typer.testing import CliRunner

from llmperf.analysis.roofline import phase_time_model, step_overhead_s
from llmperf.analysis.speculative import expected_tokens, speculate
from llmperf.analysis.timemodel import time_model_for
from llmperf.cli import app
from llmperf.errors import SpecError
from llmperf.serving.blocks import BlockManager
from llmperf.serving.scheduler import Scheduler, SchedulerConfig
from llmperf.serving.simulator import (
    CostModelRunner,
    ServingConfig,
    _states,
    plan_memory,
    simulate,
    speculative_costs,
    step_cost_model,
)
from llmperf.serving.speculative import AcceptanceDraws, SpeculativeConfig
from llmperf.serving.workload import Workload
from llmperf.specs import load_model

runner = CliRunner()


def workload(n, prompt, out, arrivals=None):
    return Workload(arrival_s=np.zeros(n) if arrivals is None else np.asarray(arrivals, dtype=float),
                    prompt_tokens=np.broadcast_to(prompt, n).astype(int),
                    output_tokens=np.broadcast_to(out, n).astype(int),
                    shared_prefix_tokens=np.zeros(n, dtype=int))


def config(spec=None, model="llama-3.1-8b", hardware="h100-sxm", **kw):
    return ServingConfig.build(model, hardware, speculative=spec, **kw)


def spec(draft="early-exit:8", k=3, a=0.7, seed=0):
    return SpeculativeConfig(draft=draft, num_draft_tokens=k, acceptance=a, seed=seed)


def mixed_workload(offline=False):
    rng = np.random.default_rng(3)
    n = 24
    return workload(n, rng.integers(50, 300, n), rng.integers(2, 60, n),
                    np.zeros(n) if offline else np.sort(rng.uniform(0, 2.0, n)))


# ---- (a) acceptance 0: plain decoding's schedule, dearer steps ------------------------------------------------

def test_acceptance_zero_is_plain_decodings_schedule_with_dearer_steps():
    w = mixed_workload(offline=True)  # all at t = 0: the decisions do not depend on the steps' times
    plain = simulate(w, config())
    spec0 = simulate(w, config(spec(k=3, a=0.0)))
    assert len(plain.log) == len(spec0.log)
    for p, s in zip(plain.log, spec0.log):
        # the same requests at the same positions, admitted, preempted and finished alike; a decode
        # item puts k + 1 tokens through the target (fewer near the request's end) instead of one
        strip = lambda log: tuple((i.request_id, len(i.seq_ids), i.start, i.decode) for i in log.items)  # noqa: E731
        assert strip(p) == strip(s)
        assert (p.phase, p.admitted, p.preempted, p.finished) == (s.phase, s.admitted, s.preempted, s.finished)
        assert all(i.num_tokens == j.num_tokens for i, j in zip(p.items, s.items) if not i.decode)
        # every step costs more: the draft's steps (and its prefill of each chunk), the verify's k + 1 tokens
        assert s.duration_s > p.duration_s
    assert spec0.summary()["tokens_per_cycle"] == 1.0
    assert (spec0.requests["output_tokens"] == plain.requests["output_tokens"]).all()


# ---- (b) acceptance 1: k + 1 tokens a cycle, capped at max_new_tokens -----------------------------------------

@pytest.mark.parametrize("k", [1, 4])
def test_acceptance_one_emits_k_plus_one_tokens_a_cycle(k):
    w = mixed_workload()
    res = simulate(w, config(spec(k=k, a=1.0)))
    out = w.output_tokens
    emitted = {i: 1 for i in range(len(w))}  # the first token comes from the prefill
    last_step = {}
    for log in res.log:
        for item in log.items:
            if item.decode:
                left = out[item.request_id] - item.num_generated
                assert item.num_tokens == min(k + 1, left)  # never a draft past max_new_tokens
                assert item.num_generated == emitted[item.request_id]
                emitted[item.request_id] += item.num_tokens  # every draft accepted
                last_step[item.request_id] = log.start_s + log.duration_s
    assert [emitted[i] for i in range(len(w))] == out.tolist()
    for rid, end in last_step.items():
        assert res.requests["finish_s"].iloc[rid] == end
    full = res.summary()["tokens_per_full_cycle"]
    assert full == k + 1


# ---- (c) the mean tokens per cycle is E(a, k) ----------------------------------------------------------------

@pytest.mark.parametrize("a, k", [(0.7, 4), (0.5, 2), (0.9, 6)])
def test_mean_tokens_per_cycle_is_the_expectation(a, k):
    w = workload(150, 128, 200)
    res = simulate(w, config(spec(k=k, a=a, seed=11)))
    s = res.summary()
    # the cycles with all k drafts follow the truncated geometric law exactly: its mean and variance
    p = np.array([a ** (n - 1) * (1 - a) for n in range(1, k + 1)] + [a ** k])
    n = np.arange(1, k + 2)
    mean, var = float(p @ n), float(p @ n ** 2) - float(p @ n) ** 2
    assert mean == pytest.approx(expected_tokens(a, k), rel=1e-12) == s["expected_tokens_per_cycle"]
    cycles = round(150 * 199 / mean)  # about this many full cycles (each request's last ones draft fewer)
    se = math.sqrt(var / cycles)
    # a deterministic seed; 5 standard errors is a wide margin (a fair stream misses it once in 1.7 million)
    assert abs(s["tokens_per_full_cycle"] - mean) < 5 * se
    assert s["tokens_per_cycle"] <= s["tokens_per_full_cycle"] + 5 * se  # the short last cycles emit fewer
    assert sum(res.requests["output_tokens"]) == 150 * 200


def test_acceptance_draws_follow_the_law_and_the_seed():
    draws = AcceptanceDraws(0.6, 5).draw([3] * 40000)
    counts = np.bincount(draws, minlength=5)[1:] / 40000
    law = np.array([0.4, 0.6 * 0.4, 0.36 * 0.4, 0.6 ** 3])
    assert np.abs(counts - law).max() < 5 * math.sqrt(0.25 / 40000)  # 5 standard errors of a share
    assert AcceptanceDraws(0.6, 5).draw([3] * 50) == AcceptanceDraws(0.6, 5).draw([3] * 50)
    assert AcceptanceDraws(0.6, 5).draw([3] * 50) != AcceptanceDraws(0.6, 6).draw([3] * 50)
    assert AcceptanceDraws(0.9, 1).draw([0, 0, 2])[:2] == [1, 1]  # no draft: the target's own token


def test_same_seed_same_run():
    w = mixed_workload()
    one, two = simulate(w, config(spec(seed=4))), simulate(w, config(spec(seed=4)))
    assert one.requests.equals(two.requests) and one.steps.equals(two.steps)
    assert not simulate(w, config(spec(seed=5))).steps.equals(one.steps)


# ---- (d) one cycle's step is `speculate`'s cycle ----------------------------------------------------------------

DEEPSEEK_5 = load_model("deepseek-v3").scaled(name="deepseek-v3 first 5 layers", num_layers=5)  # one GPU's worth


@pytest.mark.parametrize("model, draft, hw", [
    ("qwen3-32b", "qwen3-8b", "h200"),
    ("llama-3.1-8b", "early-exit:8", "h100-sxm"),
    (DEEPSEEK_5, "mtp", "h200"),
    ("llama-3.1-8b", "eagle3", "h100-sxm"),
], ids=["draft-model", "early-exit", "mtp", "eagle3"])
@pytest.mark.parametrize("eff", ["roofline", "typical"])
def test_a_speculative_decode_step_is_k_draft_steps_a_verify_and_the_fixed_cost(model, draft, hw, eff):
    B, P, k = 4, 300, 3
    tm = None if eff == "roofline" else (lambda h, dtype: time_model_for(h, eff, dtype))
    est = speculate(model, draft, hw, num_draft_tokens=k, acceptance=0.7, batch=B, prompt_len=P, gen_len=64,
                    time_model=tm)
    cfg = config(spec(draft, k, 0.7), model, hw, policy="static", max_batch=B, max_batched_tokens=None,
                 chunked_prefill=False, prefix_sharing=False, efficiency=eff)
    res = simulate(workload(B, P, 64), cfg)
    steps = res.steps["duration_s"].to_numpy()
    assert res.log[1].phase == "decode" and [i.num_tokens for i in res.log[1].items] == [k + 1] * B
    # step 1: the first cycle of every sequence (P + 1 tokens committed), as `speculate` prices it: k draft
    # decode steps, the verify of k + 1 tokens (the verify terms), the engine's fixed cost once
    assert steps[1] == pytest.approx(est.first_draft_s + est.first_verify_s + est.cycle_overhead_s, rel=1e-9)
    # the prefill step: both models' prefill of the prompt, as speculate's TTFT, but with one fixed cost
    # (speculate's TTFT adds the draft's prefill with the draft's own step overhead)
    d_fixed = step_overhead_s(phase_time_model(est.draft.time_model, "prefill"))
    assert steps[0] == pytest.approx(est.ttft_s - d_fixed, rel=1e-9)
    assert res.memory.draft_weights_bytes == pytest.approx(est.draft_weights_bytes, rel=1e-9)


@pytest.mark.parametrize("draft_tp", [1, 2])
def test_a_draft_on_fewer_gpus_is_priced_and_held_as_speculate_does(draft_tp):
    B, P, k = 4, 300, 3
    tm = lambda h, dtype: time_model_for(h, "typical", dtype)  # noqa: E731
    est = speculate("llama-3.1-70b", "llama-3.1-8b", "h100-sxm", num_draft_tokens=k, acceptance=0.7, batch=B,
                    prompt_len=P, gen_len=64, tp=4, draft_tp=draft_tp, time_model=tm)
    sp = SpeculativeConfig(draft="llama-3.1-8b", num_draft_tokens=k, acceptance=0.7, draft_tp=draft_tp)
    cfg = config(sp, "llama-3.1-70b", tp=4, policy="static", max_batch=B, max_batched_tokens=None,
                 chunked_prefill=False, prefix_sharing=False, efficiency="typical")
    res = simulate(workload(B, P, 64), cfg)
    steps = res.steps["duration_s"].to_numpy()
    # the draft's k steps at its own degree (no all-reduce at 1), the verify and fixed cost at the target's
    assert steps[1] == pytest.approx(est.first_draft_s + est.first_verify_s + est.cycle_overhead_s, rel=1e-9)
    assert res.memory.draft_weights_bytes == pytest.approx(est.draft_weights_bytes, rel=1e-9)
    same = plan_memory(config(spec("llama-3.1-8b"), "llama-3.1-70b", tp=4))
    assert res.memory.draft_weights_bytes == pytest.approx(same.draft_weights_bytes * 4 / draft_tp, rel=1e-3)
    assert res.memory.num_blocks < same.num_blocks  # the GPU holding the draft has less left for KV
    assert res.settings["draft_tp"] == draft_tp and simulate(workload(2, 50, 8), config(
        spec("llama-3.1-8b"), "llama-3.1-70b", tp=4)).settings["draft_tp"] == 4


@pytest.mark.parametrize("kw, message", [
    (dict(draft="llama-3.1-8b", draft_tp=3), "^draft_tp: 3 does not divide the target's tp 4"),
    (dict(draft="early-exit:8", draft_tp=1), "^draft_tp: 1, but a draft of the target's own layers"),
    (dict(draft="llama-3.1-8b", draft_tp=0), "^draft_tp: must be a positive integer"),
])
def test_a_bad_draft_tp_is_refused_naming_it(kw, message):
    with pytest.raises(SpecError, match=message):
        plan_memory(config(SpeculativeConfig(num_draft_tokens=3, acceptance=0.7, **kw), "llama-3.1-70b", tp=4))


# ---- (e) batch 1, light load: TPOT as `speculate` ---------------------------------------------------------------

@pytest.mark.parametrize("a, k", [(0.6, 3), (0.8, 4)])
def test_batch_one_tpot_agrees_with_speculate(a, k):
    n, P, G = 20, 512, 256
    w = workload(n, P, G, np.arange(n) * 100.0)  # one request at a time
    est = speculate("llama-3.1-70b", "llama-3.1-8b", "h100-sxm", num_draft_tokens=k, acceptance=a, batch=1,
                    prompt_len=P, gen_len=G, tp=4, time_model=lambda h, dtype: time_model_for(h, "typical", dtype))
    res = simulate(w, config(spec("llama-3.1-8b", k, a), "llama-3.1-70b", tp=4, efficiency="typical"))
    s = res.summary()
    assert s["mean_batch"] == 1.0
    # The simulator draws each cycle's tokens where `speculate` uses their expectation E(a, k) and a
    # fractional last cycle at full price (the simulator's last cycles draft only what is left): over
    # 20 x 85 cycles the two differ by 1-2.5% at these seeds; 4% is the bound.
    assert s["tpot_s"]["mean"] == pytest.approx(est.tpot_s, rel=0.04)
    assert s["tokens_per_cycle"] == pytest.approx(est.tokens_per_cycle, rel=0.04)


# ---- (f) the KV pool never leaks ----------------------------------------------------------------------------------

@pytest.mark.parametrize("num_blocks", [None, 60])
def test_kv_pool_is_fully_free_after_the_run(num_blocks):
    w = mixed_workload()
    cfg = config(spec(k=5, a=0.6), block_size=8, num_blocks=num_blocks)
    memory = plan_memory(cfg, w)
    kv = memory.manager(max_seq_len=cfg.model.max_positions)
    cost = step_cost_model(cfg)
    run = CostModelRunner(cost, kv, w.output_tokens.tolist(), memory.kv_bytes_per_token, speculative=cfg.speculative,
                          speculative_costs=speculative_costs(cfg, cost))
    sched = Scheduler(kv, run, cfg.scheduler_config())
    states = _states(w, cfg.prefix_sharing)

    def check(log):
        kv.check_invariants()
        for r in sched.running:  # a decoding sequence holds exactly its cached tokens between steps
            for s in r.cached_seq_ids():
                assert kv.seq_len(s) == r.num_computed
    sched.run(states, on_step=check)
    assert all(s.finish_s is not None and s.num_generated == s.max_new_tokens for s in states)
    assert kv.num_free_blocks == kv.num_blocks and kv.num_seqs == 0
    if num_blocks is not None:  # a small pool: the cycles' reservations preempted, and gave everything back
        assert sum(s.preemptions for s in states) > 0


def test_truncate_gives_back_the_rejected_slots():
    kv = BlockManager(10, 4)
    assert kv.allocate(0, 6)
    assert kv.reserve(0, 5) and kv.seq_len(0) == 11 and kv.num_free_blocks == 7
    kv.truncate(0, 7)
    assert kv.seq_len(0) == 7 and kv.num_free_blocks == 8 and kv.slot_counts() == (7, 8)
    kv.check_invariants()
    kv.fork(0, 1)
    assert kv.reserve(1, 4)  # copy-on-write of the shared last block, then one more
    kv.truncate(1, 8)
    kv.check_invariants()
    with pytest.raises(ValueError, match="num_tokens"):
        kv.truncate(1, 9)
    kv.free(0)
    kv.free(1)
    assert kv.num_free_blocks == 10


# ---- configuration: memory, refusals ------------------------------------------------------------------------------

def test_the_draft_joins_the_memory_plan():
    plain, s = plan_memory(config()), plan_memory(config(spec("early-exit:8")))
    assert s.draft_weights_bytes == 0.0  # an early exit shares the target's weights
    assert s.draft_kv_bytes_per_token == pytest.approx(plain.kv_bytes_per_token * 8 / 32)  # 8 of 32 layers' KV
    assert s.kv_bytes_per_token == pytest.approx(plain.kv_bytes_per_token * 40 / 32)
    assert s.num_blocks < plain.num_blocks
    big = plan_memory(config(spec("llama-3.1-8b"), "llama-3.1-70b", tp=4))
    assert big.draft_weights_bytes == pytest.approx(plan_memory(config(tp=4)).weights_bytes, rel=1e-9)


@pytest.mark.parametrize("kw, field", [
    (dict(num_draft_tokens=0), "num_draft_tokens"), (dict(num_draft_tokens=2.0), "num_draft_tokens"),
    (dict(acceptance=1.5), "acceptance"), (dict(acceptance=-0.1), "acceptance"), (dict(acceptance=True), "acceptance"),
    (dict(seed=-1), "seed"), (dict(draft=" "), "draft"),
])
def test_bad_speculative_config_names_the_field(kw, field):
    args = dict(draft="early-exit:8", num_draft_tokens=3, acceptance=0.7) | kw
    with pytest.raises(SpecError, match=f"^{field}: "):
        SpeculativeConfig(**args)


@pytest.mark.parametrize("draft, message", [
    ("no-such-model", "draft: unknown model"), ("gpt2", "draft: .*vocab_size"), ("early-exit:99", "draft: early-exit"),
    ("mtp", "draft: mtp"),
])
def test_bad_draft_is_refused_naming_draft(draft, message):
    with pytest.raises(SpecError, match=message):
        config(spec(draft))


def test_refusals_of_layouts_speculation_is_not_simulated_on():
    with pytest.raises(SpecError, match="--kv-window"):
        config(spec("early-exit:4"), "gemma-2-9b")
    config(spec("early-exit:4"), "gemma-2-9b", kv_window="full")
    with pytest.raises(ValueError, match="max_batched_tokens"):
        Scheduler(BlockManager(100, 16), None, SchedulerConfig(max_batched_tokens=4, chunked_prefill=True,
                                                                  speculative=spec(k=4))).check(_states(
                                                                      workload(1, 10, 5), False)[0])


def test_the_engine_refuses_a_speculative_config():
    pytest.importorskip("torch")
    from llmperf.engine.scheduler import run_groups
    with pytest.raises(ValueError, match="^speculative: "):
        run_groups(None, None, [], SchedulerConfig(speculative=spec()))


def test_settings_name_the_speculation_and_stay_without_it():
    w = workload(4, 64, 16)
    plain = simulate(w, config())
    res = simulate(w, config(spec("early-exit:8", 3, 0.7, seed=2)))
    st = res.settings
    assert (st["draft"], st["num_draft_tokens"], st["acceptance"], st["speculative_seed"]) == (
        "llama-3.1-8b first 8 layers", 3, 0.7, 2)
    assert st["expected_tokens_per_cycle"] == pytest.approx(expected_tokens(0.7, 3))
    assert set(st) - set(plain.settings) == {"draft", "num_draft_tokens", "acceptance", "speculative_seed",
                                             "expected_tokens_per_cycle", "draft_tp", "draft_weights_bytes",
                                             "draft_kv_bytes_per_token", "tree_topk", "verify_tokens"}
    assert st["draft_tp"] == 1  # the target's
    assert (st["tree_topk"], st["verify_tokens"]) == (1, 4)  # a chain: k + 1 verified
    assert "tokens_per_cycle" in res.summary() and "tokens_per_cycle" not in plain.summary()


# ---- (g) the CLI ----------------------------------------------------------------------------------------------------

SMALL = ["--requests", "30", "--prompt-len", "uniform:50:200", "--output-len", "uniform:5:40", "--rate", "4"]


def test_simulate_with_speculation_prints_its_settings():
    res = runner.invoke(app, ["simulate", *SMALL, "--draft", "early-exit:8", "--draft-tokens", "3", "--acceptance",
                              "0.7"])
    assert res.exit_code == 0, res.output
    assert "speculative decoding" in res.output and "first 8 layers" in res.output
    assert "E(a, k)" in res.output and "2.53" in res.output and "0.7" in res.output
    res = runner.invoke(app, ["simulate", *SMALL, "-d", "early-exit:8", "-k", "2", "-a", "0.5", "-f", "json"])
    assert res.exit_code == 0, res.output
    import json
    doc = json.loads(res.output)
    assert doc["settings"]["num_draft_tokens"] == 2 and doc["settings"]["acceptance"] == 0.5
    assert doc["summary"]["expected_tokens_per_cycle"] == pytest.approx(1.75)
    assert 1.0 <= doc["summary"]["tokens_per_cycle"] <= 3.0


def test_simulate_run_dir_and_csv_with_speculation(tmp_path):
    import json
    d = tmp_path / "run"
    res = runner.invoke(app, ["simulate", *SMALL, "-d", "early-exit:8", "-k", "3", "-a", "0.7", "--run-dir", str(d)])
    assert res.exit_code == 0, res.output
    doc = json.loads((d / "run.json").read_text())
    assert doc["settings"]["num_draft_tokens"] == 3 and "tokens_per_cycle" in doc["summary"]
    res = runner.invoke(app, ["simulate", *SMALL, "-d", "early-exit:8", "-k", "3", "-a", "0.7", "-f", "csv"])
    assert res.exit_code == 0 and "tokens_per_cycle" in res.output.splitlines()[0]


def test_simulate_without_speculation_is_unchanged():
    res = runner.invoke(app, ["simulate", *SMALL, "-f", "json"])
    assert res.exit_code == 0, res.output
    import json
    doc = json.loads(res.output)
    assert "draft" not in doc["settings"] and "tokens_per_cycle" not in doc["summary"]
    assert "speculative" not in runner.invoke(app, ["simulate", *SMALL]).output


@pytest.mark.parametrize("args, message", [
    (["-d", "early-exit:8", "-k", "0", "-a", "0.7"], "--draft-tokens: "),
    (["-d", "early-exit:8", "-k", "3", "-a", "1.5"], "--acceptance: "),
    (["-d", "no-such-model", "-k", "3", "-a", "0.7"], "--draft: "),
    (["-d", "early-exit:8", "-a", "0.7"], "--draft-tokens: "),
    (["-d", "early-exit:8", "-k", "3"], "--acceptance: "),
    (["-k", "3", "-a", "0.7"], "--draft: "),
    (["-d", "early-exit:8", "-k", "4", "-a", "0.7", "--max-batched-tokens", "4"], "--max-batched-tokens: "),
    (["-d", "gemma-2-9b", "-k", "4", "-a", "0.7"], "--draft: "),
    (["--validate", "-d", "early-exit:8", "-k", "4", "-a", "0.7"], "--validate: "),
    (["--draft-tp", "1"], "--draft: "),
    (["-d", "early-exit:8", "-k", "3", "-a", "0.7", "--tp", "2", "--draft-tp", "1"],
     "--draft-tp: 1, but a draft of the target's own layers"),
    (["-d", "llama-3.1-8b", "-k", "3", "-a", "0.7", "--tp", "4", "--draft-tp", "3"],
     "--draft-tp: 3 does not divide the target's tp 4"),
    (["-d", "llama-3.1-8b", "-k", "3", "-a", "0.7", "--draft-tp", "0"], "--draft-tp: must be a positive integer"),
])
def test_simulate_bad_speculation_options_exit_2_naming_the_option(args, message):
    res = runner.invoke(app, ["simulate", *SMALL, *args])
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in res.output


def test_simulate_with_the_draft_on_one_gpu():
    import json
    args = ["simulate", "llama-3.1-70b", *SMALL, "-H", "h100-sxm", "--tp", "4", "-d", "llama-3.1-8b", "-k", "3",
            "-a", "0.7"]
    res = runner.invoke(app, [*args, "--draft-tp", "1"])
    assert res.exit_code == 0, res.output
    assert "llama-3.1-8b (tp 1)" in res.output
    one = json.loads(runner.invoke(app, [*args, "--draft-tp", "1", "-f", "json"]).output)["settings"]
    four = json.loads(runner.invoke(app, [*args, "-f", "json"]).output)["settings"]
    assert (one["draft_tp"], four["draft_tp"]) == (1, 4)
    assert one["draft_weights_bytes"] == pytest.approx(4 * four["draft_weights_bytes"], rel=1e-3)


PLAN = ["plan", "--rate", "2", "-H", "h100-sxm", "--precisions", "bf16", "--tp", "1", "--slo-ttft", "5", "-n", "40",
        "-j", "1", "--prompt-len", "uniform:10:60", "--output-len", "uniform:5:40"]


def test_plan_carries_speculation_into_every_candidate():
    import json
    res = runner.invoke(app, [*PLAN, "-d", "early-exit:8", "-k", "3", "-a", "0.7", "-f", "json"])
    assert res.exit_code == 0, res.output
    st = json.loads(res.output)["settings"]
    assert (st["draft"], st["num_draft_tokens"], st["acceptance"]) == ("llama-3.1-8b first 8 layers", 3, 0.7)
    plain = json.loads(runner.invoke(app, [*PLAN, "-f", "json"]).output)
    assert "draft" not in plain["settings"]
    # the draft's steps make every step dearer: the speculative TTFT is above plain decoding's
    assert json.loads(res.output)["rows"][0]["ttft_s"] > plain["rows"][0]["ttft_s"]


@pytest.mark.parametrize("args, message", [
    (["-d", "early-exit:8", "-k", "65", "-a", "0.7"], "--draft-tokens: "),
    (["-d", "gpt2", "-k", "3", "-a", "0.7"], "--draft: "),
    (["-a", "0.7"], "--draft: "),
    (["-d", "llama-3.1-8b", "-k", "3", "-a", "0.7", "--draft-tp", "2"],
     "--draft-tp: 2 does not divide the target's tp 1"),
])
def test_plan_bad_speculation_options_exit_2(args, message):
    res = runner.invoke(app, [*PLAN, *args])
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in res.output


def test_the_optimistic_service_rate_counts_every_draft_accepted():
    from llmperf.serving.simulator import saturated_rate, service_rate_bound
    from llmperf.serving.workload import WorkloadSpec
    spec_ = WorkloadSpec(arrival="poisson:1", prompt_len="uniform:50:200", output_len="uniform:50:200", num_requests=64)

    def rates(s):
        cfg = config(s, max_batch=16)
        return saturated_rate(spec_, cfg), service_rate_bound(cfg, spec_, plan_memory(cfg).num_blocks)
    plain, accepted, rejected = rates(None), rates(spec(k=4, a=1.0)), rates(spec(k=4, a=0.0))
    # the bound assumes every draft accepted, whatever the acceptance: as optimistic for speculation as
    # for plain decoding (it adds prefill and decode serially, so neither is a strict bound of a mixed run)
    assert accepted[1] == rejected[1] > plain[1]
    assert accepted[0] / accepted[1] <= 1.2 * plain[0] / plain[1]
    assert rejected[0] < plain[0] < accepted[0]  # what speculation does to the simulated service rate
