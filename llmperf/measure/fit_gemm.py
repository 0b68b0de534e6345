"""Fit the GEMM shape model (`llmperf.analysis.gemm`) on Vidur's measured weight-GEMM times.

    python -m llmperf.measure.fit_gemm ../shared/data/vidur [--write models_spec/efficiency/typical.yaml]
                                       [--check MEASURED.csv]

The GEMMs (Vidur's `mlp.csv` column -> llmperf's operator; N x K per tensor-parallel GPU, from the
row's `n_head`, `n_kv_head`, `n_embd` (h), `n_expanded_embd` (f) and `num_tensor_parallel_workers` (t);
head_dim = h / n_head): `attn_pre_proj` -> `qkv_proj` ((n_head + 2 n_kv_head) head_dim / t x h),
`attn_post_proj` -> `o_proj` (h x n_head head_dim / t), `mlp_up_proj` -> `gate_up_proj` (2 f / t x h
when `use_gated_mlp`, else f / t), `mlp_down_proj` -> `down_proj` (h x f / t). M = `num_tokens`, fp16.

The four terms of `llmperf.analysis.gemm.GemmParams` are fitted by Nelder-Mead on their logarithms,
minimising the weighted mean |log(pred / meas)|, each row weighted by 1 / (rows in its octave of M),
so decode's few tokens count as much as prefill's thousands.

Held out: the terms are fitted on A100's 7-8B shapes (Llama-2-7B, Meta-Llama-3-8B, every TP) and then
predict A100's 70B shapes (Llama-2-70B, Meta-Llama-3-70B) and H100 (Llama-2-7B and -70B, from its
datasheet alone: fp16 peak, HBM bandwidth, SM count; the same terms). Errors are the median and p90 of
|pred / meas - 1| by operator. `--check CSV`: an evaluation table of other measured GEMMs (columns m,
n, k, groups, dtype, device, time_s; `device` a hardware spec name), priced with the fitted terms and
never fitted on. Vidur (github.com/microsoft/vidur, MIT licence) measured A100 80GB SXM and H100 SXM.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from llmperf.analysis.gemm import GemmParams, gemm_time_s
from llmperf.measure.fitting import (
    error_line,
    error_table,
    nelder_mead,
    vidur_tables,
    with_block,
)
from llmperf.outputs import write_file

#: Vidur's GEMM column -> llmperf's operator
OPS = {"attn_pre_proj": "qkv_proj", "attn_post_proj": "o_proj", "mlp_up_proj": "gate_up_proj",
       "mlp_down_proj": "down_proj"}
DEVICES = {"a100": "a100-80gb-sxm", "h100": "h100-sxm"}
MODELS = ("Llama-2-7b-hf", "Llama-2-70b-hf", "Meta-Llama-3-8B", "Meta-Llama-3-70B")
SMALL = ("Llama-2-7b-hf", "Meta-Llama-3-8B")  # the fitting shapes
#: where the search starts (and its scale): e_peak, e_memory, latency_s, feed_flop_per_byte
START = dict(e_peak=0.8, e_memory=0.8, latency_s=3e-6, feed_flop_per_byte=50.0)


def shapes(df: pd.DataFrame, column: str) -> tuple[np.ndarray, np.ndarray]:
    """(N, K) per tensor-parallel GPU of Vidur's GEMM `column` for each row of an `mlp.csv`."""
    h, nh, kv = df["n_embd"].to_numpy(int), df["n_head"].to_numpy(int), df["n_kv_head"].to_numpy(int)
    f, t = df["n_expanded_embd"].to_numpy(int), df["num_tensor_parallel_workers"].to_numpy(int)
    hd = h // nh
    gated = df["use_gated_mlp"].astype(bool).to_numpy() if "use_gated_mlp" in df else np.ones(len(df), bool)
    return {"attn_pre_proj": ((nh + 2 * kv) * hd // t, h), "attn_post_proj": (h, nh * hd // t),
            "mlp_up_proj": (np.where(gated, 2, 1) * f // t, h), "mlp_down_proj": (h, f // t)}[column]


def load(root: Path | str) -> pd.DataFrame:
    """Every (device, model, operator, tp, tokens) GEMM row: m, n, k, groups (1), `time_s` (Vidur's median)."""
    frames = []
    for device, model, df in vidur_tables(root, DEVICES, MODELS):
        for col, op in OPS.items():
            name = f"time_stats.{col}.median"
            if name not in df:
                continue
            n, k = shapes(df, col)
            frames.append(pd.DataFrame(dict(device=device, hardware=DEVICES[device], model=model, op=op,
                                            tp=df["num_tensor_parallel_workers"].to_numpy(int),
                                            m=df["num_tokens"].to_numpy(float), n=n, k=k, groups=1.0,
                                            dtype="fp16", time_s=df[name].to_numpy(float) * 1e-3)))
    if not frames:
        raise FileNotFoundError(f"{root}: no compute/<device>/<org>/<model>/mlp.csv with GEMM columns")
    out = pd.concat(frames, ignore_index=True)
    return out[out["time_s"] > 0].reset_index(drop=True)


def _devices(df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per row: peak FLOP/s at its dtype, HBM bandwidth, SMs (datasheet), element bytes."""
    from llmperf.specs import load_hardware
    from llmperf.specs.precision import dtype_bytes

    peak, bw, sms, elem = (np.empty(len(df)) for _ in range(4))
    for (hw_name, dtype), idx in df.groupby(["hardware", "dtype"]).indices.items():
        hw = load_hardware(hw_name)
        peak[idx] = hw.peak_flops_per_s(dtype)
        bw[idx], sms[idx], elem[idx] = hw.mem_bandwidth_bytes_per_s, hw.num_sms, dtype_bytes(dtype)
    return peak, bw, sms, elem


def predict(params: GemmParams, df: pd.DataFrame, devices: tuple | None = None) -> np.ndarray:
    """Predicted seconds of every row (its own device's datasheet; `devices`: `_devices(df)` if known)."""
    peak, bw, sms, elem = _devices(df) if devices is None else devices
    out = np.empty(len(df))
    for s in np.unique(sms):  # num_sms is one number per call
        i = sms == s
        out[i] = gemm_time_s(df["m"].to_numpy(float)[i], df["n"].to_numpy(float)[i], df["k"].to_numpy(float)[i],
                             df["groups"].to_numpy(float)[i], peak_flops_per_s=peak[i], bandwidth_bytes_per_s=bw[i],
                             num_sms=int(s), params=params, w_bytes=elem[i], a_bytes=elem[i])
    return out


def octave_weights(m: np.ndarray) -> np.ndarray:
    octave = np.floor(np.log2(np.asarray(m, dtype=float)))
    _, inverse, counts = np.unique(octave, return_inverse=True, return_counts=True)
    return 1.0 / counts[inverse]


def _params(x: np.ndarray) -> GemmParams:
    v = np.exp(x)
    return GemmParams(e_peak=min(v[0], 1.0), e_memory=min(v[1], 1.0), latency_s=v[2], feed_flop_per_byte=v[3])


def fit(df: pd.DataFrame, devices: tuple | None = None,
        source: str = "fit_gemm on Vidur's A100 Llama-2-7B / Meta-Llama-3-8B GEMMs (fp16, TP 1-8)") -> GemmParams:
    """The terms minimising the octave-weighted mean |log(pred / meas)| over `df`'s rows. `devices`:
    each row's (peak, bandwidth, SMs, element bytes) when not the datasheet of its `hardware` column
    (a calibration fits against the ceilings it measured)."""
    w = octave_weights(df["m"].to_numpy())
    w = w / w.sum()
    meas = df["time_s"].to_numpy()
    devices = _devices(df) if devices is None else devices

    def loss(x: np.ndarray) -> float:
        return float((np.abs(np.log(predict(_params(x), df, devices) / meas)) * w).sum())

    x = np.log([START[f] for f in GemmParams.FIELDS])
    for _ in range(3):  # restart from the best point: the simplex collapses early on this surface
        x = nelder_mead(loss, x, iters=600, tol=1e-7)
    p = _params(x)
    return GemmParams(**{f: float(f"{getattr(p, f):.3g}") for f in GemmParams.FIELDS}, source=source)


def errors(df: pd.DataFrame, pred: np.ndarray) -> pd.DataFrame:
    """Median and p90 of |pred / meas - 1| and the median pred / meas, by operator and over all."""
    op = df["op"].to_numpy()
    masks = [(o, op == o) for o in dict.fromkeys(op)] + [("all", np.ones(len(df), bool))]
    return error_table(df["time_s"].to_numpy(), pred, masks, "op")


#: the checks: name -> (label, rows of the data it covers)
CHECKS = {
    "in_sample": ("in-sample: A100, 7-8B shapes (the fitted rows)",
                  lambda d: (d["device"] == "a100") & d["model"].isin(SMALL)),
    "a100_70b": ("held out: A100, 70B shapes", lambda d: (d["device"] == "a100") & ~d["model"].isin(SMALL)),
    "h100": ("held out: H100 (datasheet only), every shape", lambda d: d["device"] == "h100"),
}


def load_check(path: Path | str) -> pd.DataFrame:
    """An evaluation table of measured GEMMs: m, n, k, groups, dtype, device (a hardware spec), time_s."""
    df = pd.read_csv(path)
    need = ("m", "n", "k", "groups", "dtype", "device", "time_s")
    missing = [c for c in need if c not in df]
    if missing:
        raise ValueError(f"{path}: missing column {missing[0]!r} (columns: {', '.join(need)})")
    df = df[df["time_s"] > 0].reset_index(drop=True)
    df["hardware"] = df["device"]
    df["op"] = df["device"] + " " + df["dtype"]
    return df


def run(root: Path | str, check: Path | str | None = None) -> dict:
    """Fit on A100's 7-8B shapes; {"params", "errors": {check: table}, "rows"} (+ "check" for `check`)."""
    df = load(root)
    params = fit(df[CHECKS["in_sample"][1](df)])
    out = dict(params=params, errors={}, rows=len(df))
    for name, (_, sel) in CHECKS.items():
        part = df[sel(df)]
        if len(part):
            out["errors"][name] = errors(part, predict(params, part))
    if check is not None:
        extra = load_check(check)
        out["check"] = dict(path=str(check), errors=errors(extra, predict(params, extra)))
    return out


def _table(e: pd.DataFrame) -> list[str]:
    return [f"    {op:>13}: n={int(r['n']):5d}  median {r['median']:6.1%}  p90 {r['p90']:6.1%}  "
            f"median pred/meas {r['median_ratio']:.2f}" for op, r in e.iterrows()]


def report(result: dict) -> str:
    p = result["params"]
    lines = ["fitted on A100, Llama-2-7B and Meta-Llama-3-8B GEMMs (llmperf.analysis.gemm):",
             f"  e_peak {p.e_peak:.3f}  e_memory {p.e_memory:.3f}  latency {p.latency_s * 1e6:.2f} us  "
             f"feed {p.feed_flop_per_byte:.1f} FLOP/B"]
    for name, table in result["errors"].items():
        lines.append(CHECKS[name][0] + ", |pred/meas - 1|:")
        lines += _table(table)
    if "check" in result:
        lines.append(f"evaluation only (never fitted): {result['check']['path']}, |pred/meas - 1|:")
        lines += _table(result["check"]["errors"])
    return "\n".join(lines)


def gemm_block(result: dict) -> str:
    """The `gemm:` block of typical.yaml (`fitting.with_block` puts it between the fit's marker comments)."""
    p, e = result["params"], result["errors"]
    lines = ["# fit_gemm: weight GEMMs priced from their per-GPU shape (llmperf.analysis.gemm), fitted on Vidur's",
             "# A100 7-8B shapes; |pred/meas - 1| median/p90: " + error_line(e["in_sample"].loc[["all"]])
             + " in-sample,",
             "# held out: " + error_line(e["a100_70b"].loc[["all"]]) + " A100 70B shapes, "
             + error_line(e["h100"].loc[["all"]]) + " H100 (datasheet only)",
             "gemm:",
             f"  e_peak: {p.e_peak:.3g}        # the large-GEMM plateau, a fraction of the dtype's dense peak",
             f"  e_memory: {p.e_memory:.3g}      # weights streamed at small M, a fraction of the HBM bandwidth",
             f"  latency_s: {p.latency_s:.3g}  # a GEMM kernel's fixed device time (a tiny GEMM's floor)",
             f"  feed_flop_per_byte: {p.feed_flop_per_byte:.3g}  "
             "# the operand intensity a tile needs to keep its SM busy",
             f"  source: \"{p.source}\""]
    return "\n".join(lines)


def write_typical(path: Path | str, result: dict) -> None:
    """Replace (or add, before `dtypes:`) the `gemm:` block of the typical time model's data (schema 5)."""
    path = Path(path)
    text = path.read_text()
    write_file(path, with_block(text, "fit_gemm", gemm_block(result).split("\n"), 5), "--write")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m llmperf.measure.fit_gemm", description=__doc__.split("\n")[0])
    ap.add_argument("root", help="Vidur's data directory (holding compute/<device>/<org>/<model>/mlp.csv)")
    ap.add_argument("--write", metavar="YAML", help="write the fitted terms into this typical time model's data "
                                                    "(models_spec/efficiency/typical.yaml)")
    ap.add_argument("--check", metavar="CSV", help="also price these measured GEMMs (m, n, k, groups, dtype, "
                                                   "device, time_s) and print their errors (never fitted on)")
    args = ap.parse_args(argv)
    result = run(args.root, args.check)
    print(report(result))
    if args.write:
        write_typical(args.write, result)
        print(f"wrote {args.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
