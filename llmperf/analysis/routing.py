"""Expert parallelism's busiest GPU: under uniform random routing (`busiest_expert_load`), or under a
measured router and EPLB's placement (`SkewedRouting`).

With `ep` GPUs each holding `E / ep` routed experts, a step waits for the GPU whose experts its `T`
tokens chose most. Even uniformly random routing loads GPUs unevenly: DeepSeek-V3 on 8 GPUs (`E` =
256, `k` = 8) at 32 decode tokens gives a GPU 32 rows and 20.4 of its 32 experts on average, the
busiest 40.1 and 24.2 (1.25x, 1.19x); GenZ prices the mean. The excess falls as 1 / sqrt(T).

- **Rows**: a token's picks on one GPU are hypergeometric; a GPU's rows over `T` tokens their sum
  (exact pmf by convolution while its support is at most `EXACT_SUPPORT`, else normal). The loads sum
  to `T k`, so the busiest lies `1 / sqrt(1 - 1/ep)` further above the mean than the busiest of `ep`
  independent ones; never below `ceil(T k / ep)`.
- **Experts touched**: each of a GPU's experts touched with `p = 1 - (1 - k/E)^T`; the busiest of `ep`
  binomial counts. A fractional `T` interpolates. Monte Carlo: within 2.5% (tests/analysis/test_expert_load.py).

A trained router is skewed. Given its load (`ExpertLoad`: `p_e`, the chance a token picks expert `e`)
the experts are placed as a server places them (`expert_slots`): contiguously, or by DeepSeek's EPLB
with `R` redundant experts (replicate the expert of the highest load per replica `R` times; pack the
replicas, heaviest first, onto the least loaded GPU with a free slot). Per layer, each GPU's rows (a
Poisson-binomial per token) and experts touched (`1 - (1 - p)^T` each) give the expected busiest GPU
under one approximation (independent GPUs: exact pmfs while small, else normal); the difference from
the same approximation of uniform routing is added to the uniform model (uniform popularity gives it
exactly), and layers are averaged. Monte Carlo: within 5% (tests/analysis/test_measured_routing.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

import numpy as np

from llmperf.analysis.roofline import Number
from llmperf.errors import SpecError
from llmperf.specs.expert_load import ExpertLoad
from llmperf.specs.model import ModelSpec

__all__ = ["EXACT_SUPPORT", "SkewedRouting", "busiest_expert_load", "check_eplb", "check_eplb_count",
           "expected_experts_touched",
           "expert_slots", "measured_routing"]

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


def busiest_expert_load(tokens: Number, num_experts: int, experts_per_token: int, ep: int,
                        skew: SkewedRouting | None = None) -> tuple[Number, Number]:
    """(routed rows, distinct experts touched) on the busiest of `ep` GPUs holding `num_experts / ep`
    experts each, when `tokens` tokens each pick `experts_per_token` experts uniformly at random (the
    expectation over routings; module docstring), or as the measured router of `skew` picks them. At
    `ep` = 1: every row and the expected experts touched. `tokens` may be a numpy array (sweeps)."""
    k, e = int(experts_per_token), int(num_experts)
    arr = np.asarray(tokens, dtype=float)
    if skew is not None:
        return skew.busiest(arr)
    if ep <= 1:
        rows, touched = arr * k, np.asarray(expected_experts_touched(arr, e, k), dtype=float)
        return (float(rows), float(touched)) if arr.ndim == 0 else (rows, touched)
    return _interpolated(arr, lambda t: _busiest(t, e, k, int(ep)))


def _interpolated(arr: np.ndarray, one: Callable[[int], tuple[float, float]]) -> tuple[Number, Number]:
    """(rows, touched) of `one(T)` at every token count of `arr` (a number or an array), a fractional
    count interpolated between its integer neighbours; each distinct count evaluated once."""
    flat = np.maximum(arr.ravel(), 0.0)
    values = np.unique(flat)
    lo = np.floor(values).astype(int)
    frac = values - lo
    low = np.array([one(int(t)) for t in lo]).reshape(-1, 2)
    high = np.array([one(int(t) + 1) if f > 0 else (0.0, 0.0) for t, f in zip(lo, frac, strict=True)]).reshape(-1, 2)
    both = low + frac[:, None] * (high - low)
    index = np.searchsorted(values, flat)
    rows, touched = both[index, 0].reshape(arr.shape), both[index, 1].reshape(arr.shape)
    return (float(rows), float(touched)) if arr.ndim == 0 else (rows, touched)


# ---- a measured router ---------------------------------------------------------------------------
def expert_slots(popularity: np.ndarray, ep: int, redundant: int | None) -> tuple[np.ndarray, np.ndarray]:
    """One layer's expert placement over `ep` GPUs: (each slot's chance that a token's rows land there,
    each slot's GPU). `redundant` None: expert `e` on GPU `e // (E / ep)` (vLLM's and SGLang's default);
    an integer `R`: DeepSeek's EPLB with `R` redundant experts (module docstring; 0 rearranges only)."""
    p = np.asarray(popularity, dtype=float)
    e = p.size
    if redundant is None:
        return p.copy(), np.arange(e) // (e // ep)
    replicas = np.ones(e, dtype=int)
    for _ in range(redundant):
        replicas[int(np.argmax(p / replicas))] += 1
    share = np.repeat(p / replicas, replicas)
    per_gpu = (e + redundant) // ep
    load, held, gpu = np.zeros(ep), np.zeros(ep, dtype=int), np.empty(share.size, dtype=int)
    for s in np.argsort(-share, kind="stable"):
        free = np.flatnonzero(held < per_gpu)
        g = int(free[np.argmin(load[free])])
        gpu[s], load[g], held[g] = g, load[g] + share[s], held[g] + 1
    return share, gpu


def _normal_cdf(z: np.ndarray) -> np.ndarray:
    """The standard normal CDF (Abramowitz & Stegun 7.1.26 for erf, |error| < 1.5e-7)."""
    x = np.abs(z) / math.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * x)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = 1.0 - poly * np.exp(-x * x)
    return 0.5 * (1.0 + np.sign(z) * erf)


def _max_of_normals(mean: np.ndarray, var: np.ndarray) -> np.ndarray:
    """E[max] over the last axis of independent normals (`mean`, `var`: (..., n)), on a grid."""
    sd = np.sqrt(np.maximum(var, 1e-18))
    lo = (mean - 8.0 * sd).min(axis=-1, keepdims=True)
    hi = (mean + 8.0 * sd).max(axis=-1, keepdims=True)
    x = lo[..., None] + (hi - lo)[..., None] * np.linspace(0.0, 1.0, 513)  # (..., 1, G)
    cdf = np.prod(_normal_cdf((x - mean[..., None]) / sd[..., None]), axis=-2)  # (..., G)
    return lo[..., 0] + np.trapezoid(1.0 - cdf, x[..., 0, :], axis=-1)


def _max_of_counts(share: np.ndarray, gpu: np.ndarray, ep: int, tokens: int, width: int) -> np.ndarray:
    """E[max] over GPUs of each layer's rows from `tokens` tokens, each GPU's rows a T-fold
    Poisson-binomial of its slots' shares, GPUs independent (exact pmfs by FFT). share, gpu: (L, S);
    `width`: the most slots a GPU holds."""
    layers = share.shape[0]
    pmf = np.zeros((layers, ep, width + 1))
    pmf[:, :, 0] = 1.0
    for layer in range(layers):
        for s, g in zip(share[layer], gpu[layer], strict=True):
            row = pmf[layer, g]
            row[1:] = row[1:] * (1.0 - s) + row[:-1] * s
            row[0] *= 1.0 - s
    n = 1 << int(math.ceil(math.log2(tokens * width + 1)))
    total = np.clip(np.fft.irfft(np.fft.rfft(pmf, n=n) ** tokens, n=n)[..., : tokens * width + 1], 0.0, None)
    cdf = np.clip(np.cumsum(total, axis=-1), 0.0, 1.0)
    return np.sum(1.0 - np.prod(cdf[..., :-1], axis=1), axis=-1)  # (L,)


class SkewedRouting:
    """The busiest expert-parallel GPU's rows and experts touched under a measured router
    (`ExpertLoad`'s popularity, layers x experts) on `ep` GPUs, placed contiguously or by EPLB with
    `redundant` redundant experts (`expert_slots`); module docstring. `ep` 1: every row, and the
    experts a measured router touches."""

    def __init__(self, popularity: np.ndarray, experts_per_token: int, ep: int, redundant: int | None = None) -> None:
        p = np.asarray(popularity, dtype=float)
        self.num_experts, self.k, self.ep, self.redundant = p.shape[1], int(experts_per_token), int(ep), redundant
        slots = [expert_slots(row, self.ep, redundant) for row in p]
        self.share = np.stack([s for s, _ in slots])  # (L, S)
        self.gpu = np.stack([g for _, g in slots])
        local = self.num_experts // self.ep
        self.uniform_share = np.full((1, self.num_experts), self.k / self.num_experts)
        self.uniform_gpu = (np.arange(self.num_experts) // local)[None, :]
        self.slots_per_gpu = self.share.shape[1] // self.ep  # EPLB packs (E + R) / ep slots on every GPU
        self.local = local
        self._cache: dict[int, tuple[float, float]] = {}

    def _per_gpu(self, values: np.ndarray, gpu: np.ndarray) -> np.ndarray:
        out = np.zeros((values.shape[0], self.ep))
        for layer in range(values.shape[0]):
            out[layer] = np.bincount(gpu[layer], weights=values[layer], minlength=self.ep)
        return out

    def _approx(self, share: np.ndarray, gpu: np.ndarray, width: int, tokens: int
                ) -> tuple[float, float, float, float]:
        """Under the independent-GPU approximation, averaged over layers: E[max rows], E[max touched],
        the largest mean rows and the largest mean touched (`width`: the most slots a GPU holds)."""
        mean = self._per_gpu(share, gpu) * tokens
        var = self._per_gpu(share * (1.0 - share), gpu) * tokens
        rows = (_max_of_counts(share, gpu, self.ep, tokens, width) if tokens * width <= EXACT_SUPPORT
                else _max_of_normals(mean, var))
        q = 1.0 - (1.0 - share) ** tokens
        t_mean, t_var = self._per_gpu(q, gpu), self._per_gpu(q * (1.0 - q), gpu)
        touched = _max_of_normals(t_mean, t_var)
        return float(rows.mean()), float(touched.mean()), float(mean.max(-1).mean()), float(t_mean.max(-1).mean())

    def _one(self, tokens: int) -> tuple[float, float]:
        if tokens <= 0:
            return 0.0, 0.0
        if tokens in self._cache:
            return self._cache[tokens]
        if self.ep <= 1:
            touched = float(np.mean(np.sum(1.0 - (1.0 - self.share) ** tokens, axis=1)))
            out = float(tokens * self.k), touched
        else:
            rows_u, touched_u = _busiest(tokens, self.num_experts, self.k, self.ep)
            rows_s, touched_s, floor_rows, floor_touched = self._approx(self.share, self.gpu, self.slots_per_gpu,
                                                                        tokens)
            rows_r, touched_r, _, _ = self._approx(self.uniform_share, self.uniform_gpu, self.local, tokens)
            rows = max(rows_u + rows_s - rows_r, floor_rows, tokens * self.k / self.ep)
            touched = max(touched_u + touched_s - touched_r, floor_touched)
            out = rows, float(min(max(touched, 0.0), self.slots_per_gpu))
        self._cache[tokens] = out
        return out

    def busiest(self, tokens: Number) -> tuple[Number, Number]:
        """(rows, experts touched) of the busiest GPU at `tokens` (a number or an array; fractions interpolate)."""
        return _interpolated(np.asarray(tokens, dtype=float), self._one)


def check_eplb_count(model: ModelSpec, eplb: object) -> None:
    """`eplb` is a count of redundant experts (an integer >= 0) for a model that has experts, whatever
    the layout (`check_eplb` adds the layout's checks)."""
    if isinstance(eplb, bool) or not isinstance(eplb, (int, np.integer)) or eplb < 0:
        raise SpecError(f"eplb: must be an integer >= 0 (redundant experts per layer), got {eplb!r}")
    if not model.is_moe:
        raise SpecError(f"eplb: {eplb} needs a mixture-of-experts model, {model.name} has no experts")


def check_eplb(model: ModelSpec, ep: int, eplb: int | None) -> int:
    """The redundant experts each MoE layer holds (0 without EPLB), refusing a count the layout cannot hold."""
    if eplb is None:
        return 0
    check_eplb_count(model, eplb)
    if ep <= 1:
        raise SpecError(f"eplb: {eplb} needs expert parallelism (ep > 1): with ep 1 every GPU holds every expert")
    if (model.num_experts + eplb) % ep:
        raise SpecError(f"eplb: {model.num_experts} experts + {eplb} redundant do not divide over ep={ep} GPUs")
    return int(eplb)


def measured_routing(model: ModelSpec, ep: int, load: ExpertLoad | None, eplb: int | None) -> SkewedRouting | None:
    """The `SkewedRouting` of `model`'s experts on `ep` GPUs under a measured `load` (None: uniform) and
    EPLB with `eplb` redundant experts (None: contiguous placement); None when neither is given (the
    uniform model prices it)."""
    if load is None and eplb is None:
        return None
    check_eplb(model, ep, eplb)  # names eplb
    if not model.is_moe:
        raise SpecError(f"expert_load: {load.source} needs a mixture-of-experts model, {model.name} has no experts")
    return _routing(load, model.num_experts, model.experts_per_token, int(ep), eplb)


@lru_cache(maxsize=32)
def _routing(load: ExpertLoad | None, num_experts: int, k: int, ep: int, eplb: int | None) -> SkewedRouting:
    popularity = (load.popularity(num_experts, k) if load is not None
                  else np.full((1, num_experts), k / num_experts))
    return SkewedRouting(popularity, k, ep, eplb)
