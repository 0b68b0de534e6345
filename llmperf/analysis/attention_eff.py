"""How fast FlashAttention-class kernels run, by shape: the efficiency of one fused attention call
(`AttentionEfficiency`, over an `AttnShape`).

A fused attention kernel (FlashAttention-2/3 and cuDNN for prefill, Flash-Decoding / split-KV and
PagedAttention for decode; Dao 2023 "FlashAttention-2", arXiv:2307.08691; Shah et al. 2024
"FlashAttention-3", arXiv:2407.08608; Dao et al. 2023 "Flash-Decoding for long-context inference")
is priced as

    time = latency + max(flops / (peak * e_c), bytes / (bandwidth * e_m))

with `e_c` and `e_m` set by the call's shape (batch B, new tokens per sequence q, heads H, KV heads
H_kv, head dim D; group g = H / H_kv), never by its context:

    e_c = e_compute * D / (D + head_dim_half)                       head dim: short K-loops, softmax share
                    * pairs / (pairs + waste)                         causal masking: diagonal tiles run whole
                    * min(1, g q / mma_rows)                          tensor-core tile rows a KV head fills
                    * x_c / (x_c + cta_half),  x_c = B H ceil(q / TILE) / SMs      work tiles per SM
                      (decode, g q < mma_rows: split-KV, so occupancy as e_m's)
    e_m = e_memory * x_m / (x_m + kv_half),  x_m = B H_kv / SMs     KV streams per SM (split-KV fills the rest)
    latency = latency_s + wave_s * B H_kv / SMs

The context enters only through the FLOPs and bytes, linearly, so every decode step stays a line in
the context and a generation sums in closed form (`llmperf.analysis.rollup.sum_max_lines`). The terms
are fitted by `python -m llmperf.measure.fit_attention` and live in `models_spec/efficiency/typical.yaml`;
what each term models: docs/time-models.md, "Attention by shape". Pure Python + numpy.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from llmperf.specs.efficiency import ATTENTION_PARAMS as PARAMS
from llmperf.specs.efficiency import attention_terms, check_attention_term

Number = Any  # float or numpy array
TILE = 128  # query and key tile of FlashAttention-2/3's forward kernels on A100/H100 (head dim <= 128)


@dataclass(frozen=True, kw_only=True)
class AttnShape:
    """The shape of one fused attention call on one GPU (the per-GPU shard under tensor parallelism):
    `batch` sequences, `q_len` new tokens each over `context` keys, `heads` query heads sharing
    `kv_heads` KV heads of `head_dim` (the QK width; MLA absorbed: the latent plus the rope key, one
    KV head). Fields may be numpy arrays (a sweep). `latent`: MLA's attention (either form), whose group
    is not a GQA cache's (a CPU calibration's `decode_attention` leaves it to the attention curves)."""

    batch: Number
    q_len: Number
    context: Number
    heads: Number
    kv_heads: Number
    head_dim: Number
    latent: Number = False

    @property
    def group(self) -> Number:
        """Query heads per KV head (GQA group; 1 for MHA)."""
        return np.asarray(self.heads, dtype=float) / np.maximum(np.asarray(self.kv_heads, dtype=float), 1.0)




@dataclass(frozen=True, kw_only=True)
class AttentionEfficiency:
    """The terms of the model above (see the module docstring); `source` says where they come from."""

    e_compute: float = 0.6
    head_dim_half: float = 0.0
    mma_rows: float = 64.0
    cta_half: float = 0.0
    e_memory: float = 0.9
    kv_half: float = 0.0
    latency_s: float = 0.0
    wave_s: float = 0.0
    source: str = ""

    def __post_init__(self) -> None:
        for name in PARAMS:
            check_attention_term(name, getattr(self, name), "attention_eff")

    @classmethod
    def parse(cls, raw: Any, where: str) -> AttentionEfficiency:
        """From a mapping of the `PARAMS` (and an optional `source`); unknown fields and values out of
        range are refused with the field's name (`llmperf.specs.efficiency.attention_terms`)."""
        return cls(**attention_terms(raw, where))

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def efficiencies(self, shape: AttnShape, num_sms: int | None) -> tuple[Number, Number]:
        """(e_compute, e_memory) of a fused attention call of `shape` on a device of `num_sms` SMs
        (unknown: 132, an H100's). Never a function of `shape.context`."""
        sms = float(num_sms or 132)
        B = np.maximum(np.asarray(shape.batch, dtype=float), 1.0)
        q = np.maximum(np.asarray(shape.q_len, dtype=float), 1.0)
        H = np.maximum(np.asarray(shape.heads, dtype=float), 1.0)
        H_kv = np.maximum(np.asarray(shape.kv_heads, dtype=float), 1.0)
        D = np.maximum(np.asarray(shape.head_dim, dtype=float), 1.0)
        g = H / H_kv
        head = D / (D + self.head_dim_half)
        pairs = q * (q + 1) / 2
        waste = np.minimum(q, TILE) * (q - 1) / 2
        causal = pairs / (pairs + waste)
        fill = np.minimum(1.0, g * q / self.mma_rows)
        x_m = B * H_kv / sms
        occ_m = x_m / (x_m + self.kv_half)
        x_c = B * H * np.ceil(q / TILE) / sms
        # a decode kernel (its g q rows fill less than a tile) splits the keys over the SMs as it
        # streams them: its matrix units are as busy as its KV streams; a prefill's, as its tiles
        occ_c = np.where(fill < 1, occ_m, x_c / (x_c + self.cta_half))
        e_c = self.e_compute * head * causal * fill * occ_c
        e_m = self.e_memory * occ_m
        return _scalar(np.clip(e_c, 1e-6, 1.0)), _scalar(np.clip(e_m, 1e-6, 1.0))

    def latency(self, shape: AttnShape, num_sms: int | None) -> Number:
        """The call's fixed device time: `latency_s + wave_s * B H_kv / SMs` (never the context)."""
        x_m = (np.maximum(np.asarray(shape.batch, dtype=float), 1.0)
               * np.maximum(np.asarray(shape.kv_heads, dtype=float), 1.0) / float(num_sms or 132))
        return _scalar(self.latency_s + self.wave_s * x_m)

    def time_s(self, flops: Number, nbytes: Number, shape: AttnShape, peak_flops_per_s: float,
               bandwidth_bytes_per_s: float, num_sms: int | None) -> Number:
        """`latency + max(flops / (peak e_c), bytes / (bw e_m))`: one call (what the fit compares)."""
        e_c, e_m = self.efficiencies(shape, num_sms)
        return self.latency(shape, num_sms) + np.maximum(np.asarray(flops, dtype=float) / (peak_flops_per_s * e_c),
                                           np.asarray(nbytes, dtype=float) / (bandwidth_bytes_per_s * e_m))


def _scalar(x: np.ndarray) -> Number:
    return float(x) if np.ndim(x) == 0 else x
