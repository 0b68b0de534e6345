"""Fit the fused attention model (`llmperf.analysis.attention_eff`) on measured H100 attention kernels.

    python -m llmperf.measure.fit_attention reports/kernels/<run>/kernels.csv
        [--write models_spec/efficiency/typical.yaml]

Two layouts are read (one loader each, picked by the columns): llmperf's kernel benchmark
(`llmperf.measure.kernel_bench`, `kernels.csv`: Llama-3-8B attention, its FlashAttention-class rows,
torch SDPA and llmperf's Triton kernels), and an attention sweep (`llmperf.measure.gpu_terms`,
`attention.csv`: any head dim and GQA group; FLOPs and bytes are llmperf's own `attention_cost`).

Model (per call): `time = latency + max(flops / (peak e_c(shape)), bytes / (bw e_m(shape)))` with the
shape terms of `attention_eff`, peak and bandwidth from the `h100-sxm` datasheet spec. The fit
minimises the mean |log(pred / meas)| (Nelder-Mead on the terms' logarithms, from the published
priors); terms a data set cannot identify stay at their prior (`mma_rows` = 64, Hopper's wgmma tile).

Shapes and, for a sweep, a device are held out (the split is printed); another device's sweep beside
it is predicted from that device's datasheet alone. Errors are the median and p90 of |pred / meas - 1|
by phase, the in-sample rows labelled so. Trained on llmperf's own H100 measurements only; no
published benchmark was fitted. The held-out split in full: docs/measure.md, "Fits".
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from llmperf.analysis.attention_eff import PARAMS, AttentionEfficiency, AttnShape
from llmperf.errors import SpecError
from llmperf.measure.fitting import (
    error_line,
    error_table,
    fit_main,
    nelder_mead,
    with_block,
)
from llmperf.outputs import write_file

HARDWARE = "h100-sxm"
KERNEL_SHAPE = dict(heads=32, kv_heads=8, head_dim=128)  # llmperf.measure.kernel_bench's H, H_KV, HEAD_DIM
#: kernel-benchmark implementations that are FlashAttention-class (naive, gather+sdpa are not)
FLASH_IMPLS = ("sdpa", "flash_attention", "flash_decoding", "paged_attention")
TRITON_DEVICE_TOKENS = 64 * 1024  # batch x context from which a Triton launch is device-bound
PRIOR = AttentionEfficiency(e_compute=0.6, head_dim_half=22.0, mma_rows=64.0, cta_half=0.3, e_memory=0.9,
                            kv_half=0.02, latency_s=1.0e-5, wave_s=2.0e-6)
FITTED = ("e_compute", "cta_half", "e_memory", "kv_half", "latency_s", "wave_s")
DTYPE_BYTES = {"bf16": 2.0, "fp16": 2.0, "bfloat16": 2.0, "float16": 2.0, "fp32": 4.0, "float32": 4.0,
               "fp8": 1.0}


def load_kernels(path: Path | str) -> pd.DataFrame:
    """The kernel benchmark's FlashAttention-class rows, in the common layout."""
    df = pd.read_csv(path)
    df = df[df["impl"].isin(FLASH_IMPLS) & np.isfinite(df["time_s"]) & (df["time_s"] > 0)].copy()
    ragged = df["ragged"].astype(str).str.lower() == "true"
    prefill = df["op"] == "prefill"
    out = pd.DataFrame(dict(
        phase=np.where(prefill, "prefill", "decode"), impl=df["impl"], batch=df["batch"].astype(float),
        q_len=np.where(prefill, df["context"], 1).astype(float), context=df["context"].astype(float),
        heads=float(KERNEL_SHAPE["heads"]), kv_heads=float(KERNEL_SHAPE["kv_heads"]),
        head_dim=float(KERNEL_SHAPE["head_dim"]), dtype=df["dtype"], ragged=ragged.to_numpy(),
        tokens=df["tokens"].astype(float), time_s=df["time_s"].astype(float),
        flops=df["flops"].astype(float), bytes=df["bytes"].astype(float)))
    out["source"] = "kernels"
    return out.reset_index(drop=True)


def load_sweep(path: Path | str) -> pd.DataFrame:
    """An attention sweep (`phase,batch,q_len,context,heads,kv_heads,head_dim,dtype,impl,time_s`), with
    llmperf's FLOPs and bytes of each shape (fused, causal)."""
    return sweep_frame(pd.read_csv(path), str(path))


def sweep_frame(df: pd.DataFrame, where: str = "the sweep") -> pd.DataFrame:
    """`load_sweep` of rows already read (`llmperf calibrate` times its own)."""
    from llmperf.analysis import attention_cost

    need = ("phase", "batch", "q_len", "context", "heads", "kv_heads", "head_dim", "dtype", "time_s")
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise ValueError(f"{where}: an attention sweep needs column {missing[0]!r}")
    df = df[np.isfinite(df["time_s"].astype(float)) & (df["time_s"].astype(float) > 0)].copy()
    if "impl" not in df:
        df["impl"] = "sdpa"
    flops, nbytes = np.empty(len(df)), np.empty(len(df))
    for i, r in enumerate(df.itertuples(index=False)):
        eb = DTYPE_BYTES.get(str(r.dtype).lower().replace("torch.", ""), 2.0)
        c = attention_cost(float(r.batch), float(r.q_len), float(r.context), num_heads=int(r.heads),
                           num_kv_heads=int(r.kv_heads), head_dim=int(r.head_dim), act_bytes=eb, kv_bytes=eb,
                           impl="fused", causal=True)
        flops[i], nbytes[i] = float(c.flops), float(c.bytes_total)
    out = pd.DataFrame(dict(
        phase=df["phase"].astype(str).str.lower().to_numpy(), impl=df["impl"].astype(str).to_numpy(),
        batch=df["batch"].astype(float).to_numpy(), q_len=df["q_len"].astype(float).to_numpy(),
        context=df["context"].astype(float).to_numpy(), heads=df["heads"].astype(float).to_numpy(),
        kv_heads=df["kv_heads"].astype(float).to_numpy(), head_dim=df["head_dim"].astype(float).to_numpy(),
        dtype=df["dtype"].astype(str).to_numpy(), ragged=False,
        tokens=(df["batch"].astype(float) * df["context"].astype(float)).to_numpy(),
        time_s=df["time_s"].astype(float).to_numpy(), flops=flops, bytes=nbytes))
    out["source"] = "sweep"
    return out


def load(path: Path | str) -> pd.DataFrame:
    """Either layout, by its columns (`op` and `flops`: the kernel benchmark; `phase` and `q_len`: a sweep)."""
    cols = set(pd.read_csv(path, nrows=0).columns)
    if {"op", "impl", "flops", "bytes"} <= cols:
        return load_kernels(path)
    if {"phase", "q_len", "head_dim"} <= cols:
        return load_sweep(path)
    raise ValueError(f"{path}: neither the kernel benchmark's columns (op, impl, flops, bytes) nor an attention "
                     "sweep's (phase, batch, q_len, context, heads, kv_heads, head_dim, dtype, time_s)")


def _device(hardware: str = HARDWARE) -> tuple[float, float, int]:
    from llmperf.specs import load_hardware

    hw = load_hardware(hardware)
    return hw.peak_flops_per_s("bf16"), hw.mem_bandwidth_bytes_per_s, int(hw.num_sms or 132)


def predict(model: AttentionEfficiency, df: pd.DataFrame, hardware: str = HARDWARE,
            device: tuple[float, float, int] | None = None) -> np.ndarray:
    """Seconds of every row on `hardware`'s datasheet, or on `device` = (peak, bandwidth, SMs)."""
    peak, bw, sms = _device(hardware) if device is None else device
    shape = AttnShape(batch=df["batch"].to_numpy(), q_len=df["q_len"].to_numpy(), context=df["context"].to_numpy(),
                      heads=df["heads"].to_numpy(), kv_heads=df["kv_heads"].to_numpy(),
                      head_dim=df["head_dim"].to_numpy())
    return np.asarray(model.time_s(df["flops"].to_numpy(), df["bytes"].to_numpy(), shape, peak, bw, sms),
                      dtype=float)


def _with(terms: dict[str, float]) -> AttentionEfficiency | None:
    """The model with `terms` (None where one is out of its range)."""
    kw = PRIOR.to_dict()
    kw.update(terms)
    for name, (_, lo, hi) in PARAMS.items():
        if not lo <= kw[name] <= hi:
            return None
    return AttentionEfficiency(**kw)


def fit(df: pd.DataFrame, device: tuple[float, float, int] | None = None) -> AttentionEfficiency:
    """The terms minimising mean |log(pred / meas)| over `df`, each phase weighted equally; against
    `device` = (peak, bandwidth, SMs) when not the H100's datasheet (a calibration's own ceilings)."""
    names = list(FITTED) + (["head_dim_half"] if df["head_dim"].nunique() > 1 else [])
    for n in list(names):  # a term the rows cannot move (no decode with g q near the tile) stays at its prior
        if n == "cta_half" and not (df["phase"] == "prefill").any():
            names.remove(n)
    x0 = np.log([max(getattr(PRIOR, n), 1e-9) for n in names])
    meas = df["time_s"].to_numpy()
    w = 1.0 / df.groupby("phase")["phase"].transform("size").to_numpy()

    def loss(x: np.ndarray) -> float:
        m = _with(dict(zip(names, np.exp(x))))
        if m is None:
            return 1e9
        return float(np.sum(w * np.abs(np.log(predict(m, df, device=device) / meas))))

    x = nelder_mead(loss, x0, iters=3000, tol=1e-10)
    x = nelder_mead(loss, x, iters=3000, tol=1e-10)  # a restart from the first optimum escapes a collapsed simplex
    terms = {n: float(f"{v:.3g}") for n, v in zip(names, np.exp(x))}
    return _with(terms) or PRIOR


def splits(df: pd.DataFrame) -> dict[str, tuple[str, np.ndarray]]:
    """{check: (label, rows)}: the fitted rows first, then the held-out ones."""
    if (df["source"] == "sweep").all():
        group = df["heads"] / df["kv_heads"]
        held_group = (group == 4).to_numpy()  # GQA 4: decode's only grouped rows, so decode is fitted on MHA
        long = (df["context"] > 8192).to_numpy()
        return {"in_sample": ("in-sample: GQA groups 1 and 8 (every head dim), contexts <= 8k", ~held_group & ~long),
                "held_group": ("held out: GQA group 4 (32 query / 8 KV heads), every head dim and context",
                               held_group),
                "held_context": ("held out: groups 1 and 8, contexts > 8k", ~held_group & long)}
    sdpa = df["impl"] == "sdpa"
    fitted = sdpa & ~df["ragged"] & (((df["phase"] == "decode") & df["batch"].isin([1, 32, 64]))
                                     | ((df["phase"] == "prefill") & (df["batch"] == 1)))
    triton = ~sdpa & (((df["phase"] == "decode") & (df["tokens"] >= TRITON_DEVICE_TOKENS))
                      | ((df["phase"] == "prefill") & (df["context"] >= 4096)))
    return {"in_sample": ("in-sample: SDPA decode at batch 1/32/64, SDPA prefill at batch 1", fitted.to_numpy()),
            "held_sdpa": ("held out: SDPA decode at batch 8 and ragged, prefill at batch 4/16",
                          (sdpa & ~fitted).to_numpy()),
            "held_triton": ("held out: Triton FlashAttention (context >= 4k) / Flash-Decoding / PagedAttention "
                            "(batch x context >= 64k)", triton.to_numpy())}


def errors(df: pd.DataFrame, pred: np.ndarray) -> pd.DataFrame:
    phase = df["phase"].to_numpy()
    masks = ((p, np.ones(len(df), bool) if p == "all" else phase == p) for p in ("prefill", "decode", "all"))
    return error_table(df["time_s"].to_numpy(), pred, masks, "phase")


def other_devices(path: Path | str) -> list[tuple[Path, str]]:
    """Sweeps of other devices beside `path`, with their hardware names: `attention-<hardware>.csv` in
    its folder, and `llmperf.measure.gpu_terms` runs (one folder per device, an `attention.csv` with a
    `device` column) beside its folder."""
    p = Path(path)
    out = [(o, o.stem[len(p.stem) + 1:]) for o in sorted(p.parent.glob(p.stem + "-*.csv"))]
    own = pd.read_csv(p, nrows=1).get("device")
    for o in sorted(p.parent.parent.glob(f"*/{p.name}")):
        dev = pd.read_csv(o, nrows=1).get("device")
        if o.resolve() != p.resolve() and dev is not None and len(dev) and (own is None or dev.iloc[0] != own.iloc[0]):
            out.append((o, str(dev.iloc[0])))
    return out


def run(path: Path | str) -> dict:
    """Fit on the in-sample rows of `path`; {"params", "errors": {check: table}, "labels", "source"}."""
    df = load(path)
    checks = splits(df)
    params = fit(df[checks["in_sample"][1]])
    out = dict(params=params, errors={}, labels={}, rows=len(df), path=str(path),
               layout=str(df["source"].iloc[0]))
    for name, (label, mask) in checks.items():
        if mask.any():
            out["errors"][name] = errors(df[mask], predict(params, df[mask]))
            out["labels"][name] = label
    for other, hw in other_devices(path) if out["layout"] == "sweep" else ():
        try:
            d = load_sweep(other)
            pred = predict(params, d, hw)
        except (ValueError, KeyError, SpecError):
            continue
        out["errors"][f"device_{hw}"] = errors(d, pred)
        out["labels"][f"device_{hw}"] = (f"held out: {other.parent.name}/{other.name}, another device ({hw}, "
                                         "its datasheet only)")
    return out


def report(result: dict) -> str:
    p: AttentionEfficiency = result["params"]
    lines = [f"fitted on {result['path']} ({result['layout']} layout, {result['rows']} FlashAttention-class rows), "
             "time = latency + max(flops / (peak e_c), bytes / (bw e_m)):"]
    lines += [f"  {n:>13}: {getattr(p, n):.4g}" + ("" if n in _fitted_names(result) else "  (prior, not fitted)")
              for n in PARAMS]
    for name, table in result["errors"].items():
        lines.append(result["labels"][name] + ", |pred/meas - 1|:")
        lines += [f"    {ph:>8}: n={int(r['n']):4d}  median {r['median']:6.1%}  p90 {r['p90']:6.1%}  "
                  f"median pred/meas {r['median_ratio']:.2f}" for ph, r in table.iterrows()]
    return "\n".join(lines)


def _fitted_names(result: dict) -> tuple[str, ...]:
    return FITTED + (("head_dim_half",) if result.get("layout") == "sweep" else ())


def write_typical(path: Path | str, result: dict) -> None:
    """Replace the `attention_eff` block of the typical time model's data (between `# >>> fit_attention`
    and `# <<< fit_attention`, inserted before `dtypes:` the first time) and raise the file's schema
    to 5; the rest of the file is left as it is."""
    path = Path(path)
    text = path.read_text()
    p: AttentionEfficiency = result["params"]
    src = Path(result["path"])
    where = src.as_posix() if not src.is_absolute() else src.name
    held = "; ".join(f"{result['labels'][k].split(':')[0]} {result['labels'][k].split(': ', 1)[-1]}: "
                     + error_line(t.loc[["all"]]) for k, t in result["errors"].items())
    block = ["# fit_attention: fused attention (FlashAttention-class) by shape, llmperf.analysis.attention_eff;",
             f"# fitted on {where} (H100 SXM, bf16) by `python -m llmperf.measure.fit_attention`;",
             "# |pred/meas - 1| median/p90:"]
    block += [f"#   {line}" for line in held.split("; ")]
    block += ["attention_eff:", "  default:"]
    block += [f"    {n}: {getattr(p, n):.4g}" + ("" if n in _fitted_names(result) else "   # prior, not fitted")
              for n in PARAMS]
    block += [f'    source: "fit_attention on {where}"']
    write_file(path, with_block(text, "fit_attention", block, 5), "--write")


def main(argv: Sequence[str] | None = None) -> int:
    return fit_main(argv, prog="python -m llmperf.measure.fit_attention", description=__doc__.split("\n")[0],
                    root_help="kernels.csv of `llmperf.measure.kernel_bench`, or an attention sweep CSV",
                    write_help="write the fitted terms into this typical time model's data "
                               "(models_spec/efficiency/typical.yaml)",
                    run=run, report=report, write=write_typical)


if __name__ == "__main__":
    sys.exit(main())
