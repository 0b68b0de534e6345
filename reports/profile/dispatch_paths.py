"""Each operator of a committed CPU profile priced again with its calibration's dispatch one way and the
other: `for_model` (the path the model's decode step takes: in one call, or each operator called one by
one; a routed expert's own operators by their own figures) against the rows table alone (what every model
paid before schema 8). Prints, per operator and
phase, the median predicted / measured of both, and the step medians. The measured times are the run's.

    python reports/profile/dispatch_paths.py reports/profile/2026-11-27j-cpu-qwen3-8b [...]
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from llmperf.analysis.timemodel import time_model_for
from llmperf.analysis.vocabulary import Op
from llmperf.measure.accuracy import _run_predictor
from llmperf.measure.profile import RunManifest, error_stats
from llmperf.specs.loader import hardware_from_mapping


def main(runs: list[str]) -> None:
    for path in map(Path, runs):
        run = RunManifest.load(path / "run.json")
        new = _run_predictor(run, "the dispatch paths")
        hw = hardware_from_mapping(dict(run.settings.hardware_spec), origin=str(run.hardware))
        rows = time_model_for(hw, "calibrated", new.compute_dtype, backend=run.settings.backend or "sdpa")
        old = replace(new, calibrated=replace(new.calibrated, op_overhead_rows=rows.op_overhead_rows,
                                              op_overhead_rows_expert={}, prefill=None))
        ops = pd.read_csv(path / "ops.csv")
        ops = ops[ops.kind == "generation"].copy()
        groups = {kind.label: (kind, count) for kind, count in new.fm.model.layer_groups()}  # as profile joins
        for name, pred in (("rows table alone", old), ("for_model", new)):
            ratios = []
            for r in ops.itertuples():
                kind, layers = groups.get(r.layer, (None, 1))
                cost = pred.cost(Op(r.op), r.batch, r.q_len, r.kv_len, kind)
                ratios.append(pred.times(cost, r.batch, r.q_len)[1] * layers / r.measured_s)
            ops[name] = ratios
        table = ops.groupby(["phase", "op"])[["rows table alone", "for_model"]].median().round(2)
        print(f"# {path}: median predicted / measured per operator (calibrated)\n{table.to_string()}")
        for phase, g in ops.groupby("phase"):
            off = {name: np.median(np.abs(g[name] - 1)) for name in ("rows table alone", "for_model")}
            print(f"{phase} operators |pred/meas - 1| median: " + ", ".join(f"{k} {v:.1%}" for k, v in off.items()))
        steps = pd.read_csv(path / "steps.csv")
        for name, pred in (("rows table alone", old), ("for_model", new)):
            errs = {ph: error_stats([pred.step(r.batch, r.q_len, r.kv_len)[1] for r in g.itertuples()], g.measured_s)[0]
                    for ph, g in steps.groupby("phase")}
            print(f"steps, {name}: " + ", ".join(f"{ph} median {e:.1%}" for ph, e in errs.items()))


if __name__ == "__main__":
    main(sys.argv[1:])
