"""Synthetic serving workloads: requests with random prompts, lengths and arrival times.

Length distributions and arrival processes follow the usual serving benchmarks (vLLM's
`benchmark_serving.py` and the Orca / vLLM papers): prompt and output lengths fixed, uniform, normal or
log-normal (clipped to a range), or cycled from a list; arrivals all at t=0 (an offline batch), as a
Poisson process of a given rate in requests/s (exponential gaps, first request at t=0 as vLLM's
benchmark sends it), or at a fixed interval. Everything draws from a seeded `numpy.random.Generator`;
the prompt lengths, output lengths, arrival times and prompt tokens use independent child streams, so
changing one distribution leaves the other quantities of a seeded workload unchanged.

Public API (engine-core builds on it; keep stable):

    Request(*, request_id, prompt, max_new_tokens, arrival_time_s=0.0, sampling=None)
        .prompt_len   .params(default: SamplingParams) -> SamplingParams
    Length distributions (each .sample(n, rng) -> int64 array, .mean -> float, str() = compact form):
        Fixed(value)   Uniform(lo, hi) (inclusive)   Normal(mean, std, lo=1, hi=None)
        LogNormal(mu, sigma, lo=1, hi=None) (mu, sigma of log(length))   Cycle(values)
    Arrival processes (each .times(n, rng) -> float64 array of seconds, non-decreasing):
        Offline()   Poisson(rate_per_s)   FixedInterval(interval_s)
    parse_length(spec) -> LengthDist      parse_arrival(spec) -> Arrival
    generate_workload(num_requests, *, prompt_len, output_len, vocab_size, arrival=Offline(), seed=0,
                      sampling=None) -> list[Request]   (sorted by arrival; ids 0..n-1)

Compact string forms (for the CLI; numbers may be ints or floats where it makes sense):

    lengths:  "128" or "fixed:128" | "uniform:LO:HI" | "normal:MEAN:STD[:LO[:HI]]"
              | "lognormal:MU:SIGMA[:LO[:HI]]" | "cycle:128,256,512"
    arrival:  "offline" (or "batch") | "poisson:RATE_PER_S" | "interval:SECONDS"

Bad parameters raise `SpecError` (a ValueError) naming the parameter and the value.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from llmperf.engine.sampling import SamplingParams
from llmperf.errors import SpecError


def _is_int(x: object) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _is_real(x: object) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool) and math.isfinite(x)


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


@dataclass(frozen=True, kw_only=True)
class Request:
    """One request of a workload: its prompt tokens, how many tokens to generate at most, when it
    arrives (seconds from the start of the run) and, optionally, its own decoding parameters."""

    request_id: int
    prompt: tuple[int, ...]
    max_new_tokens: int
    arrival_time_s: float = 0.0
    sampling: SamplingParams | None = None

    def __post_init__(self) -> None:
        if isinstance(self.prompt, np.ndarray):
            object.__setattr__(self, "prompt", tuple(int(t) for t in self.prompt))
        elif isinstance(self.prompt, list):
            object.__setattr__(self, "prompt", tuple(self.prompt))
        if not _is_int(self.request_id):
            raise SpecError(f"request_id: must be an integer, got {self.request_id!r}")
        if not isinstance(self.prompt, tuple) or not self.prompt or not all(_is_int(t) and t >= 0 for t in self.prompt):
            raise SpecError(f"prompt: must be a non-empty sequence of non-negative token ids, got {self.prompt!r}")
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise SpecError(f"max_new_tokens: must be a positive integer, got {self.max_new_tokens!r}")
        if not _is_real(self.arrival_time_s) or self.arrival_time_s < 0:
            raise SpecError(f"arrival_time_s: must be a finite number >= 0, got {self.arrival_time_s!r}")
        if self.sampling is not None and not isinstance(self.sampling, SamplingParams):
            raise SpecError(f"sampling: must be None or SamplingParams, got {type(self.sampling).__name__}")

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    def params(self, default: SamplingParams) -> SamplingParams:
        """The request's decoding parameters (its own, else `default`) with its `max_new_tokens`;
        `min_new_tokens` is capped at it."""
        base = self.sampling if self.sampling is not None else default
        return dataclasses.replace(base, max_new_tokens=self.max_new_tokens,
                                   min_new_tokens=min(base.min_new_tokens, self.max_new_tokens))


# ---------------------------------------------------------------------------------------------------
# Length distributions


@runtime_checkable
class LengthDist(Protocol):
    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray: ...

    @property
    def mean(self) -> float: ...


def _check_bounds(name: str, lo: object, hi: object) -> None:
    if not _is_int(lo) or lo < 1:
        raise SpecError(f"{name}.lo: must be a positive integer, got {lo!r}")
    if hi is not None and (not _is_int(hi) or hi < lo):
        raise SpecError(f"{name}.hi: must be None or an integer >= lo={lo}, got {hi!r}")


def _clip_round(x: np.ndarray, lo: int, hi: int | None) -> np.ndarray:
    return np.clip(np.rint(x), lo, hi if hi is not None else np.inf).astype(np.int64)


@dataclass(frozen=True)
class Fixed:
    value: int

    def __post_init__(self) -> None:
        if not _is_int(self.value) or self.value < 1:
            raise SpecError(f"fixed: length must be a positive integer, got {self.value!r}")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return np.full(n, self.value, dtype=np.int64)

    @property
    def mean(self) -> float:
        return float(self.value)

    def __str__(self) -> str:
        return f"fixed:{self.value}"


@dataclass(frozen=True)
class Uniform:
    """Integers uniform on [lo, hi], both included."""

    lo: int
    hi: int

    def __post_init__(self) -> None:
        if not _is_int(self.lo) or self.lo < 1:
            raise SpecError(f"uniform: lo must be a positive integer, got {self.lo!r}")
        if not _is_int(self.hi) or self.hi < self.lo:
            raise SpecError(f"uniform: hi must be an integer >= lo={self.lo}, got {self.hi!r}")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return rng.integers(self.lo, self.hi, endpoint=True, size=n, dtype=np.int64)

    @property
    def mean(self) -> float:
        return (self.lo + self.hi) / 2

    def __str__(self) -> str:
        return f"uniform:{self.lo}:{self.hi}"


@dataclass(frozen=True)
class Normal:
    """Normal(mean, std) rounded to integers and clipped to [lo, hi] (hi None: unbounded). `mean` is
    the mean before rounding and clipping."""

    mean: float
    std: float
    lo: int = 1
    hi: int | None = None

    def __post_init__(self) -> None:
        if not _is_real(self.mean):
            raise SpecError(f"normal: mean must be a finite number, got {self.mean!r}")
        if not _is_real(self.std) or self.std < 0:
            raise SpecError(f"normal: std must be a finite number >= 0, got {self.std!r}")
        _check_bounds("normal", self.lo, self.hi)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return _clip_round(rng.normal(self.mean, self.std, size=n), self.lo, self.hi)

    def __str__(self) -> str:
        return f"normal:{_fmt(self.mean)}:{_fmt(self.std)}:{self.lo}" + (f":{self.hi}" if self.hi is not None else "")


@dataclass(frozen=True)
class LogNormal:
    """exp(Normal(mu, sigma)) rounded to integers and clipped to [lo, hi]: long-tailed, like real
    prompt and output lengths. The median is exp(mu); "lognormal:6.0:0.5" has median ~403."""

    mu: float
    sigma: float
    lo: int = 1
    hi: int | None = None

    def __post_init__(self) -> None:
        if not _is_real(self.mu):
            raise SpecError(f"lognormal: mu must be a finite number, got {self.mu!r}")
        if not _is_real(self.sigma) or self.sigma < 0:
            raise SpecError(f"lognormal: sigma must be a finite number >= 0, got {self.sigma!r}")
        _check_bounds("lognormal", self.lo, self.hi)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return _clip_round(rng.lognormal(self.mu, self.sigma, size=n), self.lo, self.hi)

    @property
    def mean(self) -> float:
        """The mean before rounding and clipping, exp(mu + sigma^2 / 2)."""
        return math.exp(self.mu + self.sigma ** 2 / 2)

    def __str__(self) -> str:
        return (f"lognormal:{_fmt(self.mu)}:{_fmt(self.sigma)}:{self.lo}"
                + (f":{self.hi}" if self.hi is not None else ""))


@dataclass(frozen=True)
class Cycle:
    """The given lengths in turn (request i gets values[i % len(values)]); draws nothing at random."""

    values: tuple[int, ...]

    def __post_init__(self) -> None:
        if isinstance(self.values, Sequence) and not isinstance(self.values, tuple):
            object.__setattr__(self, "values", tuple(self.values))
        if not isinstance(self.values, tuple) or not self.values or not all(_is_int(v) and v >= 1 for v in self.values):
            raise SpecError(f"cycle: values must be a non-empty list of positive integers, got {self.values!r}")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return np.resize(np.asarray(self.values, dtype=np.int64), n)

    @property
    def mean(self) -> float:
        return float(np.mean(self.values))

    def __str__(self) -> str:
        return "cycle:" + ",".join(str(v) for v in self.values)


# ---------------------------------------------------------------------------------------------------
# Arrival processes


@runtime_checkable
class Arrival(Protocol):
    def times(self, n: int, rng: np.random.Generator) -> np.ndarray: ...


@dataclass(frozen=True)
class Offline:
    """Every request at t=0: an offline batch, the scheduler sees the whole queue at once."""

    def times(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return np.zeros(n)

    def __str__(self) -> str:
        return "offline"


@dataclass(frozen=True)
class Poisson:
    """A Poisson process of `rate_per_s` requests/s: exponential gaps of mean 1/rate, first at t=0."""

    rate_per_s: float

    def __post_init__(self) -> None:
        if not _is_real(self.rate_per_s) or self.rate_per_s <= 0:
            raise SpecError(f"poisson: rate must be a finite number of requests/s > 0, got {self.rate_per_s!r}")

    def times(self, n: int, rng: np.random.Generator) -> np.ndarray:
        gaps = rng.exponential(1.0 / self.rate_per_s, size=max(n - 1, 0))
        return np.concatenate(([0.0], np.cumsum(gaps)))[:n]

    def __str__(self) -> str:
        return f"poisson:{_fmt(self.rate_per_s)}"


@dataclass(frozen=True)
class FixedInterval:
    """Request i arrives at i * interval_s."""

    interval_s: float

    def __post_init__(self) -> None:
        if not _is_real(self.interval_s) or self.interval_s < 0:
            raise SpecError(f"interval: must be a finite number of seconds >= 0, got {self.interval_s!r}")

    def times(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return np.arange(n) * float(self.interval_s)

    def __str__(self) -> str:
        return f"interval:{_fmt(self.interval_s)}"


# ---------------------------------------------------------------------------------------------------
# Parsing the compact forms


def _num(spec: str, text: str, kind: type) -> float:
    try:
        return kind(text)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise SpecError(f"{spec!r}: {text!r} is not {what}") from None


def _with_args(spec: str, args: list[str], required: list[str], optional: list[str]) -> None:
    if not len(required) <= len(args) <= len(required) + len(optional):
        form = ":".join([spec.split(":")[0], *(a.upper() for a in required), *(f"[{a.upper()}]" for a in optional)])
        raise SpecError(f"{spec!r}: expected {form}")


def parse_length(spec: str | int | LengthDist) -> LengthDist:
    """A length distribution from its compact form (see the module docstring); an int is Fixed."""
    if isinstance(spec, LengthDist) and not isinstance(spec, (str, int)):
        return spec
    if _is_int(spec):
        return Fixed(int(spec))
    if not isinstance(spec, str):
        raise SpecError(f"length: expected a distribution or a string like 'uniform:32:512', got {spec!r}")
    name, *args = spec.strip().split(":")
    name = name.lower()
    if not args and name.isdigit():
        return Fixed(int(name))
    if name == "fixed":
        _with_args(spec, args, ["n"], [])
        return Fixed(_num(spec, args[0], int))
    if name == "uniform":
        _with_args(spec, args, ["lo", "hi"], [])
        return Uniform(_num(spec, args[0], int), _num(spec, args[1], int))
    if name in ("normal", "lognormal"):
        _with_args(spec, args, ["mean" if name == "normal" else "mu", "std" if name == "normal" else "sigma"],
                   ["lo", "hi"])
        a, b = _num(spec, args[0], float), _num(spec, args[1], float)
        lo = _num(spec, args[2], int) if len(args) > 2 else 1
        hi = _num(spec, args[3], int) if len(args) > 3 else None
        return Normal(a, b, lo, hi) if name == "normal" else LogNormal(a, b, lo, hi)
    if name == "cycle":
        _with_args(spec, args, ["values"], [])
        return Cycle(tuple(_num(spec, v.strip(), int) for v in args[0].split(",")))
    raise SpecError(f"length: unknown distribution {spec!r} (known: fixed, uniform, normal, lognormal, cycle)")


def parse_arrival(spec: str | Arrival) -> Arrival:
    """An arrival process from its compact form: "offline", "poisson:RATE", "interval:SECONDS"."""
    if isinstance(spec, Arrival) and not isinstance(spec, str):
        return spec
    if not isinstance(spec, str):
        raise SpecError(f"arrival: expected an arrival process or a string like 'poisson:4.0', got {spec!r}")
    name, *args = spec.strip().split(":")
    name = name.lower()
    if name in ("offline", "batch"):
        _with_args(spec, args, [], [])
        return Offline()
    if name == "poisson":
        _with_args(spec, args, ["rate"], [])
        return Poisson(_num(spec, args[0], float))
    if name == "interval":
        _with_args(spec, args, ["seconds"], [])
        return FixedInterval(_num(spec, args[0], float))
    raise SpecError(f"arrival: unknown process {spec!r} (known: offline, poisson, interval)")


# ---------------------------------------------------------------------------------------------------


def generate_workload(num_requests: int, *, prompt_len: LengthDist | str | int, output_len: LengthDist | str | int,
                      vocab_size: int, arrival: Arrival | str = "offline", seed: int = 0,
                      sampling: SamplingParams | None = None) -> list[Request]:
    """`num_requests` requests with prompts of uniformly random token ids in [0, vocab_size), lengths
    drawn from `prompt_len` and `output_len` (the latter is each request's `max_new_tokens`), arrival
    times from `arrival`, all reproducible from `seed`. Sorted by arrival time; ids 0..n-1 in order."""
    if not _is_int(num_requests) or num_requests < 0:
        raise SpecError(f"num_requests: must be a non-negative integer, got {num_requests!r}")
    if not _is_int(vocab_size) or vocab_size < 1:
        raise SpecError(f"vocab_size: must be a positive integer, got {vocab_size!r}")
    if not _is_int(seed) or seed < 0:
        raise SpecError(f"seed: must be a non-negative integer, got {seed!r}")
    prompt_dist, output_dist, arrival_proc = parse_length(prompt_len), parse_length(output_len), parse_arrival(arrival)
    rng_prompt, rng_output, rng_arrival, rng_tokens = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4))
    prompt_lens = prompt_dist.sample(num_requests, rng_prompt)
    output_lens = output_dist.sample(num_requests, rng_output)
    times = arrival_proc.times(num_requests, rng_arrival)
    tokens = rng_tokens.integers(0, vocab_size, size=int(prompt_lens.sum()), dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(prompt_lens)))
    return [Request(request_id=i, prompt=tuple(tokens[starts[i]:starts[i + 1]].tolist()),
                    max_new_tokens=int(output_lens[i]), arrival_time_s=float(times[i]), sampling=sampling)
            for i in range(num_requests)]


__all__ = [
    "Arrival", "Cycle", "Fixed", "FixedInterval", "LengthDist", "LogNormal", "Normal", "Offline", "Poisson",
    "Request", "Uniform", "generate_workload", "parse_arrival", "parse_length",
]
