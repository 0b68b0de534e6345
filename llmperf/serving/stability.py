"""How many simulated requests make a percentile stable: confidence intervals for the percentiles a
serving simulation reports (`percentile_ci`), and the stopping rule `plan` uses (`Stopping`, `assess`).

A queue's outputs are correlated (a request that arrives behind a burst waits, and so does the next),
so a distribution-free order-statistic interval, which assumes independent samples, is too narrow.
The interval is built by **batch sectioning** (batch means applied to a quantile; Schmeiser, "Batch
size effects in the analysis of simulation output", Operations Research 1982; Asmussen & Glynn,
*Stochastic Simulation*, 2007, IV.5): after a warm-up is discarded, the requests, in arrival order,
are cut into `k` consecutive batches (default 10); the percentile is estimated on all of them (the
point estimate) and on each batch, and the interval is `point +- t(k-1, level) * sd(batch estimates)
/ sqrt(k)`.

The stopping rule: simulate `min_requests`, then double the sample until every SLO percentile's
interval is within `tolerance` of its estimate, or `max_requests` is reached. The warm-up and the
drain at the end are discarded (`Stopping.window`, and the requests arriving within the p95
end-to-end latency of either end). A queue offered more than it can serve has no steady state:
`rising` flags a run whose time-weighted number of requests in the replica keeps rising over 10
windows (`in_system`); such a run is reported as unstable, never with its percentiles.

Why each rule, with its thresholds: docs/serving.md, "Stable percentiles".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from llmperf.errors import SpecError


def t_quantile(df: int, level: float = 0.95) -> float:
    """Two-sided Student t critical value for `df` degrees of freedom at `level`: the normal quantile
    corrected by its Cornish-Fisher expansion in 1/df (Abramowitz & Stegun 26.7.5; within 0.1% of
    the exact value from df = 5, e.g. t(9, 0.95) = 2.262)."""
    from statistics import NormalDist
    z = NormalDist().inv_cdf(0.5 + level / 2)
    v = float(df)
    return (z + (z**3 + z) / (4 * v) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
            + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * v**4))


@dataclass(frozen=True, kw_only=True)
class PercentileCI:
    """A percentile's point estimate and its `level` confidence interval from `batches` batches of
    `n` samples in all (NaN when too few samples)."""

    percentile: float
    estimate: float
    low: float
    high: float
    n: int
    batches: int
    level: float = 0.95

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    @property
    def relative_half_width(self) -> float:
        """Half-width / estimate (inf for a zero or undefined estimate)."""
        if not (math.isfinite(self.half_width) and self.estimate > 0):
            return math.inf
        return self.half_width / self.estimate

    def as_dict(self) -> dict[str, float | int]:
        return dict(estimate=self.estimate, low=self.low, high=self.high, rel_half_width=self.relative_half_width,
                    n=self.n, batches=self.batches, level=self.level)


def percentile_ci(values, percentile: float, *, batches: int = 10, level: float = 0.95) -> PercentileCI:  # noqa: ANN001
    """Batch-sectioning interval of `percentile` of `values` (in arrival order; NaNs dropped per batch)."""
    x = np.asarray(values, dtype=float)
    ok = ~np.isnan(x)
    n = int(ok.sum())
    if n == 0:
        nan = float("nan")
        return PercentileCI(percentile=percentile, estimate=nan, low=nan, high=nan, n=0, batches=0, level=level)
    point = float(np.percentile(x[ok], percentile))
    k = min(batches, n // 2)
    if k < 2:
        return PercentileCI(percentile=percentile, estimate=point, low=-math.inf, high=math.inf, n=n, batches=k,
                            level=level)
    parts = [p[~np.isnan(p)] for p in np.array_split(x, k)]
    est = np.array([np.percentile(p, percentile) for p in parts if p.size])
    k = len(est)
    half = t_quantile(k - 1, level) * float(np.std(est, ddof=1)) / math.sqrt(k)
    return PercentileCI(percentile=percentile, estimate=point, low=point - half, high=point + half, n=n,
                        batches=k, level=level)


def rising(means) -> bool:  # noqa: ANN001
    """Whether a series of window means keeps rising: Spearman rank correlation with the window
    index >= 0.8 and the last window at least 1.25 x the first (+1). A stationary series passes
    both by chance rarely; a queue that grows without bound passes both."""
    x = np.asarray(means, dtype=float)
    x = x[np.isfinite(x)]
    if x.size < 4 or x[-1] < 1.25 * x[0] + 1:
        return False
    ranks = np.argsort(np.argsort(x, kind="stable"), kind="stable")
    if np.all(ranks == ranks[0]):
        return False
    return float(np.corrcoef(np.arange(x.size), ranks)[0, 1]) >= 0.8


def trend(values, *, batches: int = 10) -> bool:  # noqa: ANN001
    """Whether `values` (in arrival order) keep rising: `rising` over the means of `batches`
    consecutive batches."""
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    k = min(batches, x.size // 5)
    return k >= 4 and rising([p.mean() for p in np.array_split(x, k)])


def in_system(steps, t0: float, t1: float, windows: int = 10) -> np.ndarray:  # noqa: ANN001
    """Time-weighted mean number of requests in the replica (running + waiting) in `windows` equal
    windows of [t0, t1], from a simulation's step log (NaN for a window without steps)."""
    s = steps["start_s"].to_numpy(dtype=float)
    d = steps["duration_s"].to_numpy(dtype=float)
    x = (steps["running"] + steps["waiting"]).to_numpy(dtype=float)
    edges = np.linspace(t0, t1, windows + 1)
    out = np.full(windows, np.nan)
    which = np.searchsorted(edges, s, side="right") - 1
    for i in range(windows):
        sel = which == i
        if sel.any() and d[sel].sum() > 0:
            out[i] = np.average(x[sel], weights=d[sel])
    return out


#: `plan`'s default tolerance: each SLO percentile's interval within +-5% of it
DEFAULT_TOLERANCE = 0.05


@dataclass(frozen=True, kw_only=True)
class Stopping:
    """The stopping rule: from `min_requests`, double the simulated requests until every SLO
    percentile's interval is within `tolerance` (relative half-width) or `max_requests` is reached.
    `tolerance=None`: one run of the workload's own size (the interval is still reported)."""

    tolerance: float | None = DEFAULT_TOLERANCE
    level: float = 0.95
    min_requests: int = 500
    max_requests: int = 16000
    warmup: float = 0.1
    min_warmup: int = 50
    batches: int = 10

    def __post_init__(self) -> None:
        if self.tolerance is not None and not (isinstance(self.tolerance, (int, float)) and 0 < self.tolerance < 1):
            raise SpecError(f"--ci-tolerance: must be a fraction in (0, 1), got {self.tolerance!r}")
        if not 0 < self.level < 1:
            raise SpecError(f"--ci-level: must be in (0, 1), got {self.level!r}")
        for name in ("min_requests", "max_requests", "batches"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise SpecError(f"--{name.replace('_', '-')}: must be a positive integer, got {v!r}")
        if self.max_requests < self.min_requests:
            raise SpecError(f"--max-requests: must be at least the first sample ({self.min_requests}), "
                            f"got {self.max_requests}")
        if not 0 <= self.warmup < 0.5 or isinstance(self.min_warmup, bool) or self.min_warmup < 0:
            raise SpecError(f"warm-up: share in [0, 0.5) and a count >= 0, got {self.warmup!r}, {self.min_warmup!r}")

    def window(self, n: int) -> slice:
        """The requests kept, in arrival order: without the warm-up and as many at the end."""
        w = max(self.min_warmup, int(self.warmup * n))
        if 2 * w >= n:  # too few to discard a warm-up: keep the middle half
            w = n // 4
        return slice(w, n - w)


@dataclass(frozen=True, kw_only=True)
class Stability:
    """What the stopping rule found for one simulated load: the SLO percentiles' intervals, the
    requests simulated, whether the tolerance was met, and whether the queue kept growing."""

    ttft: PercentileCI
    tpot: PercentileCI
    requests: int
    tolerance: float | None
    converged: bool
    unstable: bool

    def as_dict(self) -> dict[str, object]:
        return dict(requests=self.requests, tolerance=self.tolerance, converged=self.converged,
                    unstable=self.unstable, ttft=self.ttft.as_dict(), tpot=self.tpot.as_dict())


def assess(requests, percentile: float, stopping: Stopping, metrics: tuple[str, ...] = ("ttft", "tpot"),  # noqa: ANN001
           steps=None) -> Stability:  # noqa: ANN001
    """The intervals and the growth check of one run (`SimResult.requests` and `.steps`);
    `metrics`: the percentiles the tolerance applies to (those with an SLO). The growth check looks
    at the requests in the replica over the kept requests' arrivals (`in_system`, `rising`)."""
    r = requests.sort_values("arrival_s", kind="stable")
    kept = r.iloc[stopping.window(len(r))]
    if len(kept) > 20:  # and the requests arriving within a long residence time of either end
        fill = float(np.nanpercentile(r["e2e_s"].to_numpy(dtype=float), 95))
        a = kept["arrival_s"].to_numpy(dtype=float)
        lo, hi = float(r["arrival_s"].iloc[0]) + fill, float(r["arrival_s"].iloc[-1]) - fill
        inner = kept[(a >= lo) & (a <= hi)]
        kept = inner if len(inner) >= len(kept) // 2 else kept
    grows = False
    if steps is not None and len(kept) >= 2 and len(steps):
        t0, t1 = float(kept["arrival_s"].iloc[0]), float(kept["arrival_s"].iloc[-1])
        grows = t1 > t0 and rising(in_system(steps, t0, t1, stopping.batches))
    kw = dict(batches=stopping.batches, level=stopping.level)
    ttft = percentile_ci(kept["ttft_s"].to_numpy(dtype=float), percentile, **kw)
    tpot = percentile_ci(kept["tpot_s"].to_numpy(dtype=float), percentile, **kw)
    ok = [c.relative_half_width <= stopping.tolerance for name, c in (("ttft", ttft), ("tpot", tpot))
          if name in metrics and c.n and stopping.tolerance]
    return Stability(ttft=ttft, tpot=tpot, requests=len(r), tolerance=stopping.tolerance,
                     converged=bool(ok) and all(ok) and not grows, unstable=grows)


__all__ = ["DEFAULT_TOLERANCE", "PercentileCI", "Stability", "Stopping", "assess", "percentile_ci", "in_system",
           "rising", "t_quantile", "trend"]
