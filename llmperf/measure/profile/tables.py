"""The CSV tables of a profile run directory and their rows: `ops.csv`, `steps.csv`,
`generations.csv`, `experts.csv` (exact column names: docs/schemas.md), appended and flushed row by
row so an interrupted sweep keeps them; and the errors of `run.json`: median and p90 of
|predicted / measured - 1| per phase over every prefill step, every decode step, and every whole
generation (`e2e`).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from llmperf.analysis.roofline import OpCost
from llmperf.analysis.vocabulary import Phase
from llmperf.specs import HardwareSpec

E2E = "e2e"  # the error row of whole generations (not a step phase)
OPS_COLUMNS = ("kind", "phase", "op", "batch", "q_len", "kv_len", "measured_s", "measured_spread_s", "n",
               "predicted_roofline_s", "predicted_calibrated_s", "ratio_roofline", "ratio_calibrated", "flops",
               "bytes", "intensity", "achieved_flops_per_s", "achieved_bytes_per_s", "roofline_fraction", "bound",
               "layer")
STEPS_COLUMNS = ("config", "step", "phase", "batch", "q_len", "kv_len", "measured_s", "measured_recorded_s",
                 "predicted_roofline_s", "predicted_calibrated_s")
GENERATIONS_COLUMNS = ("config", "batch", "prompt_len", "gen_len", "measured_ttft_s", "measured_tpot_s",
                       "measured_e2e_s", "predicted_ttft_s_roofline", "predicted_tpot_s_roofline",
                       "predicted_e2e_s_roofline", "predicted_ttft_s_calibrated", "predicted_tpot_s_calibrated",
                       "predicted_e2e_s_calibrated")
EXPERTS_COLUMNS = ("config", "phase", "step", "layer", "batch", "q_len", "kv_len", "tokens", "experts_touched",
                   "expected_uniform")
EXPERT_BALANCE_COLUMNS = ("config", "phase", "step", "layer", "tokens", "ep", "busiest_rows", "busiest_touched",
                          "predicted_rows", "predicted_touched", "mean_rows")
MODEL_LEVEL = "model"  # the `layer` of a model-level operator's row (embed, final_norm, lm_head, ...)


class _Table:
    """A CSV file whose rows are appended and flushed one by one."""

    def __init__(self, folder: Any, name: str, columns: Iterable[str]) -> None:
        self.path = folder.path / name
        self.columns = tuple(columns)
        self._fh = folder.open_stream(name)  # llmperf.outputs.OutputDir: checked, 0666 less the umask
        self._writer = csv.DictWriter(self._fh, fieldnames=self.columns)
        self._writer.writeheader()
        self._fh.flush()
        self.rows: list[dict[str, Any]] = []

    def append(self, row: dict[str, Any]) -> None:
        missing = set(self.columns) - set(row)
        assert not missing, f"{self.path.name}: row lacks {sorted(missing)}"
        self._writer.writerow({k: row[k] for k in self.columns})
        self._fh.flush()
        self.rows.append(row)

    def close(self) -> None:
        self._fh.close()


def error_stats(pred: Iterable[float], meas: Iterable[float]) -> tuple[float, float, int]:
    """Median and p90 of |pred / meas - 1| (pairs with a NaN prediction are skipped)."""
    errs = sorted(abs(p / m - 1) for p, m in zip(pred, meas) if m > 0 and math.isfinite(p))
    if not errs:
        return math.nan, math.nan, 0
    return float(np.median(errs)), float(np.quantile(errs, 0.9)), len(errs)


def errors_table(steps: list[dict[str, Any]], gens: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for model in ("roofline", "calibrated"):
        for phase in (Phase.prefill.value, Phase.decode.value):
            rows = [s for s in steps if s["phase"] == phase]
            med, p90, n = error_stats([r[f"predicted_{model}_s"] for r in rows], [r["measured_s"] for r in rows])
            out.append(dict(phase=phase, model=model, median_abs_err=med, p90_abs_err=p90, n=n))
        med, p90, n = error_stats([g[f"predicted_e2e_s_{model}"] for g in gens], [g["measured_e2e_s"] for g in gens])
        out.append(dict(phase=E2E, model=model, median_abs_err=med, p90_abs_err=p90, n=n))
    return out


def op_row(kind: str, phase: str, op: str, batch: int, q_len: int, kv_len: int, measured: float, spread: float,
           n: int, cost: OpCost | None, pred: tuple[float, float], hardware: HardwareSpec, compute_dtype: str,
           layers: int = 1, layer: str = "") -> dict[str, Any]:
    """One ops.csv row; `layers` multiplies a per-layer cost when the measurement sums the layers of
    one kind; `layer` names that kind (`LayerKind.label`, or `model` for a model-level operator)."""
    roof, cal = pred
    flops = float(cost.flops) * layers if cost else math.nan
    nbytes = float(cost.bytes_total) * layers if cost else math.nan
    compute_s = flops / (hardware.peak_flops_per_s(compute_dtype) if cost and cost.kind in ("matmul", "attention")
                         else hardware.peak_flops_per_s("fp32"))
    memory_s = nbytes / hardware.mem_bandwidth_bytes_per_s
    return dict(
        kind=kind, phase=phase, op=op, batch=batch, q_len=q_len, kv_len=kv_len, measured_s=measured,
        measured_spread_s=spread, n=n, predicted_roofline_s=roof, predicted_calibrated_s=cal,
        ratio_roofline=roof / measured if measured > 0 else math.nan,
        ratio_calibrated=cal / measured if measured > 0 else math.nan,
        flops=flops, bytes=nbytes, intensity=flops / nbytes if nbytes else math.nan,
        achieved_flops_per_s=flops / measured if measured > 0 else math.nan,
        achieved_bytes_per_s=nbytes / measured if measured > 0 else math.nan,
        roofline_fraction=roof / measured if measured > 0 else math.nan,
        bound="compute" if compute_s > memory_s else "memory", layer=layer)
