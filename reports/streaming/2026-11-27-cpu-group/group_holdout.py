"""Decode attention at query-head groups a calibration did not time, against what it prices
(`reports/streaming/README.md`, "2026-11-27-cpu-group").

The engine's `llmperf.engine.attention.sdpa_decode` is timed as `calibrate` times it (a KV cache
`(B, H_kv, S, D)` cycled through copies that fill the working set, the typical call of each point)
at every group G of `--groups` over the same KV heads, in `--rounds` interleaved rounds; printed per
G: the measured median ms [min, max over rounds], the cache read in GB/s, and the calibration's
price of one micro-benchmark call (`op_time` with the per-kind overheads) under its additive
`decode_attention` terms and under its attention curves alone (`max(compute, memory)` at G = 4's
efficiencies), each as predicted / measured - 1. A calibration fitted on G = 1 and 4 holds out 2 and 8.

    python reports/streaming/2026-11-27-cpu-group/group_holdout.py CALIBRATION.yaml \\
        [--kv-heads 4] [--keys 4096] [--head-dim 128] [--batch 1] [--groups 1 2 4 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace


def main() -> None:
    import torch

    from llmperf.analysis.operators import attention_cost
    from llmperf.analysis.roofline import op_time
    from llmperf.analysis.timemodel import time_model_for
    from llmperf.engine.attention import sdpa_decode
    from llmperf.engine.step import StepMeta
    from llmperf.measure.calibrate import Settings, copies_for, working_set_for
    from llmperf.measure.calibrate.ceilings import _in_turn
    from llmperf.measure.timers import time_fn
    from llmperf.specs.local import load_calibrated

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("calibration")
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--keys", type=int, default=4096)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--groups", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    B, H_kv, S, D = args.batch, args.kv_heads, args.keys, args.head_dim
    hw = load_calibrated(args.calibration)
    tm = time_model_for(hw, "calibrated", "fp32").per_kind_overheads()  # back-to-back calls: no engine dispatch
    curves = replace(tm, decode_attention=None)
    device = torch.device("cpu")
    copies = copies_for(2 * B * H_kv * S * D * 4, working_set_for(Settings(), device))
    kvs = [(torch.randn(B, H_kv, S, D), torch.randn(B, H_kv, S, D)) for _ in range(copies)]  # (B, H_kv, S, D)
    meta, scale = StepMeta.decode(B, S, device), D ** -0.5
    times: dict[int, list[float]] = {g: [] for g in args.groups}
    with torch.inference_mode():
        for _ in range(args.rounds):
            for g in args.groups:
                q = torch.randn(B, H_kv * g, D)  # (B, H, D)
                fn = _in_turn([lambda k=k, v=v: sdpa_decode(q, k, v, meta, scale) for k, v in kvs])
                times[g].append(time_fn(fn, device, reps=max(5, copies), warmup=copies).median_s)
    print(f"sdpa_decode fp32, B={B} H_kv={H_kv} S={S} D={D}, {copies} copies in turn, {torch.get_num_threads()} "
          f"threads; terms: {tm.decode_attention}")
    print("G  measured ms [min, max]   GB/s   additive pred ms (err)   curves pred ms (err)")
    for g in args.groups:
        cost = attention_cost(B, 1, S, num_heads=H_kv * g, num_kv_heads=H_kv, head_dim=D, act_bytes=4.0,
                              kv_bytes=4.0)
        meas = statistics.median(times[g])
        add = float(op_time(cost, hw, "fp32", tm).time_s)
        old = float(op_time(cost, hw, "fp32", curves).time_s)
        print(f"{g:<2} {meas * 1e3:7.3f} [{min(times[g]) * 1e3:.3f}, {max(times[g]) * 1e3:.3f}]  "
              f"{float(cost.bytes_total) / meas / 1e9:6.1f}   {add * 1e3:7.3f} ({add / meas - 1:+.1%})"
              f"        {old * 1e3:7.3f} ({old / meas - 1:+.1%})")


if __name__ == "__main__":
    main()
