"""Small synthetic run directories that follow the run-directory contract (profile, simulate), for
the report's tests. Numbers are made up but consistent (ratio = predicted / measured)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from llmperf.analysis.vocabulary import Op, Phase
from llmperf.report.runs import (
    PROFILE_GENERATIONS_COLUMNS,
    PROFILE_OPS_COLUMNS,
    PROFILE_STEPS_COLUMNS,
    SIMULATE_RATES_COLUMNS,
    SIMULATE_REQUESTS_COLUMNS,
    SIMULATE_STEPS_COLUMNS,
)

OPS = (Op.q_proj, Op.attention, Op.down_proj, Op.attn_norm)


def write_profile(folder: Path, *, model: str = "tiny-llama", hardware: str = "a100-80gb-sxm") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rows = []
    for phase, q in ((Phase.prefill, 64), (Phase.decode, 1)):
        for op in OPS:
            for batch in (1, 4):
                flops = 2.0e6 * batch * q * (3 if op is Op.down_proj else 1)
                nbytes = 1.0e6 + 4e3 * batch * q
                measured = max(flops / 1e11, nbytes / 2e10) * (1 + 0.1 * rng.random())
                roof, cal = measured * 0.3, measured * (0.9 + 0.2 * rng.random())
                rows.append(dict(kind="micro", phase=phase.value, op=op.value, batch=batch, q_len=q, kv_len=q + 16,
                                 measured_s=measured, measured_spread_s=measured * 0.05, n=7,
                                 predicted_roofline_s=roof, predicted_calibrated_s=cal, ratio_roofline=roof / measured,
                                 ratio_calibrated=cal / measured, flops=flops, bytes=nbytes, intensity=flops / nbytes,
                                 achieved_flops_per_s=flops / measured, achieved_bytes_per_s=nbytes / measured,
                                 roofline_fraction=roof / measured,
                                 bound="compute" if flops / nbytes > 100 else "memory"))
    pd.DataFrame(rows, columns=PROFILE_OPS_COLUMNS).to_csv(folder / "ops.csv", index=False)
    steps = [dict(config="b{b}".format(b=b), step=s, phase="decode", batch=b, q_len=1, kv_len=32 + s,
                  measured_s=1e-3 * (1 + 0.05 * b), predicted_roofline_s=3e-4 * (1 + 0.05 * b),
                  predicted_calibrated_s=9e-4 * (1 + 0.05 * b)) for b in (1, 2, 4, 8) for s in range(3)]
    pd.DataFrame(steps, columns=PROFILE_STEPS_COLUMNS).to_csv(folder / "steps.csv", index=False)
    gens = [dict(config=f"b{b}", batch=b, prompt_len=32, gen_len=8, measured_ttft_s=0.01, measured_tpot_s=1e-3,
                 measured_e2e_s=0.017, predicted_ttft_s_roofline=0.003, predicted_tpot_s_roofline=3e-4,
                 predicted_e2e_s_roofline=0.005, predicted_ttft_s_calibrated=0.009, predicted_tpot_s_calibrated=9e-4,
                 predicted_e2e_s_calibrated=0.015) for b in (1, 4)]
    pd.DataFrame(gens, columns=PROFILE_GENERATIONS_COLUMNS).to_csv(folder / "generations.csv", index=False)
    (folder / "run.json").write_text(json.dumps(dict(
        kind="profile", schema_version=1, created="2026-11-23T02:00:00+00:00", model=model, hardware=hardware,
        device={"name": "synthetic", "threads": 2}, versions={"llmperf": "0.1.0"}, git_commit=None,
        settings={"dtype": "fp16"},
        errors=[dict(phase="decode", model="roofline", median_abs_err=0.7, p90_abs_err=0.72, n=8),
                dict(phase="decode", model="calibrated", median_abs_err=0.05, p90_abs_err=0.1, n=8)],
        checks=[dict(name="decode memory-bound", passed=True, detail=f"{model} ok")])))
    return folder


def write_simulate(folder: Path, *, model: str = "llama-3.1-8b", hardware: str = "a100-80gb-sxm",
                   rates: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    n = 40
    arrival = np.cumsum(rng.exponential(0.1, n))
    ttft = 0.05 + rng.exponential(0.05, n)
    tpot = 0.02 + rng.exponential(0.005, n)
    out = rng.integers(8, 64, n)
    first = arrival + ttft
    finish = first + tpot * (out - 1)
    req = pd.DataFrame(dict(request_id=np.arange(n), arrival_s=arrival, prompt_tokens=rng.integers(32, 512, n),
                            output_tokens=out, first_token_s=first, finish_s=finish, ttft_s=ttft, tpot_s=tpot,
                            e2e_s=finish - arrival, queue_s=ttft * 0.2, preemptions=0),
                            columns=SIMULATE_REQUESTS_COLUMNS)
    req.to_csv(folder / "requests.csv", index=False)
    m = 120
    start = np.linspace(0, float(finish.max()), m)
    steps = pd.DataFrame(dict(step=np.arange(m), start_s=start, duration_s=np.full(m, 0.02),
                              phase=np.where(np.arange(m) % 5 == 0, "prefill", "decode"),
                              batch=rng.integers(1, 16, m), prefill_tokens=0, decode_tokens=8,
                              kv_used_bytes=1e8, kv_reserved_bytes=1.2e8, kv_util=rng.uniform(0.5, 0.95, m),
                              running=rng.integers(1, 16, m), waiting=rng.integers(0, 4, m), preemptions=0),
                         columns=SIMULATE_STEPS_COLUMNS)
    steps.to_csv(folder / "steps.csv", index=False)
    if rates:
        r = np.array([1.0, 2.0, 4.0, 8.0])
        pd.DataFrame(dict(rate=r, ttft_p50=0.05 * r, ttft_p90=0.08 * r, ttft_p99=0.1 * r, tpot_p50=0.02 + 0.001 * r,
                          tpot_p90=0.025 + 0.001 * r, tpot_p99=0.03 + 0.002 * r, goodput_rps=r * 0.9,
                          throughput_rps=r, meets_slo=[True, True, False, False]),
                     columns=SIMULATE_RATES_COLUMNS).to_csv(folder / "rates.csv", index=False)
    q = {"p50": 0.06, "p90": 0.1, "p99": 0.2, "mean": 0.07}
    (folder / "run.json").write_text(json.dumps(dict(
        kind="simulate", schema_version=1, created="2026-11-23T02:00:00+00:00", model=model, hardware=hardware,
        settings={"rate": 10.0, "slo_ttft_s": 0.2, "slo_tpot_s": 0.05, "policy": "continuous"},
        summary={"ttft_s": q, "tpot_s": q, "e2e_s": q, "queue_s": q, "throughput_rps": 9.5, "tokens_per_s": 300.0,
                 "goodput_rps": 9.0, "preemptions": 0, "requests": n})))
    return folder
