"""Serving workloads for the engine: the torch-free workloads of `llmperf.serving.workload` (arrivals,
lengths, shared system prompts, traces) with token ids and decoding parameters attached.

The length distributions and arrival processes live in `llmperf.serving.workload` (the simulator
reads the same ones) and are re-exported here; this module adds the token ids. Prompt token ids are
uniform in [0, vocab_size) from the workload's fourth child stream (`child_rngs`), so a seeded
workload gives the same tokens whatever its lengths or arrivals. A shared system prompt is one
block of token ids drawn first and put in front of every prompt that shares it.

Public API (engine-core builds on it; keep stable):

    Request(*, request_id, prompt, max_new_tokens, arrival_time_s=0.0, sampling=None)
        .prompt_len   .params(default: SamplingParams) -> SamplingParams
    Length distributions (each .sample(n, rng) -> int64 array, .mean -> float, str() = compact form):
        Fixed(value)   Uniform(lo, hi) (inclusive)   Normal(mean, std, lo=1, hi=None)
        LogNormal(mu, sigma, lo=1, hi=None) (mu, sigma of log(length))   Cycle(values)   Empirical(values)
    Arrival processes (each .times(n, rng) -> float64 array of seconds, non-decreasing):
        Offline()   Poisson(rate_per_s)   Gamma(rate_per_s, cv)   FixedInterval(interval_s)
    parse_length(spec) -> LengthDist      parse_arrival(spec) -> Arrival
    generate_workload(num_requests, *, prompt_len, output_len, vocab_size, arrival=Offline(), seed=0,
                      sampling=None) -> list[Request]   (sorted by arrival; ids 0..n-1)
    to_requests(workload, *, vocab_size, seed=0, sampling=None) -> list[Request]

Compact string forms: see `llmperf.serving.workload`. Bad parameters raise `SpecError` (a ValueError)
naming the parameter and the value.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from llmperf.engine.sampling import SamplingParams
from llmperf.errors import SpecError
from llmperf.numeric import is_int, is_real
from llmperf.serving.workload import (
    Arrival,
    Cycle,
    Empirical,
    Fixed,
    FixedInterval,
    Gamma,
    LengthDist,
    LogNormal,
    Normal,
    Offline,
    Poisson,
    Uniform,
    Workload,
    WorkloadSpec,
    child_rngs,
    generate,
    parse_arrival,
    parse_length,
)


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
        if not is_int(self.request_id):
            raise SpecError(f"request_id: must be an integer, got {self.request_id!r}")
        if not isinstance(self.prompt, tuple) or not self.prompt or not all(is_int(t) and t >= 0 for t in self.prompt):
            raise SpecError(f"prompt: must be a non-empty sequence of non-negative token ids, got {self.prompt!r}")
        if not is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise SpecError(f"max_new_tokens: must be a positive integer, got {self.max_new_tokens!r}")
        if not is_real(self.arrival_time_s) or self.arrival_time_s < 0:
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


def generate_workload(num_requests: int, *, prompt_len: LengthDist | str | int, output_len: LengthDist | str | int,
                      vocab_size: int, arrival: Arrival | str = "offline", seed: int = 0,
                      sampling: SamplingParams | None = None) -> list[Request]:
    """`num_requests` requests with prompts of uniformly random token ids in [0, vocab_size), lengths
    drawn from `prompt_len` and `output_len` (the latter is each request's `max_new_tokens`), arrival
    times from `arrival`, all reproducible from `seed`. Sorted by arrival time; ids 0..n-1 in order."""
    if not is_int(num_requests) or num_requests < 0:
        raise SpecError(f"num_requests: must be a non-negative integer, got {num_requests!r}")
    _check_vocab(vocab_size)
    if not is_int(seed) or seed < 0:
        raise SpecError(f"seed: must be a non-negative integer, got {seed!r}")
    spec = WorkloadSpec(arrival=arrival, prompt_len=prompt_len, output_len=output_len,
                        num_requests=num_requests, seed=seed)
    return to_requests(generate(spec), vocab_size=vocab_size, seed=seed, sampling=sampling)


def _check_vocab(vocab_size: object) -> None:
    if not is_int(vocab_size) or vocab_size < 1:
        raise SpecError(f"vocab_size: must be a positive integer, got {vocab_size!r}")


def to_requests(workload: Workload, *, vocab_size: int, seed: int = 0,
                sampling: SamplingParams | None = None) -> list[Request]:
    """The engine's requests for a torch-free `Workload`: token ids uniform in [0, vocab_size) from
    the token stream of `seed`; the system prompt (the longest shared prefix of the workload) is
    drawn first and every request that shares `k` tokens starts with its first `k`."""
    _check_vocab(vocab_size)
    rng_tokens = child_rngs(seed)[3]
    shared = workload.shared_prefix_tokens
    system = rng_tokens.integers(0, vocab_size, size=int(shared.max()) if len(workload) else 0, dtype=np.int64)
    own_lens = workload.prompt_tokens - shared
    tokens = rng_tokens.integers(0, vocab_size, size=int(own_lens.sum()), dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(own_lens)))
    return [Request(request_id=i,
                    prompt=tuple(system[:shared[i]].tolist()) + tuple(tokens[starts[i]:starts[i + 1]].tolist()),
                    max_new_tokens=int(workload.output_tokens[i]), arrival_time_s=float(workload.arrival_s[i]),
                    sampling=sampling)
            for i in range(len(workload))]


__all__ = [
    "Arrival", "Cycle", "Empirical", "Fixed", "FixedInterval", "Gamma", "LengthDist", "LogNormal", "Normal",
    "Offline", "Poisson", "Request", "Uniform", "Workload", "WorkloadSpec", "generate_workload", "parse_arrival",
    "parse_length", "to_requests",
]
