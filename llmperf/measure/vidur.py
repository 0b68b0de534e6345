"""Vidur's measured operator times against llmperf's predictions (`--efficiency typical`).

    frame = predictions("reports/vidur")   # device, model, op, kind, tokens, tp, measured_s, predicted_s

Vidur (github.com/microsoft/vidur, MIT licence) measured one transformer layer's operators in fp16 with
CUDA events on A100 80GB SXM and H100 SXM, per tensor-parallel worker, for `num_tokens` rows through
the layer (`mlp.csv`; `reports/vidur/README.md`). Each row's operators are built the way `estimate`
builds them, `ForwardModel` of the matching llmperf model at fp16 with `tp` = the row's workers,
`batch` = num_tokens, `q_len` = 1 (these operators never look at the context), and priced by
`op_time` under the device's typical time model, so the frame always shows what `typical` predicts
today (nothing is stored). Attention itself is not in Vidur's `mlp.csv`.

Vidur's column -> llmperf's operator (kind): `attn_pre_proj` -> `qkv_proj` (one fused GEMM),
`attn_post_proj` -> `o_proj`, `mlp_up_proj` -> `gate_up_proj` (fused gate and up), `mlp_down_proj` ->
`down_proj` (GEMMs); `input_layernorm`, `post_attention_layernorm` -> `attn_norm`, `mlp_norm`;
`attn_rope` -> `rope`; `mlp_act` -> `act`; `add` -> `attn_residual`; `emb` -> `embed` (small operators).
No torch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

#: Vidur's column -> (llmperf operator, kind shown in the figure)
OPS = {
    "attn_pre_proj": ("qkv_proj", "GEMM"), "attn_post_proj": ("o_proj", "GEMM"),
    "mlp_up_proj": ("gate_up_proj", "GEMM"), "mlp_down_proj": ("down_proj", "GEMM"),
    "input_layernorm": ("attn_norm", "small"), "post_attention_layernorm": ("mlp_norm", "small"),
    "attn_rope": ("rope", "small"), "mlp_act": ("act", "small"), "add": ("attn_residual", "small"),
    "emb": ("embed", "small"),
}
#: Vidur's model directory -> llmperf's model spec with the same shapes
MODELS = {"Llama-2-7b-hf": "llama-2-7b", "Llama-2-70b-hf": "llama-2-70b",
          "Meta-Llama-3-8B": "llama-3.1-8b", "Meta-Llama-3-70B": "llama-3.1-70b"}
DEVICES = {"a100": "a100-80gb-sxm", "h100": "h100-sxm"}
FITTED_SMALL = ("Llama-2-7b-hf", "Meta-Llama-3-8B")  # typical's small operators were fitted on A100's 7-8B rows
COLUMNS = ("device", "model", "op", "kind", "tokens", "tp", "measured_s", "predicted_s", "fitted")


def default_dir() -> Path:
    """The extract committed with llmperf (`reports/vidur`, beside the package)."""
    return Path(__file__).resolve().parents[2] / "reports" / "vidur"


def load(root: Path | str) -> pd.DataFrame:
    """Every measured (device, model, Vidur column, tp, tokens) row, `measured_s` = Vidur's median."""
    from llmperf.measure.fitting import vidur_tables

    frames = []
    for device, model, df in vidur_tables(root, DEVICES, MODELS):
        for col, (op, kind) in OPS.items():
            name = f"time_stats.{col}.median"
            if name not in df:
                continue
            frames.append(pd.DataFrame(dict(
                device=device, model=model, column=col, op=op, kind=kind,
                tokens=df["num_tokens"].to_numpy(dtype=float), tp=df["num_tensor_parallel_workers"].to_numpy(dtype=int),
                measured_s=df[name].to_numpy(dtype=float) * 1e-3)))
    if not frames:
        raise ValueError(f"{root}: no Vidur compute/<device>/<org>/<model>/mlp.csv files of a known device and model")
    out = pd.concat(frames, ignore_index=True)
    return out[np.isfinite(out["measured_s"]) & (out["measured_s"] > 0)].reset_index(drop=True)


def predict(rows: pd.DataFrame, efficiency: str = "typical") -> np.ndarray:
    """llmperf's time of each row's operator: built by `ForwardModel` (fp16, the row's tp, batch =
    tokens, q_len = 1) and priced by `op_time` under `efficiency` for the row's device."""
    from llmperf.analysis.operators import ForwardModel
    from llmperf.analysis.roofline import op_time
    from llmperf.analysis.timemodel import time_model_for
    from llmperf.specs import Precision, load_hardware, load_model

    out = np.full(len(rows), np.nan)
    devices = {d: load_hardware(DEVICES[d]) for d in rows["device"].unique()}
    models = {d: time_model_for(hw, efficiency, "fp16") for d, hw in devices.items()}
    forward: dict[tuple[str, int], ForwardModel] = {}
    for (device, model, tp, op), idx in rows.groupby(["device", "model", "tp", "op"]).groups.items():
        hw, tm = devices[device], models[device]
        fm = forward.get((model, int(tp)))
        if fm is None:
            fm = forward[(model, int(tp))] = ForwardModel(model=load_model(MODELS[model]),
                                                         precision=Precision.uniform("fp16"), tp=int(tp))
        tokens = rows.loc[idx, "tokens"].to_numpy(dtype=float)
        cost = getattr(fm, op)(tokens, 1, 0.0)
        out[rows.index.get_indexer(idx)] = np.broadcast_to(
            np.asarray(op_time(cost, hw, "fp16", tm).time_s, dtype=float), tokens.shape)
    return out


def predictions(root: Path | str | None = None, efficiency: str = "typical") -> pd.DataFrame:
    """One row per measured operator time: device, model, op, kind (GEMM | small), tokens, tp,
    measured_s, predicted_s (`efficiency`'s, computed now), fitted (whether `typical`'s small-operator
    terms were fitted on that row's shapes: A100, 7-8B)."""
    rows = load(default_dir() if root is None else root)
    rows = rows.assign(predicted_s=predict(rows, efficiency))
    rows["fitted"] = (rows["kind"] == "small") & (rows["device"] == "a100") & rows["model"].isin(FITTED_SMALL)
    return rows[list(COLUMNS)]
