"""Expert parallelism's busiest GPU under uniform random routing (`busiest_expert_load`).

With `ep` GPUs each holding `E / ep` routed experts, a step waits for the GPU whose experts the step's
`T` tokens chose most. Even a router that picks its `k` of `E` experts uniformly at random (what the
model's balancing loss aims at) loads the GPUs unevenly from step to step: DeepSeek-V3 on 8 GPUs
(`E` = 256, `k` = 8) at 32 decode tokens gives a GPU 32 routed rows and 20.4 of its 32 experts on
average, the busiest 40.1 rows and 24.2 experts (1.25x and 1.19x). Pricing the mean, as GenZ does,
is optimistic; the analytical model prices the busiest GPU (`ForwardModel`'s routed experts, their
sum and the all-to-all's receive side). The excess falls as 1 / sqrt(T): 9% of the rows at 256
tokens, 0.8% at 32k. Tensor-parallel experts (each split over every GPU) have none.

- **Rows**: a token's picks on one GPU are hypergeometric (`k` draws from `E`, `E / ep` of them
  there); a GPU's rows over `T` tokens are the sum of `T` of them (the exact pmf by convolution while
  its support is at most `EXACT_SUPPORT`, else a normal of the same mean and variance). The `ep` loads
  sum to `T k`, so they are correlated `-1 / (ep - 1)`: for normal loads the busiest lies
  `1 / sqrt(1 - 1/ep)` further above the mean than the busiest of `ep` independent ones, and that
  stretch is applied to the exact pmf's; never below `ceil(T k / ep)`.
- **Experts touched**: each of a GPU's experts is touched with `p = 1 - (1 - k/E)^T`, the count
  binomial; the busiest of `ep` independent counts, never below `ceil(E_touched / ep)`.
- A fractional `T` (a mean batch) interpolates between its neighbours. Checked against Monte Carlo
  routing (tests/analysis/test_expert_load.py): within 2.5% over today's layouts, most within 1%.

Real routers are skewed as well (EPLB's redundant experts in vLLM and SGLang answer that; forced
balancing removes both): not modelled, so this is the least imbalance an EP deployment sees.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from llmperf.analysis.roofline import Number

__all__ = ["EXACT_SUPPORT", "busiest_expert_load", "expected_experts_touched"]

EXACT_SUPPORT = 512  # a GPU's rows pmf is convolved exactly up to this many possible rows, else normal


def expected_experts_touched(tokens: Number, num_experts: int, experts_per_token: int) -> Number:
    """Expected number of distinct experts that `tokens` tokens route to, each choosing
    `experts_per_token` of `num_experts` uniformly: `E * (1 - (1 - k/E) ** tokens)`."""
    if num_experts <= 1:
        return np.ones_like(np.asarray(tokens, dtype=float)) if np.ndim(tokens) else 1.0
    return num_experts * (1.0 - (1.0 - experts_per_token / num_experts) ** tokens)


@lru_cache(maxsize=64)
def _max_normal(n: int) -> float:
    """The expected largest of `n` independent standard normals, integrated on a grid."""
    x = np.linspace(-9.0, 9.0, 3601)
    phi = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    cdf = 0.5 * (1.0 + np.array([math.erf(v / math.sqrt(2.0)) for v in x]))
    return float(np.trapezoid(x * n * phi * cdf ** (n - 1), x))


def _expected_max(pmf: np.ndarray, n: int) -> float:
    """The expected largest of `n` independent draws of a count with probabilities `pmf` (0, 1, ...)."""
    cdf = np.clip(np.cumsum(pmf), 0.0, 1.0)
    return float(np.sum(1.0 - cdf[:-1] ** n))


def _hypergeometric(num_experts: int, local: int, k: int) -> np.ndarray:
    """P(j of a token's k distinct experts are among one GPU's `local`), j = 0 .. min(k, local)."""
    total = math.comb(num_experts, k)
    return np.array([math.comb(local, j) * math.comb(num_experts - local, k - j) / total
                     for j in range(min(k, local) + 1)])


def _binomial(n: int, p: float) -> np.ndarray:
    """Binomial(n, p) probabilities of 0 .. n."""
    if p >= 1.0:
        out = np.zeros(n + 1)
        out[-1] = 1.0
        return out
    j = np.arange(n + 1)
    logc = np.array([math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) for i in j])
    return np.exp(logc + j * math.log(p) + (n - j) * math.log1p(-p)) if p > 0.0 else (j == 0).astype(float)


@lru_cache(maxsize=65536)
def _busiest(tokens: int, num_experts: int, k: int, ep: int) -> tuple[float, float]:
    """(rows, experts touched) of the busiest of `ep` GPUs for an integer number of tokens."""
    if tokens <= 0:
        return 0.0, 0.0
    local = num_experts // ep
    per_token = _hypergeometric(num_experts, local, k)
    j = np.arange(per_token.size)
    mean1 = float(j @ per_token)
    var1 = float((j * j) @ per_token) - mean1 ** 2
    mean = tokens * mean1
    stretch = 1.0 / math.sqrt(1.0 - 1.0 / ep)
    if tokens * (per_token.size - 1) <= EXACT_SUPPORT:
        pmf, base, t = np.ones(1), per_token, tokens
        while t:  # the t-fold convolution by squaring
            if t & 1:
                pmf = np.convolve(pmf, base)
            t >>= 1
            if t:
                base = np.convolve(base, base)
        above = _expected_max(pmf, ep) - mean
    else:
        above = math.sqrt(tokens * var1) * _max_normal(ep)
    rows = max(mean + above * stretch, float(math.ceil(tokens * k / ep - 1e-9)))
    p = 1.0 - (1.0 - k / num_experts) ** tokens
    touched_mean = num_experts * p / ep
    touched = max(_expected_max(_binomial(local, p), ep), float(math.ceil(touched_mean - 1e-9)))
    return rows, min(touched, float(local))


def busiest_expert_load(tokens: Number, num_experts: int, experts_per_token: int, ep: int) -> tuple[Number, Number]:
    """(routed rows, distinct experts touched) on the busiest of `ep` GPUs holding `num_experts / ep`
    experts each, when `tokens` tokens each pick `experts_per_token` experts uniformly at random (the
    expectation over routings; module docstring). At `ep` = 1: every row and the expected experts
    touched. `tokens` may be a numpy array (sweeps)."""
    k, e = int(experts_per_token), int(num_experts)
    arr = np.asarray(tokens, dtype=float)
    if ep <= 1:
        rows, touched = arr * k, np.asarray(expected_experts_touched(arr, e, k), dtype=float)
        return (float(rows), float(touched)) if arr.ndim == 0 else (rows, touched)
    flat = np.maximum(arr.ravel(), 0.0)
    values = np.unique(flat)
    lo = np.floor(values).astype(int)
    frac = values - lo
    low = np.array([_busiest(int(t), e, k, int(ep)) for t in lo]).reshape(-1, 2)
    high = np.array([_busiest(int(t) + 1, e, k, int(ep)) if f > 0 else (0.0, 0.0)
                     for t, f in zip(lo, frac, strict=True)]).reshape(-1, 2)
    both = low + frac[:, None] * (high - low)
    index = np.searchsorted(values, flat)
    rows, touched = both[index, 0].reshape(arr.shape), both[index, 1].reshape(arr.shape)
    return (float(rows), float(touched)) if arr.ndim == 0 else (rows, touched)
