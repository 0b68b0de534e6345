"""A `python -m llmperf.measure.streaming` run's measured steps priced again by a calibration with and
without its decode-attention group terms (`decode_attention`, efficiency schema 9), so the term's own
effect is read on the same measured steps and the same calibration (`reports/streaming/README.md`,
"2026-11-27-cpu-group").

Printed per series (plain decoding, the stream): the median |predicted / measured - 1| of its steps
under the calibration as written and with `decode_attention` removed (schema 8: the attention curves,
as before the term); then the predicted milliseconds of plain decoding's first step by operator
(summed over the layers) under both, beside the measured step.

    python reports/streaming/2026-11-27-cpu-group/reprice.py RUN_DIR CALIBRATION.yaml MODEL.yaml
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def main() -> None:
    import yaml

    from llmperf.analysis.phase import phase_time_s
    from llmperf.analysis.rollup import Conventions, forward_model
    from llmperf.analysis.roofline import model_time_model, op_time, phase_time_model
    from llmperf.analysis.timemodel import time_model_for
    from llmperf.specs import Precision, load_model
    from llmperf.specs.local import load_calibrated
    from llmperf.specs.streaming import streaming

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("calibration", type=Path)
    ap.add_argument("model")
    args = ap.parse_args()
    run = json.loads((args.run / "streaming.json").read_text())
    settings = run["settings"]
    raw = yaml.safe_load(args.calibration.read_text())
    without = {**raw, "efficiency": {**{k: v for k, v in raw["efficiency"].items() if k != "decode_attention"},
                                     "schema_version": 8}}
    plain_tmp = args.run / "calibration-without-group.yaml"  # written beside the run, read back, removed
    plain_tmp.write_text(yaml.safe_dump(without, sort_keys=False))
    try:
        hws = {"with group": load_calibrated(args.calibration), "without": load_calibrated(plain_tmp)}
    finally:
        plain_tmp.unlink()
    spec, batch = load_model(args.model), float(settings["batch"])
    sinks, window = settings["sinks"], settings["window"]
    first_ops = {}
    for label, hw in hws.items():
        tm = time_model_for(hw, "calibrated", "fp32")
        for series in run["series"]:
            s = spec if series["name"] == "plain" else streaming(spec, sinks, window)
            fm = forward_model(s, Precision.uniform("fp32"), Conventions(), 1)
            tmd = phase_time_model(model_time_model(tm, s), "decode")
            ctx = np.asarray(series["context"], dtype=float)  # the stream's: min(context, S + W), its window's keys
            pred = np.asarray(phase_time_s(fm, hw, batch, 1.0, ctx, compute_dtype="fp32", time_model=tmd), dtype=float)
            meas = np.asarray(series["measured_s"])
            err, recorded = (np.median(np.abs(p / meas - 1.0)) for p in (pred, np.asarray(series["predicted_s"])))
            print(f"{label:>10}  {series['name']:>18}: median |pred/meas-1| {err:.1%}  (recorded at the run: "
                  f"{recorded:.1%})")
            if series["name"] == "plain":
                ops: dict[str, float] = {}
                for c in fm.forward_ops(batch, 1.0, ctx[0]):
                    ops[c.name] = ops.get(c.name, 0.0) + float(op_time(c, hw, "fp32", tmd).time_s)
                first_ops[label] = (ops, series["measured_s"][0], ctx[0])
    labels = list(first_ops)
    ops0, meas, keys = first_ops[labels[0]]
    print(f"plain decoding, first step ({keys:.0f} keys): measured {meas * 1e3:.2f} ms; predicted by operator, ms:")
    print(f"{'operator':>14} " + " ".join(f"{lab:>11}" for lab in labels))
    for name in ops0:
        print(f"{name:>14} " + " ".join(f"{first_ops[lab][0][name] * 1e3:>11.3f}" for lab in labels))
    print(f"{'sum':>14} " + " ".join(f"{sum(first_ops[lab][0].values()) * 1e3:>11.3f}" for lab in labels))


if __name__ == "__main__":
    main()
