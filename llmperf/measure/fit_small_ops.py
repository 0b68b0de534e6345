"""Fit the small operators' device floor and bandwidth efficiency on Vidur's measured operator times.

    python -m llmperf.measure.fit_small_ops ../shared/data/vidur [--write models_spec/efficiency/typical.yaml]

The operators (Vidur's `mlp.csv` column -> llmperf's operator, its kind):
`input_layernorm`, `post_attention_layernorm` -> `attn_norm`, `mlp_norm` (norm); `attn_rope` -> `rope`
(elementwise: q and k rotated, as llmperf counts it); `mlp_act` -> `act` (elementwise: SiLU(gate) * up);
`add` -> `attn_residual`, `mlp_residual` (elementwise); `emb` -> `embed` (embedding: a vocab-parallel
gather). Each measured row (one layer, `num_tokens` rows, one of `num_tensor_parallel_workers` GPUs,
fp16) is given llmperf's own bytes for that operator (`ForwardModel` of the matching model spec at fp16,
tp = the row's workers, batch = num_tokens, q_len = 1), and the model is

    time = max(floor_s[kind], bytes / (bandwidth * e_memory[operator]))

`floor_s` is a kernel's minimum DEVICE time (what CUDA events around one launch measure: Vidur's
numbers), not the host's launch cost, one per kind; `e_memory` one per operator (the elementwise kind's
three operators are different kernels). The fit minimises sum |log(pred / meas)| over a grid (floor
in 0.1 us steps, efficiency in 0.0025 steps), each row weighted by 1 / (rows in its octave of
num_tokens), so decode's few tokens count as much as prefill's thousands.

Held out: the terms are fitted on A100's 7-8B shapes (Llama-2-7B, Meta-Llama-3-8B),
then predict A100's 70B shapes and H100 (its datasheet bandwidth only, the same terms). Errors are the
median and p90 of |pred / meas - 1| by operator; the in-sample errors are printed and labelled as such.
Vidur (github.com/microsoft/vidur, MIT licence) measured A100 80GB SXM and H100 SXM.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from llmperf.measure.fitting import (
    error_line,
    error_table,
    fit_main,
    vidur_tables,
    with_block,
)
from llmperf.outputs import write_file

#: Vidur's column -> (llmperf operator whose bytes price it, the operator names it sets, kind)
OPS = {
    "input_layernorm": ("attn_norm", ("attn_norm",), "norm"),
    "post_attention_layernorm": ("mlp_norm", ("mlp_norm",), "norm"),
    "attn_rope": ("rope", ("rope",), "elementwise"),
    "mlp_act": ("act", ("act",), "elementwise"),
    "add": ("attn_residual", ("attn_residual", "mlp_residual"), "elementwise"),
    "emb": ("embed", ("embed",), "embedding"),
}
#: the fitted groups: one efficiency each (the two norms are one kernel)
GROUPS = {"norm": ("input_layernorm", "post_attention_layernorm"), "rope": ("attn_rope",), "act": ("mlp_act",),
          "residual": ("add",), "embed": ("emb",)}
GROUP_KIND = {"norm": "norm", "rope": "elementwise", "act": "elementwise", "residual": "elementwise",
              "embed": "embedding"}
#: Vidur's model directory -> llmperf's model spec with the same shapes
MODELS = {"Llama-2-7b-hf": "llama-2-7b", "Llama-2-70b-hf": "llama-2-70b",
          "Meta-Llama-3-8B": "llama-3.1-8b", "Meta-Llama-3-70B": "llama-3.1-70b"}
DEVICES = {"a100": "a100-80gb-sxm", "h100": "h100-sxm"}
SMALL = ("Llama-2-7b-hf", "Meta-Llama-3-8B")  # the fitting shapes
FLOORS = np.round(np.arange(0.5e-6, 10.05e-6, 0.1e-6), 10)
EFFS = np.round(np.arange(0.02, 1.0001, 0.0025), 6)


def _bytes(model: str, op: str, tp: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """llmperf's bytes of one call of `op` for each (tp, tokens) row at fp16."""
    from llmperf.analysis.operators import ForwardModel
    from llmperf.specs import Precision, load_model

    spec = load_model(model)
    out = np.empty(len(tp))
    for t in np.unique(tp):
        m = tp == t
        fm = ForwardModel(model=spec, precision=Precision.uniform("fp16"), tp=int(t))
        out[m] = np.asarray(getattr(fm, op)(tokens[m].astype(float), 1, 0.0).bytes_total, dtype=float)
    return out


def load(root: Path | str) -> pd.DataFrame:
    """Every (device, model, operator, tp, tokens) row: `time_s` (Vidur's median), llmperf's `bytes`."""
    frames = []
    for device, model, df in vidur_tables(root, DEVICES, MODELS):
        tp = df["num_tensor_parallel_workers"].to_numpy(dtype=int)
        tokens = df["num_tokens"].to_numpy(dtype=float)
        for col, (op, _, kind) in OPS.items():
            name = f"time_stats.{col}.median"
            if name not in df:
                continue
            group = next(g for g, cols in GROUPS.items() if col in cols)
            frames.append(pd.DataFrame(dict(device=device, model=model, column=col, group=group, kind=kind,
                                            tp=tp, tokens=tokens, time_s=df[name].to_numpy(dtype=float) * 1e-3,
                                            bytes=_bytes(MODELS[model], op, tp, tokens))))
    out = pd.concat(frames, ignore_index=True)
    return out[out["time_s"] > 0].reset_index(drop=True)


def bandwidth(device: str) -> float:
    from llmperf.specs import load_hardware

    return float(load_hardware(DEVICES[device]).mem_bandwidth_bytes_per_s)


def octave_weights(tokens: np.ndarray) -> np.ndarray:
    octave = np.floor(np.log2(np.asarray(tokens, dtype=float)))
    _, inverse, counts = np.unique(octave, return_inverse=True, return_counts=True)
    return 1.0 / counts[inverse]


def _loss(df: pd.DataFrame) -> np.ndarray:
    """Weighted sum |log(pred / meas)| over (floor, e) of the grid: (len(FLOORS), len(EFFS))."""
    bw = np.array([bandwidth(d) for d in df["device"]])
    t_mem = df["bytes"].to_numpy() / bw  # at e = 1
    w = octave_weights(df["tokens"].to_numpy())
    meas = df["time_s"].to_numpy()
    mem = t_mem[None, :] / EFFS[:, None]  # (e, rows)
    out = np.empty((len(FLOORS), len(EFFS)))
    for i, f in enumerate(FLOORS):
        out[i] = (np.abs(np.log(np.maximum(mem, f) / meas[None, :])) * w[None, :]).sum(axis=1)
    return out


def fit(df: pd.DataFrame) -> dict:
    """{"floor_s": {kind: s}, "op_floor_s": {group: s}, "e_memory": {group: e}}: each group its own
    floor and efficiency (the best pair of the grid); each kind a floor for its other operators, the
    best one shared by its groups (each with its own best efficiency for it)."""
    floors: dict[str, float] = {}
    op_floors: dict[str, float] = {}
    effs: dict[str, float] = {}
    for kind in sorted(set(GROUP_KIND.values())):
        groups = [g for g, k in GROUP_KIND.items() if k == kind and (df["group"] == g).any()]
        if not groups:
            continue
        losses = {g: _loss(df[df["group"] == g]) for g in groups}
        total = sum(loss.min(axis=1) for loss in losses.values())
        floors[kind] = float(FLOORS[int(np.argmin(total))])
        for g in groups:
            i, j = np.unravel_index(int(np.argmin(losses[g])), losses[g].shape)
            op_floors[g], effs[g] = float(FLOORS[i]), float(EFFS[j])
    return dict(floor_s=floors, op_floor_s=op_floors, e_memory=effs)


def predict(params: dict, df: pd.DataFrame) -> np.ndarray:
    bw = np.array([bandwidth(d) for d in df["device"]])
    e = df["group"].map(params["e_memory"]).to_numpy(dtype=float)
    floor = df["group"].map(params["op_floor_s"]).to_numpy(dtype=float)
    return np.maximum(floor, df["bytes"].to_numpy() / (bw * e))


def errors(df: pd.DataFrame, pred: np.ndarray) -> pd.DataFrame:
    """Median and p90 of |pred / meas - 1| and the median pred / meas, by group and over all."""
    group = df["group"].to_numpy()
    masks = ((g, np.ones(len(df), bool) if g == "all" else group == g) for g in (*GROUPS, "all"))
    return error_table(df["time_s"].to_numpy(), pred, masks, "op")


#: the checks: name -> (label, rows of the data it covers)
CHECKS = {
    "in_sample": ("in-sample: A100, 7-8B shapes (the fitted rows)",
                  lambda d: (d["device"] == "a100") & d["model"].isin(SMALL)),
    "a100_70b": ("held out: A100, 70B shapes", lambda d: (d["device"] == "a100") & ~d["model"].isin(SMALL)),
    "h100": ("held out: H100 (datasheet bandwidth only), every shape", lambda d: d["device"] == "h100"),
    "h100_decode": ("held out: H100, decode-sized rows (<= 256 tokens)",
                    lambda d: (d["device"] == "h100") & (d["tokens"] <= 256)),
}


def run(root: Path | str) -> dict:
    """Fit on A100's 7-8B shapes; the errors of every check: {"params", "errors": {check: table}}."""
    df = load(root)
    params = fit(df[CHECKS["in_sample"][1](df)])
    out = dict(params=params, errors={}, rows=len(df))
    for name, (_, sel) in CHECKS.items():
        part = df[sel(df)]
        if len(part):
            out["errors"][name] = errors(part, predict(params, part))
    return out


def report(result: dict) -> str:
    p = result["params"]
    lines = ["fitted on A100, Llama-2-7B and Meta-Llama-3-8B (time = max(floor, bytes / (bandwidth * e))):"]
    for kind, f in p["floor_s"].items():
        lines.append(f"  {kind:>11}: device floor {f * 1e6:.1f} us")
    lines.append("  (each kind's floor prices its other operators; the measured ones take their own:)")
    for g, e in p["e_memory"].items():
        lines.append(f"  {g:>11}: device floor {p['op_floor_s'][g] * 1e6:.1f} us, e_memory {e:.3f}")
    for name, table in result["errors"].items():
        lines.append(CHECKS[name][0] + ", |pred/meas - 1|:")
        lines += [f"    {op:>9}: n={int(r['n']):5d}  median {r['median']:6.1%}  p90 {r['p90']:6.1%}  "
                  f"median pred/meas {r['median_ratio']:.2f}" for op, r in table.iterrows()]
    return "\n".join(lines)


def write_typical(path: Path | str, result: dict) -> None:
    """Replace the fitted terms in the typical time model's data (`typical.yaml`): each small kind's
    `floor_s`, `e_memory` (the norm's, the embedding's; elementwise: the residual add's, a plain
    streaming kernel), its `overhead_s` set to 0 (the host's launch belongs to an engine), and
    `op_e_memory` and `op_floor_s` per operator between the fit's marker comments (schema 4). The
    rest of the file is left as it is."""
    path = Path(path)
    text = path.read_text()
    p = result["params"]
    e = p["e_memory"]
    kind_e = {"norm": e["norm"], "elementwise": e["residual"], "embedding": e["embed"]}
    for kind in ("elementwise", "norm", "embedding"):
        block = re.compile(rf"(\n    {kind}:\n(?:      .*\n)*?)(?=    \S|\Z)")
        m = block.search(text)
        if m is None:
            raise ValueError(f"{path}: no {kind} block under dtypes.default")
        body = [ln for ln in m.group(1).split("\n")[2:] if ln
                and not re.match(r"      (e_memory|floor_s|overhead_s):", ln)]
        body += [f"      e_memory: {kind_e[kind]:.3f}      # fit_small_ops (Vidur A100)",
                 f"      floor_s: {p['floor_s'][kind]:.1e}     # a kernel's device minimum, fit_small_ops",
                 "      overhead_s: 0.0        # host launch: the engine's (a CUDA graph hides it)"]
        text = text[:m.start(1)] + f"\n    {kind}:\n" + "\n".join(body) + "\n" + text[m.end(1):]
    ops: dict[str, str] = {}
    for col, (_, names, _) in OPS.items():
        group = next(g for g, cols in GROUPS.items() if col in cols)
        for n in names:
            ops[n] = group
    ops["final_norm"] = "norm"
    block = ["# fit_small_ops: each measured operator's memory efficiency (constant over bytes) and device floor,",
             "# fitted on Vidur's A100 7-8B shapes; |pred/meas - 1| median/p90 over the operators: "
             + error_line(result["errors"]["in_sample"].loc[["all"]]) + " in-sample,",
             "# held out: " + error_line(result["errors"]["a100_70b"].loc[["all"]]) + " A100 70B shapes, "
             + error_line(result["errors"]["h100"].loc[["all"]]) + " H100 (datasheet bandwidth only)",
             "op_e_memory:", "  default:"]
    block += [f"    {n}: {e[g]:.3f}" for n, g in ops.items()]
    block += ["op_floor_s:   # a kernel's minimum device time (CUDA events), not the host's launch", "  default:"]
    block += [f"    {n}: {p['op_floor_s'][g]:.1e}" for n, g in ops.items()]
    write_file(path, with_block(text, "fit_small_ops", block, 4), "--write")


def main(argv: Sequence[str] | None = None) -> int:
    return fit_main(argv, prog="python -m llmperf.measure.fit_small_ops", description=__doc__.split("\n")[0],
                    root_help="Vidur's data directory (holding compute/<device>/<org>/<model>/mlp.csv)",
                    write_help="write the fitted terms into this typical time model's data "
                               "(models_spec/efficiency/typical.yaml)",
                    run=run, report=report, write=write_typical)


if __name__ == "__main__":
    sys.exit(main())
