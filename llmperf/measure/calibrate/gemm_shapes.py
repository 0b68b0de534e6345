"""CUDA: the GEMM shape model's sweep and fit.

`F.linear` over real projections' shapes (Llama 3 8B's, Llama 3 70B's at TP 8) and rows 1 .. 8192
per measured 16-bit dtype, timed by `triton.testing.do_bench` with the L2 flushed, then fitted as
`llmperf.analysis.gemm` (`llmperf.measure.fit_gemm`) against the calibration's own ceilings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from llmperf.measure.calibrate.settings import DTYPE_NAMES, Progress
from llmperf.specs.local import CALIBRATION_TOOL

if TYPE_CHECKING:
    from llmperf.measure.calibrate.calibration import Calibration


#: CUDA: the (N, K) of the shape sweep: Llama-3-8B's projections and Llama-3-70B's at TP 8 (narrow K / N)
GEMM_SHAPE_NK = ((4096, 4096), (28672, 4096), (4096, 14336), (1280, 8192), (8192, 1024))
GEMM_SHAPE_ROWS = (1, 8, 32, 128, 512, 2048, 8192)


def measure_gemm_shapes(dtypes: Sequence[str], device: Any, progress: Progress
                        ) -> list[tuple[str, int, int, int, float]]:
    """CUDA: `F.linear` over real projections' shapes and rows 1 .. 8192 per measured 16-bit dtype
    (`triton.testing.do_bench`, L2 flushed): what the GEMM shape model (`llmperf.analysis.gemm`) is
    fitted on for this device."""
    import torch

    from llmperf.measure.gpu_terms import _bench_s

    out = []
    for dname in (d for d in dtypes if d in ("bf16", "fp16")):
        dt = getattr(torch, DTYPE_NAMES[dname])
        for n, k in GEMM_SHAPE_NK:
            progress(f"GEMM shapes {dname} {n}x{k}")
            w = torch.randn(n, k, device=device, dtype=dt) * 0.02
            for m in GEMM_SHAPE_ROWS:
                x = torch.randn(m, k, device=device, dtype=dt)
                out.append((dname, m, n, k, _bench_s(lambda: torch.nn.functional.linear(x, w))))
            w = None  # freed now (a `del` would unbind what the timed lambdas close over)
    return out


def fit_gemm_shapes(cal: Calibration) -> dict[str, Any] | None:
    """The GEMM shape model's terms fitted on `cal.gemm_shapes` against the ceilings the calibration
    measured (its peak per dtype, its bandwidth, the device's SMs); None without points."""
    if not cal.gemm_shapes:
        return None
    import numpy as np
    import pandas as pd

    from llmperf.measure.fit_gemm import fit
    from llmperf.specs.precision import dtype_bytes

    df = pd.DataFrame(cal.gemm_shapes, columns=["dtype", "m", "n", "k", "time_s"]).assign(groups=1.0)
    peak = np.array([cal.peak_flops_per_s(d) for d in df["dtype"]])
    sms = float(cal.device.get("sms") or (cal.datasheet.num_sms if cal.datasheet else 1))
    devices = (peak, np.full(len(df), cal.memory_bytes_per_s()), np.full(len(df), sms),
               np.array([dtype_bytes(d) for d in df["dtype"]]))
    params = fit(df, devices, source=f"{CALIBRATION_TOOL}, {cal.created}: F.linear over "
                                     f"{len(GEMM_SHAPE_NK)} shapes x {len(GEMM_SHAPE_ROWS)} row counts")
    return params.to_dict()
