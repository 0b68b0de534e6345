"""`calibrate()`: every measurement of a calibration in order, on the device `Settings.device` names,
into one `Calibration` (ceilings in plain torch, the engine's GEMM sweep, shape terms on CUDA, GEMMs by
weight size on CPU, engine overheads, vector operators, all-reduce). Each step is a module of this
package; a measurement a device cannot make is noted.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from llmperf.measure.calibrate.allreduce import measure_allreduce
from llmperf.measure.calibrate.attention import fit_attention_shapes, measure_attention, measure_attention_shapes
from llmperf.measure.calibrate.calibration import Calibration
from llmperf.measure.calibrate.ceilings import (
    engine_gemm_is_plain_torch,
    measure_gemm,
    measure_streams,
    measure_torch_gemm,
)
from llmperf.measure.calibrate.cpu_gemm_sizes import measure_gemm_sizes
from llmperf.measure.calibrate.floors import measure_floors, measure_overheads
from llmperf.measure.calibrate.gemm_shapes import fit_gemm_shapes, measure_gemm_shapes
from llmperf.measure.calibrate.operators import (
    measure_by_op_rows,
    measure_family_dispatch,
    measure_op_overhead_rows,
    measure_op_overheads,
    measure_step_overhead,
    one_call_facts,
    op_overhead_backends,
)
from llmperf.measure.calibrate.settings import Progress, Settings
from llmperf.measure.calibrate.vector_ops import measure_op_e_memory
from llmperf.measure.device import describe, versions
from llmperf.measure.timers import dispatch_seconds


def calibrate(settings: Settings | None = None, *, progress: Progress | None = None) -> Calibration:
    """Measure the device `settings.device` names: every measurement of `llmperf.measure.calibrate`'s modules."""
    import torch

    s = settings or Settings()
    device = torch.device(s.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device: cuda requested but torch sees no CUDA device")
    tick = progress or (lambda msg: None)
    previous_threads = torch.get_num_threads()
    if s.threads is not None:
        if s.threads < 1:
            raise ValueError(f"--threads: must be a positive integer, got {s.threads}")
        torch.set_num_threads(s.threads)
    try:
        return _calibrate(s, device, tick)
    finally:
        torch.set_num_threads(previous_threads)


def _calibrate(s: Settings, device: Any, tick: Progress) -> Calibration:
    import torch

    from llmperf.specs import match_hardware

    dev = describe(device)  # on a CPU also settles the allocator as the engine runs (before the first buffer)
    cal = Calibration(device=dev, versions=versions(), settings=s,
                      created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    if device.type == "cuda":
        cal.datasheet = match_hardware(dev["name"])
    with torch.inference_mode():
        cal.streams = measure_streams(s, device, tick)
        gemm, notes = measure_gemm(s, device, tick)
        cal.torch_gemm, torch_notes = measure_torch_gemm(s, device, tick, gemm)
        cal.plain_torch_dtypes = [d for d in dict.fromkeys(p.dtype for p in gemm)
                                  if engine_gemm_is_plain_torch(d, device)]
        cal.compute = gemm + measure_attention(s, device, tick)
        cal.notes += notes + torch_notes
        cal.overhead_s = measure_overheads(device, tick)
        if device.type == "cuda":
            cal.floor_s = measure_floors(device, tick)
            cal.gemm_shapes = measure_gemm_shapes(cal.measured_dtypes(), device, tick)
            cal.gemm = fit_gemm_shapes(cal)
            cal.attention_shapes = measure_attention_shapes(device, tick)
            cal.attention_eff = fit_attention_shapes(cal)
        elif s.gemm_sizes:
            cal.gemm_sizes = measure_gemm_sizes(s, device, tick, cal.measured_dtypes(), cal.notes)
    if s.step_overhead:
        cal.step_overhead_s = measure_step_overhead(device, tick)
    if s.op_overhead:
        if device.type == "cuda":  # the host's speed now, beside its operator figures (profile probes it too)
            cal.dispatch_probe_s = dispatch_seconds(device)
        with torch.inference_mode():
            cal.op_overhead_s = measure_op_overheads(s, device, tick, notes=cal.notes)
            if device.type == "cuda":  # a CPU times them in situ (measure_op_overhead_rows)
                for backend, ops in measure_family_dispatch(s, device, tick, cal.notes).items():
                    cal.op_overhead_s.setdefault(backend, {}).update(ops)
            if device.type == "cpu":
                cal.op_overhead_warm_s = measure_op_overheads(s, device, tick, cold=False)
                cal.op_overhead_rows_s, cal.op_overhead_rows_expert_s = measure_op_overhead_rows(
                    s, device, tick, cal.op_overhead_s, cal.notes)
                cal.op_overhead_rows_by_op_s = measure_by_op_rows(s, device, tick, cal.notes)
                cal.one_call = one_call_facts(device) if cal.op_overhead_rows_by_op_s else {}
                fp32 = cal.op_overhead_rows_s.get("fp32", {})
                if fp32:  # the per-operator fallback: fp32, one row, as the rows table has it
                    cal.op_overhead_s = {b: {op: pts[0][1] for op, pts in ops.items()} for b, ops in fp32.items()}
        missing = [b for b in op_overhead_backends(device) if b not in cal.op_overhead_s]
        if missing:
            cal.notes.append(f"operator overheads not measured for {', '.join(missing)}: the per-kind figures apply")
    if s.vector_prefills and cal.measured_dtypes():
        with torch.inference_mode():
            # CPU: dispatch is serial with the work, so it comes off each call (the figure a prefill is
            # priced with: its dtype's, at the most rows measured); CUDA: event times are device time
            overheads = {}
            if device.type == "cpu":  # a prefill dispatches its operators one by one (by_op), where measured
                rows_s, by_op = cal.op_overhead_rows_s, cal.op_overhead_rows_by_op_s
                overheads = {d: ({op: pts[-1][1] for op, pts in rows_s.get(d, {}).get("sdpa", {}).items()}
                                 | {op: pts[-1][1] for op, pts in by_op.get(d, {}).get("sdpa", {}).items()})
                             or cal.op_overhead_s.get("sdpa", {}) for d in cal.measured_dtypes()}
            cal.op_e_memory = measure_op_e_memory(s, device, tick, cal.measured_dtypes(), cal.memory_bytes_per_s(),
                                                  overheads, cal.notes)
    if s.allreduce:
        try:
            cal.allreduce = measure_allreduce(s, device, tick)
            if not cal.allreduce:
                cal.notes.append("all-reduce not measured: one CUDA device (NCCL needs two or more)")
        except Exception as exc:  # noqa: BLE001 - a sandbox without sockets/shm still calibrates the rest
            cal.notes.append(f"all-reduce not measured ({type(exc).__name__}: {str(exc).splitlines()[0]})")
    if not cal.measured_dtypes():
        raise ValueError(f"--dtypes: no GEMM could be timed for {', '.join(s.dtypes)}")
    return cal
