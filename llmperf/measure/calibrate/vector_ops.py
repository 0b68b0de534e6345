"""The engine's vector operators at size: memory efficiency over the bytes one call moves.

Norms, RoPE, the gated activation, residual adds and the KV write are several framework calls each,
with fresh (page-faulting) outputs, so a large prefill runs them at a fraction of the streaming
bandwidth. Recorded prefills of a hidden-512 one-layer model (`VECTOR_SPEC`) at 128 to 32768 tokens
give each operator's `op_e_memory` curve, against the analytical bytes of the same call
(`llmperf.analysis.operators`, the engine's fused GEMMs).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from llmperf.measure.calibrate.ceilings import sweep_budget_s, sweep_fits
from llmperf.measure.calibrate.fit import fit_op_e_memory
from llmperf.measure.calibrate.settings import Progress, Settings
from llmperf.measure.timers import gc_paused

#: the model whose recorded prefills measure the engine's vector operators at size (hidden 512, one
#: layer: nothing like an evaluated model; its GEMMs are small, so a 32 x 1024 prefill takes a second)
VECTOR_SPEC = dict(name="calibrate-vector", vocab_size=256, hidden_size=512, num_layers=1, num_heads=4,
                   num_kv_heads=2, ffn_size=1536, max_positions=2048, qk_norm="rmsnorm")  # q/k norms: Qwen3, Gemma 3


def measure_op_e_memory(s: Settings, device: Any, progress: Progress, dtypes: Sequence[str], bw: float,
                        overheads: dict[str, dict[str, float]], notes: list[str] | None = None
                        ) -> dict[str, dict[str, list[list[float]]]]:
    """Per compute dtype, the memory efficiency of each engine vector operator (norms, RoPE, the gated
    activation, residual adds, the KV write, the embedding, the q/k norms) as a function of the bytes one call moves:
    the median time of each operator over `vector_reps` recorded prefills of `VECTOR_SPEC` at each
    (batch, prompt) of `s.vector_prefills`, less its dispatch overhead, against the analytical bytes
    of the same call (`llmperf.analysis.operators`, the engine's fused GEMMs). `overheads`: per dtype,
    the dispatch the time model adds to each operator (none for a dtype it lacks). The prefills of a
    dtype stop before one predicted to take them past `s.vector_budget_s` (noted in `notes`)."""
    import statistics
    from collections import defaultdict

    from llmperf.analysis.operators import ForwardModel
    from llmperf.analysis.timemodel import BYTES_CURVE_OPS
    from llmperf.engine import Engine, Recorder, SamplingParams, build_model
    from llmperf.specs import ModelSpec, Precision

    spec = ModelSpec(**VECTOR_SPEC)
    params = SamplingParams(max_new_tokens=1)
    notes = [] if notes is None else notes
    out: dict[str, dict[str, list[list[float]]]] = {}
    for dname in dtypes:
        try:
            engine = Engine(build_model(spec, seed=0, dtype=dname, device=device), cache="contiguous")
        except (RuntimeError, ValueError):
            continue
        fm = ForwardModel(model=spec, precision=Precision.uniform(dname), fused_qkv=True, fused_gate_up=True)
        samples: dict[str, list[tuple[float, float]]] = defaultdict(list)
        spent, last = 0.0, None  # seconds of this dtype's prefills so far; (tokens, warm-up seconds) of the last
        budget = sweep_budget_s(s, dname, device, s.vector_budget_s)
        for batch, prompt_len in s.vector_prefills:
            # a prefill's time grows about linearly in its tokens (a little faster: attention)
            one_s = last[1] * batch * prompt_len / last[0] if last else 0.0
            if last and not sweep_fits(spent, one_s * (1 + s.vector_reps), budget):
                notes.append(f"vector operators {dname}: stopped before {batch}x{prompt_len} (predicted "
                             f"{one_s:.2g} s a prefill; {spent:.1f} s spent of {budget:g} s)")
                break
            progress(f"vector operators {dname} {batch}x{prompt_len}")
            prompts = [[1 + (7 * i + j) % (spec.vocab_size - 1) for j in range(prompt_len)] for i in range(batch)]
            started = time.perf_counter()
            engine.generate(prompts, params)  # warm-up: the same shapes
            last = (batch * prompt_len, time.perf_counter() - started)
            times: dict[str, list[float]] = defaultdict(list)
            for _ in range(s.vector_reps):
                rec = Recorder(device)
                with gc_paused():
                    engine.generate(prompts, params, recorder=rec)
                for r in rec.trace.ops:
                    if r.phase == "prefill" and r.op in BYTES_CURVE_OPS:
                        times[r.op].append(r.seconds)
            spent += time.perf_counter() - started
            costs = {c.name: c for c in fm.forward_ops(batch, prompt_len, prompt_len)}  # one layer: one call each
            for op, ts in times.items():
                if op in costs:
                    samples[op].append((float(costs[op].bytes_total), float(statistics.median(ts))))
        del engine
        out[dname] = fit_op_e_memory(samples, bw, overheads.get(dname, {}))
    return out
