"""Cost per million input and per million output tokens, as GPU time is quoted (`$/M input`,
`$/M output`), from a serving simulation.

A replica's GPU-hours are paid whatever it runs; they are split between the two phases by the share
of the replica's step time each takes in the simulation:

- a prefill-only step is input work, a decode-only step output work;
- a mixed step (chunked prefill: prompt chunks and decode tokens in one forward pass, Sarathi-Serve)
  is split by its tokens: `prefill_tokens / (prefill_tokens + decode_tokens)` of its time is input
  work. Every token of a step goes through the same weights and GEMMs, so a token's share of a
  compute-bound step is its share of the step's work (attention over long contexts aside);
- idle time between steps is split in the same proportion (the hour is paid either way).

Then `$/M input = cost/hour x input share / (3600 x input tokens/s) x 1e6` and the same for the
output, so `$/M input x input tokens + $/M output x output tokens` is the whole bill. Input tokens
are the prompts as sent (a cached shared prefix is counted: prices are quoted per token sent).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def input_time_share(steps) -> float:  # noqa: ANN001
    """Share of the replica's step time that is prefill (input) work (`SimResult.steps`); NaN
    without steps."""
    if steps is None or not len(steps):
        return float("nan")
    d = steps["duration_s"].to_numpy(dtype=float)
    p = steps["prefill_tokens"].to_numpy(dtype=float)
    q = steps["decode_tokens"].to_numpy(dtype=float)
    tot = p + q
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = np.where(tot > 0, p / np.where(tot > 0, tot, 1.0), 0.0)
    busy = float(d.sum())
    return float((d * frac).sum() / busy) if busy > 0 else float("nan")


@dataclass(frozen=True, kw_only=True)
class TokenPrices:
    """USD per million input and per million output tokens, and the input share of GPU time."""

    input_time_share: float
    usd_per_million_input: float | None
    usd_per_million_output: float | None

    def as_dict(self) -> dict[str, float | None]:
        return dict(prefill_time_share=self.input_time_share,
                    cost_per_million_input_tokens=self.usd_per_million_input,
                    cost_per_million_output_tokens=self.usd_per_million_output)


def token_prices(usd_per_hour: float | None, share: float, input_tokens_per_s: float,
                 output_tokens_per_s: float) -> TokenPrices:
    """Split `usd_per_hour` by `share` (input) and 1 - share (output) over the token rates."""
    if usd_per_hour is None or not np.isfinite(share):
        return TokenPrices(input_time_share=share, usd_per_million_input=None, usd_per_million_output=None)
    per_s = usd_per_hour / 3600
    inp = per_s * share / input_tokens_per_s * 1e6 if input_tokens_per_s > 0 else None
    out = per_s * (1 - share) / output_tokens_per_s * 1e6 if output_tokens_per_s > 0 else None
    return TokenPrices(input_time_share=share, usd_per_million_input=inp, usd_per_million_output=out)


__all__ = ["TokenPrices", "input_time_share", "token_prices"]
