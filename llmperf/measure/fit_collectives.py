"""Fit the collectives model on measured NCCL all-reduce times (Vidur's public profiling data).

    python -m llmperf.measure.fit_collectives ../shared/data/vidur [--write models_spec/efficiency/collectives.yaml]

The model, per GPU count n of one node (nccl-tests' bus-bandwidth convention for a ring all-reduce):

    time(n, size) = alpha(n) + bus_bytes / busbw(n),   bus_bytes = 2 (n - 1) / n * size

`bus_bytes` is what llmperf's all-reduce operator already counts as its `comm_bytes` (each GPU sends
2(n-1)/n of the message), so `busbw(n) / interconnect` is the operator's `e_comm` and `alpha(n)` a
latency paid once per call. Each n is fitted separately by least absolute relative error,
min sum w |pred / meas - 1| (iteratively reweighted least squares), w = 1 / points in the size's
octave: every doubling of the message counts the same, from the latency-bound 2 KB to the
bandwidth-bound 64 MB, and the bimodal small-message times do not pull the fit as squared errors would.

The data: `<root>/network/<node>/all_reduce.csv` with `num_workers`, `devices_per_node`, `size` (bytes)
and `time_stats.all_reduce.median` (ms); only the one-node rows (`devices_per_node == num_workers`)
are used. Vidur (github.com/microsoft/vidur, MIT licence) measured A100 (`a100_dgx`) and H100
(`h100_dgx`) DGX nodes. Printed: each node's fit and its errors, and the held-out check: the H100
node predicted from the A100 fit with busbw scaled by the datasheet NVLink bandwidth alone
(`interconnect_gbps` of models_spec/hardware: 300 -> 450 GB/s each way), alpha unchanged. Errors are
the median and p90 of |pred / meas - 1| by message-size band.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from llmperf.measure.fitting import error_line, error_table, fit_main
from llmperf.outputs import write_file

#: the nodes of the data, with their hardware spec and the hardware specs whose all-reduce they price
NODES = {"a100_dgx": ("a100-80gb-sxm", ["a100-80gb-sxm", "a100-40gb-sxm"]),
         "h100_dgx": ("h100-sxm", ["h100-sxm", "h200"])}
#: message-size bands of the error report, bytes: [lo, hi)
BANDS = ((0, 64 * 1024, "< 64 KB"), (64 * 1024, 1024 ** 2, "64 KB - 1 MB"), (1024 ** 2, 16 * 1024 ** 2, "1 - 16 MB"),
         (16 * 1024 ** 2, float("inf"), ">= 16 MB"))
TIME_COL = "time_stats.all_reduce.median"
DEFAULT_NODE = "h100_dgx"  # the newest NVLink measured: other devices scale its busbw by their link
#: GPUs whose peers are reached over PCIe alone (no NVLink / NVSwitch; `interconnect_gbps` is their PCIe
#: link): priced by the `pcie` node, derived from the default node with NCCL's own PCIe latencies
PCIE_NODE = "pcie"
PCIE_HARDWARE = ["a10", "a100-80gb-pcie", "h100-pcie", "l4", "l40s", "rtx-4090"]
#: NCCL's tuning model (github.com/NVIDIA/nccl, commit 5067397c, src/graph/tuning.cc, BSD licence):
#: a ring all-reduce's latency is baseLat + 2 (n - 1) x hwLat per step; hwLat for the LL protocol
#: (small messages, the latency-bound regime) is 0.6 us over NVLink and 1.0 us over PCI, baseLat the same
NCCL_RING_LL_HW_LAT_S = {"nvlink": 0.6e-6, "pci": 1.0e-6}


def pcie_params(params: dict[int, tuple[float, float]]) -> dict[int, tuple[float, float]]:
    """The PCIe node's terms from the default (NVLink) node's `params` ({n: (alpha_s, busbw)}): alpha plus
    NCCL's extra latency of 2 (n - 1) ring steps over PCI instead of NVLink; busbw as the default node's
    share of its link (to_yaml writes the fraction, which prices each device's own PCIe link). Reasoned
    from NCCL's tuner, not measured: no PCIe all-reduce is in the data."""
    extra = NCCL_RING_LL_HW_LAT_S["pci"] - NCCL_RING_LL_HW_LAT_S["nvlink"]
    return {n: (alpha + 2 * (n - 1) * extra, bw) for n, (alpha, bw) in params.items()}


def load(root: Path | str, node: str) -> pd.DataFrame:
    """One node's one-node all-reduce rows: `gpus`, `size` (bytes), `time_s` (the median of the repeats)."""
    path = Path(root) / "network" / node / "all_reduce.csv"
    df = pd.read_csv(path)
    df = df[df["devices_per_node"] == df["num_workers"]]
    out = pd.DataFrame({"gpus": df["num_workers"].astype(int), "size": df["size"].astype(float),
                        "time_s": df[TIME_COL].astype(float) * 1e-3})
    return out[out["time_s"] > 0].sort_values(["gpus", "size"]).reset_index(drop=True)


def bus_bytes(gpus: np.ndarray | float, size: np.ndarray | float) -> np.ndarray | float:
    """What each GPU sends in a ring all-reduce of `size` bytes over `gpus` GPUs."""
    return 2.0 * (gpus - 1) / gpus * size


def octave_weights(size: np.ndarray) -> np.ndarray:
    """1 / (points in each point's octave of message size): every doubling of the size weighs the same
    (the data's sizes are evenly spaced in bytes, so most points are large messages, while a decode
    step's all-reduces are 8 KB - 1 MB)."""
    octave = np.floor(np.log2(np.asarray(size, dtype=float)))
    _, inverse, counts = np.unique(octave, return_inverse=True, return_counts=True)
    return 1.0 / counts[inverse]


def fit_one(bus: np.ndarray, time_s: np.ndarray, weight: np.ndarray | None = None,
            iters: int = 200) -> tuple[float, float]:
    """(alpha_s, busbw_bytes_per_s) minimising sum weight |(alpha + bus / busbw) / t - 1| (IRLS), both > 0."""
    x = np.column_stack([1.0 / time_s, bus / time_s])  # (alpha, 1/busbw) . x = pred / meas
    y = np.ones_like(time_s)
    base = np.ones_like(time_s) if weight is None else np.asarray(weight, dtype=float)
    w = base
    coef = np.array([np.median(time_s), 1e-11])
    for _ in range(iters):
        sw = np.sqrt(w)
        new, *_ = np.linalg.lstsq(x * sw[:, None], y * sw, rcond=None)
        new = np.maximum(new, [0.0, 1e-14])  # a latency and a bandwidth are positive
        if np.allclose(new, coef, rtol=1e-9, atol=0.0):
            coef = new
            break
        coef = new
        w = base / np.maximum(np.abs(x @ coef - 1.0), 1e-6)
    return float(coef[0]), float(1.0 / coef[1])


def fit(df: pd.DataFrame) -> dict[int, tuple[float, float]]:
    """{gpus: (alpha_s, busbw_bytes_per_s)} for each GPU count of `df`."""
    return {int(n): fit_one(bus_bytes(n, g["size"].to_numpy()), g["time_s"].to_numpy(),
                            octave_weights(g["size"].to_numpy()))
            for n, g in df.groupby("gpus")}


def predict(params: dict[int, tuple[float, float]], gpus: np.ndarray, size: np.ndarray,
            bw_scale: float = 1.0) -> np.ndarray:
    """Predicted seconds of each (gpus, size), busbw scaled by `bw_scale`."""
    alpha = np.array([params[int(n)][0] for n in gpus])
    busbw = np.array([params[int(n)][1] for n in gpus]) * bw_scale
    return alpha + bus_bytes(np.asarray(gpus, dtype=float), np.asarray(size, dtype=float)) / busbw


def errors(df: pd.DataFrame, pred: np.ndarray) -> pd.DataFrame:
    """Median and p90 of |pred / meas - 1| by size band and over all sizes (rows: band; `n` points)."""
    size = df["size"].to_numpy()
    bands = ((label, (size >= lo) & (size < hi)) for lo, hi, label in (*BANDS, (0, float("inf"), "all")))
    return error_table(df["time_s"].to_numpy(), pred, bands, "band")


def link_gbps(hardware: str) -> float:
    from llmperf.specs import load_hardware

    return float(load_hardware(hardware).interconnect_gbps)


def run(root: Path | str) -> dict:
    """Fit every node and the held-out A100 -> H100 check: {node: {...}, "heldout": errors}."""
    out: dict = {}
    data = {}
    for node, (hw, _) in NODES.items():
        df = load(root, node)
        params = fit(df)
        data[node] = df
        out[node] = dict(hardware=hw, link_gbps=link_gbps(hw), params=params,
                         errors=errors(df, predict(params, df["gpus"], df["size"])))
    d = out[DEFAULT_NODE]
    out[PCIE_NODE] = dict(hardware=d["hardware"], link_gbps=d["link_gbps"], params=pcie_params(d["params"]))
    a, h = out["a100_dgx"], out["h100_dgx"]
    scale = h["link_gbps"] / a["link_gbps"]
    df = data["h100_dgx"]
    out["heldout"] = dict(scale=scale, errors=errors(df, predict(a["params"], df["gpus"], df["size"], scale)))
    return out


def to_yaml(result: dict) -> str:
    """The data file `models_spec/efficiency/collectives.yaml` for `result`."""
    lines = [
        "# NCCL all-reduce over the GPUs of one node: time(n, bytes) = alpha(n) + bus_bytes / busbw(n),",
        "# bus_bytes = 2 (n - 1) / n * message (nccl-tests' ring convention; llmperf's all-reduce comm_bytes).",
        "# Written by `python -m llmperf.measure.fit_collectives <vidur data> --write` (do not edit by hand).",
        "#",
        "# Source: Vidur's measured NCCL all-reduce (github.com/microsoft/vidur, commit",
        "# 7d47513363ec447a741ac5e47241580b47724fbf, data/profiling/network/<node>/all_reduce.csv, MIT licence):",
        "# medians of repeated calls, 2 KB - 64 MB, 2/4/8 GPUs of a DGX A100 and a DGX H100 node.",
        "# Fitted per n by least absolute relative error, every octave of message size weighing the same.",
        "#",
        "# How `--efficiency typical` uses it (llmperf.analysis.collectives): a comm operator over n GPUs on a",
        "# device takes alpha(n) + comm_bytes / (interconnect_gbps * busbw_fraction(n)), with the node whose",
        "# `hardware` lists the device, else `default` (its busbw scaled by the device's own interconnect_gbps:",
        "# the held-out check below is exactly this, A100 -> H100). n between measured counts: log-linear in n;",
        "# beyond them: the nearest (more than 8 GPUs would cross nodes, which is not modelled).",
        "# All-to-all (MoE dispatch/combine) and the pipeline's point-to-point send: the same busbw fraction",
        "# (n = 2 for a send; each op's comm_bytes are its bus bytes, nccl-tests' PERFORMANCE.md) and half the",
        "# all-reduce's alpha(n): n-1 ring steps against 2(n-1), one against a 2-GPU all-reduce's two",
        "# (llmperf.analysis.collectives.LATENCY_SHARE). No measurement of them is in the data: they are bound by",
        "# the same per-GPU NVLink injection bandwidth through the NVSwitch, and NCCL runs them on the same protocols.",
        "#",
        f"# `{PCIE_NODE}`: GPUs that reach their peers over PCIe alone. No PCIe all-reduce is in the data, so its",
        f"# terms are {DEFAULT_NODE}'s with NCCL's own extra latency per ring step over PCI (its tuner,",
        "# github.com/NVIDIA/nccl commit 5067397c src/graph/tuning.cc: the LL protocol's 1.0 us a step against",
        "# 0.6 over NVLink, 2(n-1) steps) and the same share of the link, now each device's PCIe link",
        "# (interconnect_gbps). Reasoned, not measured.",
        "#",
    ]
    lines.append("# |pred / meas - 1| by message size, median/p90:")
    for node in NODES:
        lines.append(f"#   {node}, its own fit: " + error_line(result[node]["errors"]))
    lines.append(f"#   held out, h100_dgx from the a100_dgx fit, busbw x {result['heldout']['scale']:.2f} "
                 "(datasheet NVLink):")
    lines.append("#     " + error_line(result["heldout"]["errors"]))
    big = result["heldout"]["errors"].loc[">= 16 MB", "median_ratio"]
    lines.append(f"# default {DEFAULT_NODE}: scaled by the datasheet alone the A100 fit is {big:.2f}x too slow on "
                 "H100 from 16 MB")
    lines.append("# (NCCL reaches a larger share of NVLink 4 than of NVLink 3): other devices take the newer node.")
    lines += ["schema_version: 1", "source: \"Vidur NCCL all-reduce measurements (MIT), fitted by "
              "llmperf.measure.fit_collectives\"", f"default: {DEFAULT_NODE}", "all_reduce:"]
    nodes = {**NODES, PCIE_NODE: (NODES[DEFAULT_NODE][0], PCIE_HARDWARE)}
    for node, (hw, covers) in nodes.items():
        r, pcie = result[node], node == PCIE_NODE  # the pcie node: fractions only, of each device's own link
        base = (f"{DEFAULT_NODE}'s base; the fractions price each device's PCIe link" if pcie
                else f"{hw}'s interconnect_gbps, the busbw fractions' base")
        lines += [f"  {node}:", f"    hardware: [{', '.join(covers)}]", f"    link_gbps: {r['link_gbps']:g}   # {base}",
                  "    gpus:   # n: {alpha_s, " + ("" if pcie else "busbw_gbps, ")
                  + ("busbw_fraction}" if pcie else "busbw_fraction = busbw / link}")]
        for n, (alpha, bw) in sorted(r["params"].items()):
            gbps = "" if pcie else f"busbw_gbps: {bw / 1e9:.1f}, "
            lines.append(f"      {n}: {{alpha_s: {alpha:.3e}, {gbps}busbw_fraction: "
                         f"{min(bw / 1e9 / r['link_gbps'], 1.0):.3f}}}")
    return "\n".join(lines) + "\n"


def report(result: dict) -> str:
    out = []
    for node in NODES:
        r = result[node]
        out.append(f"{node} ({r['hardware']}, link {r['link_gbps']:g} GB/s):")
        for n, (alpha, bw) in sorted(r["params"].items()):
            out.append(f"  n={n}: alpha {alpha * 1e6:6.1f} us, busbw {bw / 1e9:6.1f} GB/s "
                       f"({bw / 1e9 / r['link_gbps']:.2f} of the link)")
        out.append("  own fit, |pred/meas - 1|:\n" + _table(r["errors"]))
    out.append(f"{PCIE_NODE} ({', '.join(PCIE_HARDWARE)}; reasoned from NCCL's tuner, not measured): "
               + ", ".join(f"n={n}: alpha {alpha * 1e6:.1f} us" for n, (alpha, _) in sorted(result[PCIE_NODE]["params"]
                                                                                       .items()))
               + f"; busbw the same share of each device's PCIe link as {DEFAULT_NODE}'s of NVLink")
    out.append(f"held out: h100_dgx from the a100_dgx fit, busbw x {result['heldout']['scale']:.2f} "
               "(datasheet NVLink 450 / 300), alpha as fitted:\n" + _table(result["heldout"]["errors"]))
    return "\n".join(out)


def _table(e: pd.DataFrame) -> str:
    return "\n".join(f"    {band:>13}: n={int(row['n']):4d}  median {row['median']:6.1%}  p90 {row['p90']:6.1%}  "
                     f"median pred/meas {row['median_ratio']:.2f}" for band, row in e.iterrows())


def main(argv: Sequence[str] | None = None) -> int:
    return fit_main(argv, prog="python -m llmperf.measure.fit_collectives", description=__doc__.split("\n")[0],
                    root_help="Vidur's data directory (holding network/<node>/all_reduce.csv)",
                    write_help="write the fitted terms there (models_spec/efficiency/collectives.yaml)",
                    run=run, report=report, write=lambda path, result: write_file(path, to_yaml(result), "--write"))


if __name__ == "__main__":
    sys.exit(main())
