"""`llmperf profile` on a tiny model: one joined row per operator and phase with vocabulary names,
exact cross-checks, the run-directory contract, held-out accuracy against the roofline, and every
failure path (a shape that does not fit, an interrupted sweep)."""

from __future__ import annotations

import csv
import json
import math

import pytest
import yaml

from llmperf.analysis.vocabulary import OP_NAMES, PHASE_NAMES, Op
from llmperf.errors import SpecError
from llmperf.measure import profile as prof
from llmperf.measure.calibrate import Settings, calibrate
from llmperf.measure.profile import runner as prof_runner

TINY = dict(name="tiny-llama", family="llama", vocab_size=512, hidden_size=128, num_layers=2, num_heads=4,
            num_kv_heads=2, ffn_size=256, max_positions=512)


@pytest.fixture(scope="module")
def hardware():
    """Calibrated from calibrate's own micro-benchmarks only (none of them is a profiled configuration)."""
    cal = calibrate(Settings.tiny(gemm_k=512, gemm_n=1024, gemm_rows=(1, 4, 16, 64), attn_heads=4, attn_head_dim=32,
                                  attn_decode=((1, 128), (4, 128)), attn_prefill=(32, 128), step_overhead=True,
                                  threads=1))
    return cal.to_spec()


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("spec") / "tiny-llama.yaml"
    path.write_text(yaml.safe_dump(TINY))
    return str(path)


@pytest.fixture(scope="module")
def run(hardware, model_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "profile"
    s = prof.ProfileSettings(model=model_path, hardware="local", batches=(1, 2), prompt_lens=(16,), gen_lens=(6,),
                             reps=3, threads=1)
    return prof.run_profile(s, hardware, out)


def _read(path):
    with path.open() as f:
        return list(csv.DictReader(f))


def test_run_directory_contract(run):
    doc = json.loads((run.out_dir / "run.json").read_text())
    assert {"kind", "schema_version", "created", "model", "hardware", "device", "versions", "git_commit", "settings",
            "errors", "checks"} <= set(doc)
    assert doc["kind"] == "profile" and doc["schema_version"] == 1 and doc["status"] == "complete"
    assert doc["settings"]["threads"] == 1 and doc["settings"]["notes"]  # says Triton is not timed on CPU
    assert any("Triton kernels are not timed" in n for n in doc["settings"]["notes"])
    for name, cols in (("ops.csv", prof.OPS_COLUMNS), ("steps.csv", prof.STEPS_COLUMNS),
                       ("generations.csv", prof.GENERATIONS_COLUMNS)):
        with (run.out_dir / name).open() as f:
            assert tuple(next(csv.reader(f))) == cols
    assert len(_read(run.out_dir / "generations.csv")) == 2
    assert len(_read(run.out_dir / "steps.csv")) == 2 * 6  # a prefill and 5 decode steps per generation
    for e in doc["errors"]:
        assert e["model"] in ("roofline", "calibrated") and e["phase"] in ("prefill", "decode", "e2e")
        assert e["n"] > 0 and e["median_abs_err"] >= 0 and e["p90_abs_err"] >= e["median_abs_err"]



def test_run_json_is_the_manifest_it_was_written_from(run):
    """run.json is `RunManifest.to_dict` as strict JSON: read back, it gives the same text and the result's `run`."""
    from llmperf.outputs import json_text

    path = run.out_dir / "run.json"
    back = prof.RunManifest.load(path)
    assert json_text(back.to_dict()) == path.read_text()
    assert json_text(run.run) == path.read_text() and back.settings.configs_done == 2

def test_exact_cross_checks_pass(run):
    names = {c["name"]: c for c in run.run["checks"]}
    assert set(names) == {"matmul FLOPs vs FlopCounterMode", "decode-step matmul FLOPs vs FlopCounterMode",
                          "weight bytes vs parameters", "decode-step weight bytes vs parameters read",
                          "KV cache bytes vs cache storage", prof.JOIN_CHECK}
    assert all(c["passed"] for c in names.values()), names


def test_one_joined_row_per_operator_and_phase(run):
    keys = [(r["kind"], r["phase"], r["op"], r["batch"], r["q_len"], r["kv_len"]) for r in run.ops]
    assert len(keys) == len(set(keys))
    assert {r["op"] for r in run.ops} <= set(OP_NAMES) and {r["phase"] for r in run.ops} <= set(PHASE_NAMES)
    gen = [r for r in run.ops if r["kind"] == "generation"]
    prefill_ops = {r["op"] for r in gen if r["phase"] == "prefill" and r["batch"] == 1}
    # every operator of a Llama layer, measured and predicted under both models
    assert {"embed", "attn_norm", "rope", "kv_write", "attention", "o_proj", "act", "down_proj", "final_norm",
            "lm_head"} <= prefill_ops
    assert {"q_proj", "k_proj", "v_proj"} <= prefill_ops or "qkv_proj" in prefill_ops
    for r in gen:
        assert r["measured_s"] > 0 and r["predicted_roofline_s"] > 0 and r["predicted_calibrated_s"] > 0, r
        assert r["ratio_roofline"] == pytest.approx(r["predicted_roofline_s"] / r["measured_s"])
        assert r["bound"] in ("memory", "compute")
    micro = {(r["phase"], r["op"]) for r in run.ops if r["kind"] == "micro"}
    assert ("prefill", "attention") in micro and ("decode", "gate_proj") in micro and ("decode", "lm_head") in micro


def test_generation_rows_sum_to_the_steps(run):
    steps = {(s["config"], s["phase"]) for s in run.steps}
    assert ("b1-p16-g6", "prefill") in steps
    for g in run.generations:
        mine = [s for s in run.steps if s["config"] == g["config"]]
        assert g["measured_e2e_s"] == pytest.approx(sum(s["measured_s"] for s in mine))
        assert g["predicted_e2e_s_roofline"] == pytest.approx(sum(s["predicted_roofline_s"] for s in mine))


def test_calibrated_beats_the_roofline_on_held_out_generations(run):
    """Nothing was fitted on these generations: the calibrated terms come from calibrate's micro-benchmarks."""
    err = {(e["phase"], e["model"]): e["median_abs_err"] for e in run.run["errors"]}
    for phase in ("decode", "e2e"):
        assert err[(phase, "calibrated")] < err[(phase, "roofline")], err


def test_fused_measurements_join_the_sum_of_their_parts(hardware):
    from llmperf.analysis import ForwardModel
    from llmperf.specs import ModelSpec, Precision

    fm = ForwardModel(model=ModelSpec(**TINY), precision=Precision.uniform("fp32"))
    pred = prof.Predictor(fm=fm, hardware=hardware, compute_dtype="fp32", calibrated=None)
    qkv = pred.cost(Op.qkv_proj, 2, 1, 10)
    parts = [pred.cost(p, 2, 1, 10) for p in (Op.q_proj, Op.k_proj, Op.v_proj)]
    assert qkv.flops == sum(p.flops for p in parts) and qkv.weight_bytes == sum(p.weight_bytes for p in parts)
    assert qkv.act_read_bytes == parts[0].act_read_bytes  # the input is read once
    gate_up = pred.cost(Op.gate_up_proj, 2, 1, 10)
    assert gate_up.flops == pred.cost(Op.gate_proj, 2, 1, 10).flops * 2
    assert pred.cost(Op.pos_embed, 2, 1, 10) is None  # a Llama has no learned positions
    assert math.isnan(pred.times(qkv, 2, 1)[1])  # no calibrated model: the calibrated column is empty


def test_a_shape_that_does_not_fit_is_refused_with_figures(hardware, model_path, tmp_path, monkeypatch):
    import llmperf.measure.device as device

    monkeypatch.setattr(device, "available_memory_bytes", lambda dev: 2**20)
    s = prof.ProfileSettings(model=model_path, hardware="local", batches=(64,), prompt_lens=(256,), gen_lens=(16,))
    with pytest.raises(SpecError, match=r"needs \d+\.\d+ GiB \(weights .* KV cache .* activations .*\) but cpu has"):
        prof.run_profile(s, hardware, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_interrupted_sweep_keeps_its_rows(hardware, model_path, tmp_path, monkeypatch):
    real = prof.record_generation
    calls = {"n": 0}

    def interrupt_second(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(prof_runner, "record_generation", interrupt_second)  # where run_profile looks it up
    s = prof.ProfileSettings(model=model_path, hardware="local", batches=(1, 2), prompt_lens=(8,), gen_lens=(3,),
                             micro=False, reps=1)
    res = prof.run_profile(s, hardware, tmp_path / "out")
    assert res.interrupted
    doc = json.loads((tmp_path / "out" / "run.json").read_text())
    assert doc["status"] == "interrupted" and doc["settings"]["configs_done"] == 1
    assert len(_read(tmp_path / "out" / "generations.csv")) == 1
    assert len(_read(tmp_path / "out" / "steps.csv")) == 3 and _read(tmp_path / "out" / "ops.csv")


@pytest.mark.parametrize("changes, message", [
    (dict(backend="triton"), "Triton kernels run in the interpreter"),
    (dict(backend="flash"), "--backend"), (dict(kv="ring"), "--kv"), (dict(layers=0), "--layers"),
    (dict(batches=()), "--batch"), (dict(threads=0), "--threads"),
])
def test_bad_settings_name_the_option(changes, message, model_path):
    s = prof.ProfileSettings(model=model_path, hardware="local", **changes)
    with pytest.raises(SpecError, match=message):
        s.validate()


def test_context_beyond_positions_is_refused(model_path):
    s = prof.ProfileSettings(model=model_path, hardware="local", prompt_lens=(500,), gen_lens=(100,))
    with pytest.raises(SpecError, match="max_positions=512"):
        prof.resolve_spec(s)


def test_accuracy_benchmark_reads_the_run(run, capsys):
    from llmperf.measure import accuracy

    text, _ = accuracy.report(run.out_dir)
    for needle in ("roofline median", "calibrated median", "decode", "e2e", "critical batch", "checks:"):
        assert needle in text
    assert accuracy.main([str(run.out_dir)]) == 0
    assert accuracy.main([str(run.out_dir / "nowhere")]) == 2


def test_growth_batch_golden():
    import numpy as np

    from llmperf.measure.accuracy import _growth_batch

    # flat to batch 4, then linear: 1.5x the batch-1 time is reached halfway (in log) from 4 to 16
    assert _growth_batch(np.array([1, 4, 16]), np.array([1.0, 1.0, 2.0])) == pytest.approx(8.0)
    assert math.isnan(_growth_batch(np.array([1, 4]), np.array([1.0, 1.1])))


@pytest.mark.parametrize("q_len", [1, 16], ids=["decode", "prefill"])
def test_triton_micro_path_runs_in_the_interpreter(q_len, hardware, monkeypatch):
    """The CUDA-only micro path (Triton kernels) runs here through the interpreter, so a GPU run cannot
    fail on a typo; its timing is faked (the interpreter says nothing about speed)."""
    pytest.importorskip("triton")
    import torch

    from llmperf.analysis import ForwardModel
    from llmperf.engine import build_model
    from llmperf.measure import timers
    from llmperf.specs import ModelSpec, Precision

    monkeypatch.setattr(timers, "time_fn", lambda fn, device, **kw: (fn(), timers.summarize([1e-3]))[1])
    spec = ModelSpec(**{**TINY, "hidden_size": 64, "num_heads": 4, "num_kv_heads": 2, "num_layers": 1})
    model = build_model(spec, dtype="fp32")
    fm = ForwardModel(model=spec, precision=Precision.uniform("fp32"))
    pred = prof.Predictor(fm=fm, hardware=hardware, compute_dtype="fp32", calibrated=None)
    settings = prof.ProfileSettings(model="x", hardware="local", backend="triton")
    with torch.inference_mode():
        rows = prof._attention_micro(model, spec, pred, settings, 2, prof.Phase.prefill if q_len > 1 else
                                     prof.Phase.decode, q_len, 24)
    assert len(rows) == 1 and rows[0]["op"] == "attention" and rows[0]["measured_s"] == 1e-3


def test_paged_kv_cross_check(hardware, model_path, tmp_path):
    from llmperf.engine import build_model
    from llmperf.specs import ModelSpec, Precision

    spec = ModelSpec(**TINY)
    s = prof.ProfileSettings(model=model_path, hardware="local", kv="paged", batches=(3,), prompt_lens=(10,),
                             gen_lens=(3,))
    checks = prof.cross_checks(build_model(spec), spec, Precision.uniform("fp32"), s)
    kv = next(c for c in checks if c["name"].startswith("KV"))
    assert kv["passed"] and "3 x 16 token slots" in kv["detail"], kv


def test_steps_from_an_unrecorded_run_operators_from_a_recorded_one(hardware, model_path, tmp_path):
    """On CUDA (and on CPU when asked) the steps, TTFT, TPOT and e2e come from a run without per-operator
    recording and the operators from a second, recorded run; run.json says which is which."""
    s = prof.ProfileSettings(model=model_path, hardware="local", batches=(1,), prompt_lens=(8,), gen_lens=(4,),
                             micro=False, reps=1, threads=1, separate_step_run=True)
    res = prof.run_profile(s, hardware, tmp_path / "two")
    doc = json.loads((tmp_path / "two" / "run.json").read_text())
    assert doc["settings"]["separate_step_run"] is True
    assert "unrecorded run" in doc["measurements"]["steps"] and "unrecorded run" in doc["measurements"]["errors"]
    assert "recorded run" in doc["measurements"]["ops_generation"]
    assert len(res.steps) == 4
    for st in res.steps:  # the same greedy steps in both runs: every step has both times
        assert st["measured_s"] > 0 and st["measured_recorded_s"] > 0
    assert res.generations[0]["measured_e2e_s"] == pytest.approx(sum(st["measured_s"] for st in res.steps))
    assert {r["op"] for r in res.ops if r["kind"] == "generation"} >= {"rope", "qkv_proj", "attention"}


def test_cpu_default_is_one_recorded_run(run):
    doc = json.loads((run.out_dir / "run.json").read_text())
    assert "runs" not in doc["settings"] and "rounds" not in doc["measurements"]["steps"]  # one round: as before
    assert doc["settings"]["separate_step_run"] is False and "one run serves" in doc["measurements"]["steps"]
    assert all(st["measured_recorded_s"] == st["measured_s"] for st in run.steps)
    assert prof.ProfileSettings(model="x", hardware="h", device="cuda").two_runs


def test_generation_predictions_use_the_per_operator_overheads(run, hardware):
    """The calibrated prediction of a generation operator carries that operator's own measured dispatch
    (per layer), not one tiny call of its kind: the engine's RoPE is many framework calls."""
    from llmperf.analysis.memory import weight_bytes_per_gpu
    from llmperf.analysis.timemodel import time_model_for
    from llmperf.specs import ModelSpec as _Spec
    from llmperf.specs import Precision as _Prec

    # the tiny model's weights fit a CPU's private caches: profile predicts it with the warm overheads
    tm = time_model_for(hardware, "calibrated", "fp32", backend="sdpa",
                        weight_bytes=weight_bytes_per_gpu(_Spec(**TINY), _Prec.uniform("fp32")))
    assert tm.op_overhead_s and "rope" in tm.op_overhead_s
    doc = json.loads((run.out_dir / "run.json").read_text())
    assert doc["settings"]["calibrated_overheads"]["backend"] == "sdpa"
    L = TINY["num_layers"]
    for r in run.ops:
        if r["kind"] == "generation" and r["op"] in ("rope", "qkv_proj", "kv_write"):
            assert r["predicted_calibrated_s"] >= L * tm.op_overhead_s[r["op"]] * (1 - 1e-9), r
    # the step prediction is the engine's fused forward: one qkv_proj and one gate_up_proj per layer
    from llmperf.analysis import ForwardModel
    from llmperf.specs import ModelSpec, Precision

    fused = ForwardModel(model=ModelSpec(**TINY), precision=Precision.uniform("fp32"), fused_qkv=True,
                         fused_gate_up=True)
    pred = prof.Predictor(fm=fused, hardware=hardware, compute_dtype="fp32", calibrated=tm)
    st = next(st for st in run.steps if st["phase"] == "decode")
    assert st["predicted_calibrated_s"] == pytest.approx(pred.step(st["batch"], st["q_len"], st["kv_len"])[1])


def test_micro_rows_use_the_per_kind_overhead(run, hardware):
    """A micro-benchmark times one isolated kernel call: its prediction carries the tiny-call overhead
    of its kind, not what the engine pays around the kernel (the per-operator figure)."""
    from llmperf.analysis.timemodel import time_model_for

    tm = time_model_for(hardware, "calibrated", "fp32", backend="sdpa")
    micro = [r for r in run.ops if r["kind"] == "micro" and r["op"] in ("o_proj", "lm_head", "attention")]
    assert micro
    fm = run_fm()
    pred = prof.Predictor(fm=fm, hardware=hardware, compute_dtype="fp32", calibrated=tm)
    for r in micro:
        cost = pred.cost(Op(r["op"]), r["batch"], r["q_len"], r["kv_len"])
        kind_only = tm.op_time_s(cost, hardware, "fp32", pred.rows(cost, r["batch"], r["q_len"], fm)) \
            - tm.overhead_for(cost)[0] + tm.terms(cost.kind).overhead_s
        assert r["predicted_calibrated_s"] == pytest.approx(kind_only), r


def run_fm():
    from llmperf.analysis import ForwardModel
    from llmperf.specs import ModelSpec, Precision

    return ForwardModel(model=ModelSpec(**TINY), precision=Precision.uniform("fp32"), fused_qkv=True,
                        fused_gate_up=True)


def test_a_critical_batch_beyond_the_sweep_is_neither_met_nor_missed():
    """The measured step never grew 1.5x up to the largest batch: a prediction past half that batch
    may be right and cannot be checked (n/a); one below it is a miss whatever lies beyond."""
    from llmperf.measure.accuracy import CriticalBatch

    beyond = CriticalBatch(context=65, measured=float("nan"), predicted=36.9, largest=16)
    assert beyond.beyond_sweep and not beyond.within
    early = CriticalBatch(context=65, measured=float("nan"), predicted=6.0, largest=16)
    assert not early.beyond_sweep and not early.within
    found = CriticalBatch(context=65, measured=6.0, predicted=9.0, largest=16)
    assert not found.beyond_sweep and found.within


def test_cpu_warm_up_runs_the_real_prompts(hardware):
    """Before its timed runs, a CPU generation is warmed up on its own prompts: oneDNN builds a GEMM
    primitive on the first call of every new row count (a 64-token bf16 prefill's first QKV GEMM
    took 17x its steady time), which must not land in the measured prefill."""
    import gc

    from llmperf.analysis import ForwardModel
    from llmperf.engine import Engine, build_model
    from llmperf.specs import ModelSpec, Precision

    spec = ModelSpec(**TINY)
    engine = Engine(build_model(spec, seed=0), cache="contiguous")
    seen = []
    real = engine.generate

    def spy(prompts, params, **kw):
        seen.append(([len(p) for p in prompts], params.max_new_tokens, kw.get("recorder") is not None,
                     gc.isenabled()))
        return real(prompts, params, **kw)

    engine.generate = spy
    pred = prof.Predictor(fm=ForwardModel(model=spec, precision=Precision.uniform("fp32")), hardware=hardware,
                          compute_dtype="fp32", calibrated=None)
    s = prof.ProfileSettings(model="x", hardware="local", reps=1, threads=1)
    prof.generation(engine, spec, pred, s, "b2-p20-g4", 2, 20, 4)
    assert seen[0] == ([20, 20], 2, False, True)  # the warm-up: the same prompts, one decode step
    # the recorded run, with the garbage collector paused (a full collection inside a step is not the engine's)
    assert seen[-1] == ([20, 20], 4, True, False)
    assert gc.isenabled()


def test_the_critical_batch_reads_the_median_of_the_first_decode_steps():
    """One slow first decode step (after a 2048-token prefill: 1.75x its successors) does not move
    the measured step of its batch: each batch's step is the median of its first four."""
    import pandas as pd

    from llmperf.measure.accuracy import STEP_WINDOW, first_steps

    rows = pd.DataFrame([dict(batch=b, kv_len=2049 + i, measured_s=t)
                         for b, ts in ((1, [15.7, 14.7, 14.9, 14.7, 30.0]), (4, [38.4, 22.2, 20.9, 22.4, 21.0]))
                         for i, t in enumerate(ts)])
    assert STEP_WINDOW == 4
    assert first_steps(rows).to_dict() == {1: pytest.approx(14.8), 4: pytest.approx(22.3)}


def test_accuracy_prices_a_gpu_run_under_typical_eager_beside_the_others():
    """A committed GPU profile run: the accuracy report adds `typical + eager` on the device's datasheet,
    computed from the run's own shapes (finite, one per step and generation); a CPU run has none."""
    import json
    from pathlib import Path

    import pandas as pd

    from llmperf.measure.accuracy import report, typical_predictions

    root = Path(__file__).resolve().parents[2] / "reports" / "profile"
    gpu = root / "2026-11-25-h100-sdpa"
    run = json.loads((gpu / "run.json").read_text())
    steps, gens = pd.read_csv(gpu / "steps.csv"), pd.read_csv(gpu / "generations.csv")
    steps_pred, e2e_pred = typical_predictions(run, steps, gens)
    assert len(steps_pred) == len(steps) and (steps_pred > 0).all()
    per_config = steps_pred.groupby(steps["config"]).sum()
    assert list(e2e_pred) == [per_config[c] for c in gens["config"]]  # a generation: the sum of its steps
    text, _ = report(gpu)
    assert "typical+eager median" in text.splitlines()[4]
    cpu = root / "2026-11-25-cpu-avx2"
    cpu_run = json.loads((cpu / "run.json").read_text())
    assert typical_predictions(cpu_run, pd.read_csv(cpu / "steps.csv"), pd.read_csv(cpu / "generations.csv")) is None


def test_a_gpu_runs_dispatch_probes_are_set_beside_its_calibrations(tmp_path):
    """A GPU run's `host_dispatch` (us to issue a tiny kernel before each configuration) and its
    calibration's probe: the report says how far the host moved, overall and per configuration; the
    manifest reads them back and a CPU run.json never carries them."""
    import json
    import shutil
    from pathlib import Path

    from llmperf.measure.accuracy import report
    from llmperf.measure.profile import host
    from llmperf.measure.profile.manifest import RunManifest
    from llmperf.measure.timers import dispatch_seconds

    assert dispatch_seconds("cpu", calls=5, rounds=2) > 0
    steady = host.dispatch_lines([5.0, 5.2, 5.1], 5.0)
    assert steady == ["host dispatch during the run: median 5.10 us a kernel (5.00-5.20, 3 probes); the "
                      "calibration's 5.00 us (1.02x)"]
    moved = host.dispatch_lines([8.0, 7.5], 5.0)
    assert "(1.55x)" in moved[0] and moved[1].startswith("note the host moved since the calibration (1.55x its "
                                                         "dispatch time)")
    assert host.dispatch_lines([], 5.0) == [] and "no calibration probe" in host.dispatch_lines([5.0], None)[0]
    lines = host.config_lines([("a", 5.0), ("b", 8.0)], {"a": 0.04, "b": 0.3}, 5.0, unit="us a kernel",
                              what="host dispatch")
    assert lines[0] == "host dispatch by configuration:" and "b: host 8.0 us a kernel (1.60x)" in lines[2]
    assert host.calibration_dispatch(type("H", (), {"calibration": {"dispatch_probe_us": 4.2}})()) == 4.2
    assert host.calibration_dispatch(type("H", (), {"calibration": {}})()) is None
    root = Path(__file__).resolve().parents[2] / "reports" / "profile"
    run_dir = tmp_path / "gpu"
    shutil.copytree(root / "2026-11-25-h100-sdpa", run_dir)
    doc = json.loads((run_dir / "run.json").read_text())
    assert "host_dispatch" not in doc and "calibration_dispatch_us" not in doc["settings"]
    names = [f"b{b}-p{p}-g32" for b in (1, 8, 32) for p in (512, 2048)]
    doc["host_dispatch"] = [dict(config=c, round=0, dispatch_us=5.0 if c.startswith("b1-") else 7.0) for c in names]
    doc["settings"]["calibration_dispatch_us"] = 5.0
    (run_dir / "run.json").write_text(json.dumps(doc))
    assert RunManifest.load(run_dir / "run.json").host_dispatch[0].dispatch_us == 5.0
    text, _ = report(run_dir)
    assert "host dispatch during the run: median 7.00 us a kernel (5.00-7.00, 6 probes)" in text
    assert "host dispatch by configuration:" in text and "b1-p512-g32: host 5.0 us a kernel (1.00x)" in text
    assert "steady configurations (host within 10%): 2 of 6" in text
    cpu = json.loads((root / "2026-11-25-cpu-avx2" / "run.json").read_text())
    assert "host_dispatch" not in cpu and "calibration_dispatch_us" not in cpu["settings"]


def test_the_pipeline_diagnostic_lies_between_the_host_or_device_sum_and_the_sum_of_maxima():
    """A committed GPU run's steps priced by its calibration with host and device as a two-stage
    pipeline: at least the larger of the host's and the device's sums, at most the calibrated model's
    sum of per-operator maxima plus the largest min(host, device) of one operator (nothing runs before
    it is issued), the step overhead on both sides; exactly the closed form max over k of (host 1..k +
    device k..n); the report prints it for a GPU run as a diagnostic, never for a CPU run."""
    import json
    from pathlib import Path

    import numpy as np
    import pandas as pd

    from llmperf.analysis import ForwardModel
    from llmperf.measure.accuracy import pipeline_predictions, report
    from llmperf.measure.profile import Predictor, calibrated_model
    from llmperf.specs import Precision
    from llmperf.specs.loader import hardware_from_mapping, model_from_mapping

    root = Path(__file__).resolve().parents[2] / "reports" / "profile"
    gpu = root / "2026-11-25-h100-sdpa"
    run = json.loads((gpu / "run.json").read_text())
    s = run["settings"]
    spec, hw = model_from_mapping(s["model_spec"]), hardware_from_mapping(s["hardware_spec"])
    tm = calibrated_model(hw, spec, Precision.uniform(s["dtype"]), s["compute_dtype"], s["backend"])
    fm = ForwardModel(model=spec, precision=Precision.uniform(s["dtype"]), attention="fused", fused_qkv=True,
                      fused_gate_up=True)
    p = Predictor(fm=fm, hardware=hw, compute_dtype=s["compute_dtype"], calibrated=tm)
    for b, q, k in ((1, 1, 513), (32, 1, 2049), (8, 512, 512)):
        ops = fm.head_ops(b, q, k) + [c for kind in spec.layer_kinds() for c in fm.layer_ops(b, q, k, kind)]
        ops += fm.tail_ops(b, q, k)
        parts = np.array([tm.op_parts_s(c, hw, s["compute_dtype"], p.rows(c, b, q, fm)) for c in ops], dtype=float)
        dev, hst = parts[:, 0] + parts[:, 2], parts[:, 1]
        pipe = p.pipeline_step(b, q, k)
        closed = max(hst[:i + 1].sum() + dev[i:].sum() for i in range(len(ops))) + tm.step_overhead_s
        assert pipe == pytest.approx(closed, rel=1e-9)
        assert max(dev.sum(), hst.sum()) + tm.step_overhead_s <= pipe + 1e-12
        assert pipe <= p.step(b, q, k)[1] + np.minimum(dev, hst).max() + 1e-12
    steps = pd.read_csv(gpu / "steps.csv")
    pred = pipeline_predictions(run, steps)
    assert len(pred) == len(steps) and np.isfinite(pred).all()
    decode = steps["phase"] == "decode"  # host-bound: the pipeline below the sum of maxima at every step
    shapes = list(zip(steps["batch"], steps["q_len"], steps["kv_len"]))
    now = {key: p.step(*key)[1] for key in set(shapes)}
    assert all(x < now[key] for x, key, d in zip(pred, shapes, decode) if d)
    assert "diagnostic, not a time model: the calibrated figures with host and device as a two-stage" in report(gpu)[0]
    cpu = root / "2026-11-25-cpu-avx2"
    assert pipeline_predictions(json.loads((cpu / "run.json").read_text()), pd.read_csv(cpu / "steps.csv")) is None
    assert "two-stage" not in report(cpu)[0]


def _recorded(prefill_s, decode_s, op_s):
    """A fake run of a 1-sequence generation: one prefill, len(decode_s) decode steps, one operator a step."""
    from llmperf.engine.instrument import OpRecord, StepRecord, Trace

    steps = [StepRecord(phase="prefill", step=0, batch=1, q_len=8, kv_len=8, tokens_in_cache=8, seconds=prefill_s,
                        forward_seconds=prefill_s)]
    steps += [StepRecord(phase="decode", step=i + 1, batch=1, q_len=1, kv_len=9 + i, tokens_in_cache=9 + i,
                         seconds=s, forward_seconds=s) for i, s in enumerate(decode_s)]
    ops = [OpRecord(phase=st.phase, step=st.step, layer=0, op="qkv_proj", seconds=o, batch=1, q_len=st.q_len,
                    kv_len=st.kv_len) for st, o in zip(steps, op_s)]
    return prof.Recorded(step_trace=None, trace=Trace(ops=ops, steps=steps))


def test_rounds_take_each_step_and_operator_as_the_median_over_the_runs(hardware):
    """`--runs N`: a configuration's runs give one row per step, its time the median over the runs (one run
    in a slow spell moves nothing), and each operator the median over every run's steps."""
    from llmperf.analysis import ForwardModel
    from llmperf.specs import ModelSpec, Precision

    spec = ModelSpec(**TINY)
    pred = prof.Predictor(fm=ForwardModel(model=spec, precision=Precision.uniform("fp32")), hardware=hardware,
                          compute_dtype="fp32", calibrated=None)
    runs = [_recorded(1.0, [0.1, 0.2], [0.5, 0.05, 0.06]), _recorded(9.0, [0.3, 0.2], [4.0, 0.07, 0.08]),
            _recorded(2.0, [0.2, 0.4], [0.7, 0.05, 0.05])]
    done = prof.summarize(runs, spec, pred, "b1-p8-g3", 1, 8, 3)
    assert [(s["phase"], s["measured_s"]) for s in done.steps] == [("prefill", 2.0), ("decode", 0.2), ("decode", 0.2)]
    assert all(s["measured_recorded_s"] == s["measured_s"] for s in done.steps)
    assert done.generation["measured_ttft_s"] == 2.0 and done.generation["measured_e2e_s"] == pytest.approx(2.4)
    rows = {(r["phase"], r["kv_len"]): r for r in done.ops}
    assert rows[("prefill", 8)]["measured_s"] == 0.7 and rows[("prefill", 8)]["n"] == 3
    assert rows[("decode", 9)]["measured_s"] == 0.05 and rows[("decode", 10)]["measured_s"] == 0.06
    one = prof.summarize(runs[1:2], spec, pred, "b1-p8-g3", 1, 8, 3)  # one run: its own figures
    assert [s["measured_s"] for s in one.steps] == [9.0, 0.3, 0.2]
    with pytest.raises(ValueError, match="no runs"):
        prof.summarize([], spec, pred, "x", 1, 8, 3)


def test_rounds_interleave_the_configurations_and_say_so(hardware, model_path, tmp_path, monkeypatch):
    order = []
    real = prof_runner.record_generation

    def spy(engine, spec, settings, b, p, g):
        order.append((b, p, g))
        return real(engine, spec, settings, b, p, g)

    monkeypatch.setattr(prof_runner, "record_generation", spy)
    s = prof.ProfileSettings(model=model_path, hardware="local", batches=(1, 2), prompt_lens=(8,), gen_lens=(3,),
                             micro=False, reps=1, threads=1, runs=2)
    res = prof.run_profile(s, hardware, tmp_path / "rounds")
    assert order == [(1, 8, 3), (2, 8, 3), (1, 8, 3), (2, 8, 3)]  # every configuration once a round
    assert len(res.steps) == 2 * 3 and len(res.generations) == 2
    doc = json.loads((tmp_path / "rounds" / "run.json").read_text())
    assert doc["settings"]["runs"] == 2 and doc["settings"]["configs_done"] == 2 and doc["status"] == "complete"
    assert "median over 2 rounds" in doc["measurements"]["steps"]
    assert "median over 2 rounds" in doc["measurements"]["ops_generation"]
    # the host's DRAM read before each configuration's generation, each round, beside the calibration's
    probes = doc["host_bandwidth"]
    assert [(p["config"], p["round"]) for p in probes] == [("b1-p8-g3", 0), ("b2-p8-g3", 0), ("b1-p8-g3", 1),
                                                          ("b2-p8-g3", 1)]
    assert all(p["read_gb_per_s"] > 0 for p in probes) and doc["settings"]["calibration_bandwidth_gb_per_s"] > 0
    from llmperf.measure.accuracy import report

    assert "host DRAM read during the run: median" in report(tmp_path / "rounds")[0]
    with pytest.raises(SpecError, match="--runs: must be a positive integer, got 0"):
        prof.ProfileSettings(model="x", hardware="h", runs=0).validate()


def test_the_host_probe_is_set_against_the_calibrations_own_read():
    import torch

    from llmperf.measure.profile import host

    assert host.read_probe("cpu", 1 << 20) > 0
    layers = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Linear(256, 8))
    largest = host.weights_to_probe(layers, nbytes=1)  # the largest weight alone holds a byte
    assert [tuple(t.shape) for t in largest] == [(256, 64)]
    every = host.weights_to_probe(layers, nbytes=1 << 30)
    assert len(every) == 4 and host.read_probe("cpu", tensors=every) > 0
    from llmperf.specs import load_hardware

    cal = load_hardware("reports/calibrate/2026-11-26e-cpu-todays.yaml")
    assert host.calibration_bandwidth(cal) == pytest.approx(cal.mem_bandwidth_bytes_per_s / 1e9)
    assert host.calibration_bandwidth(load_hardware("h100-sxm")) is None  # a datasheet: nothing measured
    steady = host.drift_lines([45.0, 47.0, 46.0], 46.4)
    assert len(steady) == 1 and "median 46.0 GB/s (45.0-47.0, 3 probes of 256 MiB)" in steady[0]
    moved = host.drift_lines([66.0, 65.0, 67.0], 46.4)
    assert len(moved) == 2 and "(1.42x)" in moved[0] and moved[1].startswith("note the host moved")
    assert host.drift_lines([], 46.4) == [] and "no calibration read" in host.drift_lines([50.0], None)[0]


def test_profile_says_when_the_host_moved_since_its_calibration():
    """A calibration written on a busier machine (the first profile on a busy machine calibrates first)
    prices every calibrated step off: `profile`'s notes say so, not only the report."""
    from types import SimpleNamespace

    from llmperf.measure.profile import host
    from llmperf.measure.profile.manifest import DispatchProbe, HostProbe, RunSettings

    def run(probes, cal, dispatch=(), cal_us=None):
        return SimpleNamespace(host_bandwidth=[HostProbe(config="b1", round=0, read_gb_per_s=p) for p in probes],
                               host_dispatch=[DispatchProbe(config="b1", round=0, dispatch_us=d) for d in dispatch],
                               settings=RunSettings(calibration_bandwidth_gb_per_s=cal, calibration_dispatch_us=cal_us))

    moved = host.host_moved_notes(run([66.0, 65.0, 67.0], 46.4))
    assert len(moved) == 1 and moved[0].startswith("the host moved since the calibration (1.42x its DRAM bandwidth)")
    assert host.host_moved_notes(run([46.0, 47.0], 46.4)) == []
    assert host.host_moved_notes(run([66.0], None)) == []  # nothing calibrated to compare
    gpu = host.host_moved_notes(run([], None, dispatch=[9.0, 9.5], cal_us=6.0))
    assert len(gpu) == 1 and "its dispatch time" in gpu[0] and "host-bound steps" in gpu[0]


def test_the_report_sets_each_configurations_probe_beside_its_decode_error():
    from llmperf.measure.profile import host

    probes = [("a", 70.0), ("b", 48.0), ("a", 72.0), ("b", 50.0), ("c", 69.0)]
    lines = host.config_lines(probes, {"a": 0.05, "b": 0.25, "c": 0.09}, 70.9)
    assert lines[0] == "host bandwidth by configuration:"
    assert "a: host 71.0 GB/s (1.00x), calibrated decode median 5.0%" in lines[1]
    assert "b: host 49.0 GB/s (0.69x)" in lines[2]
    assert lines[-1].strip() == "steady configurations (host within 10%): 2 of 3, decode median 7.0%"
    assert host.config_lines(probes, {"a": 0.05}, 70.9) == []  # one configuration: nothing to set apart
    assert host.config_lines(probes, {"a": 0.05, "b": 0.2}, None) == []
    none = host.config_lines([("a", 40.0), ("b", 41.0)], {"a": 0.3, "b": 0.3}, 70.9)
    assert none[-1].strip() == "steady configurations (host within 10%): none of 2"
