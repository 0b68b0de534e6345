"""Serving workloads without tokens or torch: when each request arrives, how long its prompt is, how
many tokens it generates, and how much of its prompt is a system prompt shared with every request.

The simulator (`llmperf.serving.simulator`) and the real engine (`llmperf.engine.workload`, which adds
token ids to these requests) read the same `Workload`, so both serve exactly the same requests.

Length distributions and arrival processes follow the usual serving benchmarks (vLLM's
`benchmarks/benchmark_serving.py`; Orca, vLLM and Sarathi-Serve evaluations): lengths fixed, uniform,
normal or log-normal (clipped to a range), cycled from a list, or drawn from a file of observed
lengths; arrivals all at t=0 (offline), Poisson, gamma (a rate and a coefficient of variation), a
fixed interval, or a trace file. Every random quantity draws from its own child stream of one
`numpy.random.SeedSequence(seed)`, so changing one distribution leaves the others unchanged.

Compact string forms (for the CLI):

    lengths:  "128" or "fixed:128" | "uniform:LO:HI" | "normal:MEAN:STD[:LO[:HI]]"
              | "lognormal:MU:SIGMA[:LO[:HI]]" | "cycle:128,256,512" | "file:PATH"
    arrival:  "offline" (or "batch") | "poisson:RATE" | "gamma:RATE:CV" | "interval:SECONDS"

A trace is CSV (a header row) or JSONL with the fields `arrival_s`, `prompt_tokens`, `output_tokens`
(and optionally `shared_prefix_tokens`). Bad input raises `SpecError` naming the parameter and value;
a bad trace line is named by its line number and field. Details: docs/serving.md, "Workloads".
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
import pandas as pd

from llmperf.errors import SpecError
from llmperf.numeric import is_int, is_real


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(float(x)) < 1e16 else repr(float(x))


# ---------------------------------------------------------------------------------------------------
# Length distributions


@runtime_checkable
class LengthDist(Protocol):
    """A distribution of token counts: what `prompt_len` and `output_len` take."""

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """`n` lengths (int64) drawn with `rng`."""

    @property
    def mean(self) -> float: ...


def _check_bounds(name: str, lo: object, hi: object) -> None:
    if not is_int(lo) or lo < 1:
        raise SpecError(f"{name}.lo: must be a positive integer, got {lo!r}")
    if hi is not None and (not is_int(hi) or hi < lo):
        raise SpecError(f"{name}.hi: must be None or an integer >= lo={lo}, got {hi!r}")


MAX_TOKENS = 2**31  # tokens of one request's prompt or output: far beyond any context, still exact


def _clip_round(x: np.ndarray, lo: int, hi: int | None, dist: object = "length") -> np.ndarray:
    """Round and clip drawn lengths to [lo, hi]; a draw above MAX_TOKENS (without hi) is refused."""
    if hi is None and len(x) and not (np.nanmax(x) <= MAX_TOKENS):
        big = float(np.nanmax(x)) if not np.isnan(x).all() else float("nan")
        raise SpecError(f"{dist}: draws a length of {big:.3g} tokens, more than 2**31; give an upper bound "
                        "(...:LO:HI)")
    return np.clip(np.rint(x), lo, hi if hi is not None else MAX_TOKENS).astype(np.int64)


@dataclass(frozen=True)
class Fixed:
    """Every request the same length (`512`)."""

    value: int

    def __post_init__(self) -> None:
        if not is_int(self.value) or self.value < 1:
            raise SpecError(f"fixed: length must be a positive integer, got {self.value!r}")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """`n` copies of the length."""
        return np.full(n, self.value, dtype=np.int64)

    @property
    def mean(self) -> float:
        return float(self.value)

    @property
    def max(self) -> int:
        return int(self.value)

    def __str__(self) -> str:
        return f"fixed:{self.value}"


@dataclass(frozen=True)
class Uniform:
    """Integers uniform on [lo, hi], both included."""

    lo: int
    hi: int

    def __post_init__(self) -> None:
        if not is_int(self.lo) or self.lo < 1:
            raise SpecError(f"uniform: lo must be a positive integer, got {self.lo!r}")
        if not is_int(self.hi) or self.hi < self.lo:
            raise SpecError(f"uniform: hi must be an integer >= lo={self.lo}, got {self.hi!r}")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """`n` lengths uniform over `lo..hi`, both included."""
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
        if not is_real(self.mean):
            raise SpecError(f"normal: mean must be a finite number, got {self.mean!r}")
        if not is_real(self.std) or self.std < 0:
            raise SpecError(f"normal: std must be a finite number >= 0, got {self.std!r}")
        _check_bounds("normal", self.lo, self.hi)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """`n` normal draws, rounded and clipped to `[lo, hi]`."""
        return _clip_round(rng.normal(self.mean, self.std, size=n), self.lo, self.hi, self)

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
        if not is_real(self.mu):
            raise SpecError(f"lognormal: mu must be a finite number, got {self.mu!r}")
        if not is_real(self.sigma) or self.sigma < 0:
            raise SpecError(f"lognormal: sigma must be a finite number >= 0, got {self.sigma!r}")
        _check_bounds("lognormal", self.lo, self.hi)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """`n` lognormal draws, rounded and clipped to `[lo, hi]`."""
        with np.errstate(over="ignore"):  # exp overflows to inf: refused by _clip_round
            return _clip_round(rng.lognormal(self.mu, self.sigma, size=n), self.lo, self.hi, self)

    @property
    def mean(self) -> float:
        """The mean before rounding and clipping, exp(mu + sigma^2 / 2) (inf beyond float range)."""
        try:
            return math.exp(self.mu + self.sigma ** 2 / 2)
        except OverflowError:
            return math.inf

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
        if not isinstance(self.values, tuple) or not self.values or not all(is_int(v) and v >= 1 for v in self.values):
            raise SpecError(f"cycle: values must be a non-empty list of positive integers, got {self.values!r}")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """The values in turn, repeated to `n` (the generator is not used)."""
        return np.resize(np.asarray(self.values, dtype=np.int64), n)

    @property
    def mean(self) -> float:
        return float(np.mean(self.values))

    def __str__(self) -> str:
        return "cycle:" + ",".join(str(v) for v in self.values)


@dataclass(frozen=True)
class Empirical:
    """Lengths drawn uniformly with replacement from observed `values` (e.g. a production log's
    prompt lengths), read from `path` by `parse_length("file:PATH")`."""

    values: tuple[int, ...] = field(repr=False)
    path: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.values, tuple):
            object.__setattr__(self, "values", tuple(int(v) for v in self.values))
        if not self.values or not all(is_int(v) and v >= 1 for v in self.values):
            raise SpecError(f"file: {self.path!r} must hold at least one positive integer length")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """`n` of the observed lengths, drawn with replacement."""
        return np.asarray(self.values, dtype=np.int64)[rng.integers(0, len(self.values), size=n)]

    @property
    def mean(self) -> float:
        return float(np.mean(self.values))

    def __str__(self) -> str:
        return f"file:{self.path}"


def read_length_file(path: str | Path) -> Empirical:
    """One positive integer a line; blank lines and `#` comments skipped; errors name the line."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise SpecError(f"file: cannot read length file {str(path)!r} ({exc.strerror or exc})") from None
    values = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        item = line.split("#", 1)[0].strip()
        if not item:
            continue
        try:
            v = int(item)
        except ValueError:
            raise SpecError(f"{path}: line {lineno}: length {item!r} is not an integer") from None
        if v < 1:
            raise SpecError(f"{path}: line {lineno}: length must be a positive integer, got {v}")
        values.append(v)
    if not values:
        raise SpecError(f"file: {str(path)!r} holds no lengths")
    return Empirical(tuple(values), str(path))


# ---------------------------------------------------------------------------------------------------
# Arrival processes


@runtime_checkable
class Arrival(Protocol):
    """An arrival process: what `arrival` takes."""

    def times(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """The arrival times of `n` requests in seconds, non-decreasing from 0."""


@dataclass(frozen=True)
class Offline:
    """Every request at t=0: an offline batch, the scheduler sees the whole queue at once."""

    def times(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """Every request at t = 0 (an offline batch)."""
        return np.zeros(n)

    def __str__(self) -> str:
        return "offline"


@dataclass(frozen=True)
class Poisson:
    """A Poisson process of `rate_per_s` requests/s: exponential gaps of mean 1/rate, first at t=0."""

    rate_per_s: float

    def __post_init__(self) -> None:
        if not is_real(self.rate_per_s) or self.rate_per_s <= 0:
            raise SpecError(f"poisson: rate must be a finite number of requests/s > 0, got {self.rate_per_s!r}")

    def gaps(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """`n` exponential inter-arrival gaps of mean `1 / rate_per_s`."""
        return rng.exponential(1.0 / self.rate_per_s, size=n)

    def times(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """The first request at 0, then the cumulative gaps."""
        return np.concatenate(([0.0], np.cumsum(self.gaps(max(n - 1, 0), rng))))[:n]

    def __str__(self) -> str:
        return f"poisson:{_fmt(self.rate_per_s)}"


@dataclass(frozen=True)
class Gamma:
    """A gamma renewal process: gaps Gamma(shape 1/cv^2, scale cv^2/rate), mean 1/rate, std cv/rate.
    cv = 1 is Poisson; cv > 1 is burstier, cv < 1 more regular. First request at t=0."""

    rate_per_s: float
    cv: float

    def __post_init__(self) -> None:
        if not is_real(self.rate_per_s) or self.rate_per_s <= 0:
            raise SpecError(f"gamma: rate must be a finite number of requests/s > 0, got {self.rate_per_s!r}")
        if not is_real(self.cv) or self.cv <= 0:
            raise SpecError(f"gamma: cv must be a finite number > 0, got {self.cv!r}")

    def gaps(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """`n` gamma inter-arrival gaps of mean `1 / rate_per_s` and coefficient of variation `cv`."""
        shape = 1.0 / self.cv ** 2
        return rng.gamma(shape, 1.0 / (self.rate_per_s * shape), size=n)

    def times(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """The first request at 0, then the cumulative gaps."""
        return np.concatenate(([0.0], np.cumsum(self.gaps(max(n - 1, 0), rng))))[:n]

    def __str__(self) -> str:
        return f"gamma:{_fmt(self.rate_per_s)}:{_fmt(self.cv)}"


@dataclass(frozen=True)
class FixedInterval:
    """Request i arrives at i * interval_s."""

    interval_s: float

    def __post_init__(self) -> None:
        if not is_real(self.interval_s) or self.interval_s < 0:
            raise SpecError(f"interval: must be a finite number of seconds >= 0, got {self.interval_s!r}")

    def gaps(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """`n` gaps of `interval_s`."""
        return np.full(n, float(self.interval_s))

    def times(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """Requests every `interval_s` seconds from 0."""
        return np.arange(n) * float(self.interval_s)

    def __str__(self) -> str:
        return f"interval:{_fmt(self.interval_s)}"


def arrival_rate(arrival: Arrival) -> float | None:
    """Mean arrival rate in requests/s (None for an offline batch)."""
    if isinstance(arrival, (Poisson, Gamma)):
        return float(arrival.rate_per_s)
    if isinstance(arrival, FixedInterval):
        return 1.0 / arrival.interval_s if arrival.interval_s > 0 else None
    return None


def times_within(arrival: Arrival, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times in [0, duration_s): t=0 first, then gaps drawn in blocks until past the end."""
    if not hasattr(arrival, "gaps"):
        raise SpecError(f"duration: needs an arrival process with a rate (poisson, gamma, interval), got {arrival}")
    rate = arrival_rate(arrival)
    if rate is None:
        raise SpecError("duration: an interval of 0 s puts infinitely many requests in any duration")
    times, t, block = [np.zeros(1)], 0.0, max(16, int(rate * duration_s * 1.1) + 16)
    while t < duration_s:
        chunk = t + np.cumsum(arrival.gaps(block, rng))
        times.append(chunk)
        t = float(chunk[-1])
    out = np.concatenate(times)
    return out[out < duration_s]


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
    if is_int(spec):
        return Fixed(int(spec))
    if not isinstance(spec, str):
        raise SpecError(f"length: expected a distribution or a string like 'uniform:32:512', got {spec!r}")
    if spec.strip().lower().startswith("file:"):
        return read_length_file(spec.strip()[5:])
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
    raise SpecError(f"length: unknown distribution {spec!r} (known: fixed, uniform, normal, lognormal, cycle, file)")


def parse_arrival(spec: str | Arrival) -> Arrival:
    """An arrival process from its compact form: "offline", "poisson:RATE", "gamma:RATE:CV",
    "interval:SECONDS"."""
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
    if name == "gamma":
        _with_args(spec, args, ["rate", "cv"], [])
        return Gamma(_num(spec, args[0], float), _num(spec, args[1], float))
    if name == "interval":
        _with_args(spec, args, ["seconds"], [])
        return FixedInterval(_num(spec, args[0], float))
    raise SpecError(f"arrival: unknown process {spec!r} (known: offline, poisson, gamma, interval)")


# ---------------------------------------------------------------------------------------------------
# Workloads


@dataclass(frozen=True, kw_only=True)
class Workload:
    """Requests as parallel integer / float arrays, sorted by arrival (ids 0..n-1 in that order).

    `prompt_tokens` include the `shared_prefix_tokens` leading tokens of the system prompt that every
    request with a non-zero entry shares; `output_tokens` is how many tokens each request generates."""

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    shared_prefix_tokens: np.ndarray
    description: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        arrays = {f: np.asarray(getattr(self, f)) for f in ("arrival_s", "prompt_tokens", "output_tokens",
                                                             "shared_prefix_tokens")}
        n = len(arrays["arrival_s"])
        for name, a in arrays.items():
            if a.ndim != 1 or len(a) != n:
                raise SpecError(f"workload: {name} must be a 1-d array of {n} values, got shape {a.shape}")
        object.__setattr__(self, "arrival_s", arrays["arrival_s"].astype(float))
        for name in ("prompt_tokens", "output_tokens", "shared_prefix_tokens"):
            object.__setattr__(self, name, arrays[name].astype(np.int64))
        if n and (np.diff(self.arrival_s) < 0).any():
            raise SpecError("workload: arrival_s must be sorted (non-decreasing)")

    def __len__(self) -> int:
        return len(self.arrival_s)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Workload):
            return NotImplemented
        return all(np.array_equal(getattr(self, f), getattr(other, f)) for f in
                   ("arrival_s", "prompt_tokens", "output_tokens", "shared_prefix_tokens"))

    __hash__ = None  # type: ignore[assignment]

    @property
    def max_context(self) -> int:
        return int((self.prompt_tokens + self.output_tokens).max()) if len(self) else 0

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1]) if len(self) else 0.0

    def to_frame(self) -> pd.DataFrame:
        """One row per request: id, arrival time, prompt and output tokens, shared-prefix tokens."""
        return pd.DataFrame(dict(request_id=np.arange(len(self)), arrival_s=self.arrival_s,
                                 prompt_tokens=self.prompt_tokens, output_tokens=self.output_tokens,
                                 shared_prefix_tokens=self.shared_prefix_tokens))


MAX_REQUESTS = 10_000_000  # a workload's arrays and the simulator's request states stay within memory


@dataclass(frozen=True, kw_only=True)
class WorkloadSpec:
    """How to draw a synthetic workload: exactly one of `num_requests` and `duration_s`."""

    arrival: Arrival | str = "offline"
    prompt_len: LengthDist | str | int = 512
    output_len: LengthDist | str | int = 128
    num_requests: int | None = None
    duration_s: float | None = None
    system_prompt_len: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "arrival", parse_arrival(self.arrival))
        object.__setattr__(self, "prompt_len", parse_length(self.prompt_len))
        object.__setattr__(self, "output_len", parse_length(self.output_len))
        if (self.num_requests is None) == (self.duration_s is None):
            raise SpecError("requests: give exactly one of the number of requests and a duration")
        if self.num_requests is not None and (not is_int(self.num_requests) or self.num_requests < 0):
            raise SpecError(f"requests: must be a non-negative integer, got {self.num_requests!r}")
        if self.duration_s is not None and (not is_real(self.duration_s) or self.duration_s <= 0):
            raise SpecError(f"duration: must be a finite number of seconds > 0, got {self.duration_s!r}")
        if not is_int(self.system_prompt_len) or self.system_prompt_len < 0:
            raise SpecError(f"system_prompt_len: must be a non-negative integer, got {self.system_prompt_len!r}")
        if not is_int(self.seed) or self.seed < 0:
            raise SpecError(f"seed: must be a non-negative integer, got {self.seed!r}")
        if self.num_requests is not None and self.num_requests > MAX_REQUESTS:
            raise SpecError(f"requests: at most {MAX_REQUESTS:,} per workload, got {self.num_requests:,}")
        if self.duration_s is not None:
            times_within(self.arrival, 0.0, np.random.default_rng(0))  # refuses an arrival without a rate
            expected = arrival_rate(self.arrival) * self.duration_s
            if expected > MAX_REQUESTS:
                raise SpecError(f"duration: {_fmt(self.duration_s)} s at {arrival_rate(self.arrival):g} requests/s is "
                                f"about {expected:.3g} requests, more than the {MAX_REQUESTS:,} a workload holds")

    def describe(self) -> dict[str, object]:
        """The spec as plain values (distributions by their string form), for run.json."""
        return dict(arrival=str(self.arrival), prompt_len=str(self.prompt_len), output_len=str(self.output_len),
                    num_requests=self.num_requests, duration_s=self.duration_s,
                    system_prompt_len=self.system_prompt_len, seed=self.seed)


def child_rngs(seed: int, n: int = 4) -> list[np.random.Generator]:
    """The workload's independent streams: prompt lengths, output lengths, arrivals, token ids."""
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(n)]


def generate(spec: WorkloadSpec) -> Workload:
    """Draw the workload `spec` describes (reproducible from `spec.seed`). With a system prompt of S
    tokens every prompt is S shared tokens followed by its own drawn length."""
    rng_prompt, rng_output, rng_arrival, _ = child_rngs(spec.seed)
    if spec.duration_s is not None:
        times = times_within(spec.arrival, spec.duration_s, rng_arrival)
    else:
        times = spec.arrival.times(spec.num_requests, rng_arrival)
    n = len(times)
    own = spec.prompt_len.sample(n, rng_prompt)
    out = spec.output_len.sample(n, rng_output)
    S = spec.system_prompt_len
    return Workload(arrival_s=times, prompt_tokens=own + S, output_tokens=out,
                    shared_prefix_tokens=np.full(n, S, dtype=np.int64), description=spec.describe())


# ---------------------------------------------------------------------------------------------------
# Trace files

TRACE_FIELDS = ("arrival_s", "prompt_tokens", "output_tokens")
OPTIONAL_TRACE_FIELDS = ("shared_prefix_tokens",)


def _trace_value(path: str, lineno: int, name: str, raw: object, *, integer: bool, low: float) -> float:
    where = f"{path}: line {lineno}: {name}"
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        raise SpecError(f"{where}: missing")
    if isinstance(raw, bool):
        raise SpecError(f"{where}: {raw!r} is not a number")
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise SpecError(f"{where}: {raw!r} is not a number") from None
    if not math.isfinite(value):
        raise SpecError(f"{where}: {raw!r} is not finite")
    if integer and not value.is_integer():
        raise SpecError(f"{where}: {raw!r} is not an integer")
    if value < low:
        kind = "an integer" if integer else "a number"
        raise SpecError(f"{where}: must be {kind} >= {_fmt(low)}, got {raw!r}")
    if integer and value > MAX_TOKENS:
        raise SpecError(f"{where}: {raw!r} exceeds 2**31 tokens")
    return value


def _trace_rows(path: Path) -> list[tuple[int, dict[str, object]]]:
    text = path.read_text(encoding="utf-8-sig")  # a spreadsheet's CSV starts with a byte-order mark
    rows: list[tuple[int, dict[str, object]]] = []
    first_line, first = next(((i, ln.strip()) for i, ln in enumerate(text.splitlines(), start=1) if ln.strip()),
                             (1, ""))
    if first.startswith("["):
        raise SpecError(f"{path}: line {first_line}: a JSON array; a trace is JSONL (one JSON object a line) or CSV "
                        "with a header")
    if first.startswith("{"):
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SpecError(f"{path}: line {lineno}: not a JSON object ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise SpecError(f"{path}: line {lineno}: not a JSON object")
            rows.append((lineno, obj))
        return rows
    lines = text.splitlines()
    reader = csv.reader(lines)
    header = None
    for lineno, cells in enumerate(reader, start=1):
        if not any(c.strip() for c in cells):
            continue
        if header is None:
            header = [c.strip() for c in cells]
            twice = sorted({c for c in header if header.count(c) > 1 and c})
            if twice:
                raise SpecError(f"{path}: line {lineno}: column {twice[0]!r} appears twice in the header")
            missing = [f for f in TRACE_FIELDS if f not in header]
            if missing:
                raise SpecError(f"{path}: line {lineno}: header lacks column {missing[0]!r} "
                                f"(needs {', '.join(TRACE_FIELDS)})")
            continue
        if len(cells) > len(header):
            raise SpecError(f"{path}: line {lineno}: {len(cells)} fields, the header has {len(header)}")
        rows.append((lineno, dict(zip(header, cells))))
    return rows


def load_trace(path: str | Path) -> Workload:
    """A recorded workload: CSV with a header or JSONL, fields `arrival_s`, `prompt_tokens`,
    `output_tokens` (optional `shared_prefix_tokens`); rows are sorted by arrival (stable)."""
    p = Path(path)
    try:
        rows = _trace_rows(p)
    except OSError as exc:
        raise SpecError(f"trace: cannot read {str(path)!r} ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise SpecError(f"trace: {str(path)!r} is not a text file") from None
    if not rows:
        raise SpecError(f"trace: {str(path)!r} holds no requests")
    cols: dict[str, list[float]] = {f: [] for f in TRACE_FIELDS + OPTIONAL_TRACE_FIELDS}
    for lineno, row in rows:
        cols["arrival_s"].append(_trace_value(str(p), lineno, "arrival_s", row.get("arrival_s"), integer=False, low=0))
        cols["prompt_tokens"].append(_trace_value(str(p), lineno, "prompt_tokens", row.get("prompt_tokens"),
                                                  integer=True, low=1))
        cols["output_tokens"].append(_trace_value(str(p), lineno, "output_tokens", row.get("output_tokens"),
                                                  integer=True, low=1))
        raw = row.get("shared_prefix_tokens")
        shared = 0.0 if raw is None or raw == "" else _trace_value(str(p), lineno, "shared_prefix_tokens", raw,
                                                                    integer=True, low=0)
        if shared > cols["prompt_tokens"][-1]:
            raise SpecError(f"{p}: line {lineno}: shared_prefix_tokens: {int(shared)} exceeds prompt_tokens "
                            f"{int(cols['prompt_tokens'][-1])}")
        cols["shared_prefix_tokens"].append(shared)
    order = np.argsort(np.asarray(cols["arrival_s"]), kind="stable")
    return Workload(**{f: np.asarray(v)[order] for f, v in cols.items()}, description=dict(trace=str(p)))


__all__ = [
    "MAX_REQUESTS", "Arrival", "Cycle", "Empirical", "Fixed", "FixedInterval", "Gamma", "LengthDist", "LogNormal",
    "Normal", "Offline", "Poisson", "TRACE_FIELDS", "Uniform", "Workload", "WorkloadSpec", "arrival_rate", "child_rngs",
    "generate", "load_trace", "parse_arrival", "parse_length", "read_length_file", "times_within",
]
