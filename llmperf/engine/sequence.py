"""Requests as the engine tracks them, and what it returns.

A request (one prompt, one `SamplingParams`) becomes a `SequenceGroup`: one running `Sequence`
before its prefill, then `num_return_sequences` sampled sequences or `num_beams` beams that share
the prompt's KV cache (forks). The group owns its random generator, so a request draws the same
tokens whatever else is batched with it. Results: `RequestOutput` (completions + `RequestMetrics`).

Times are `time.perf_counter()` seconds; metrics are differences of them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from llmperf.engine.beam import BeamSearch
from llmperf.engine.sampling import SamplingParams

_seq_ids = itertools.count()


@dataclass(frozen=True, kw_only=True)
class Completion:
    """One generated continuation: its tokens (an ending EOS or stop sequence included), why it
    ended ("eos", "stop_sequence", "length"), and for beam search its length-penalised score."""

    tokens: list[int]
    finish_reason: str
    score: float | None = None


@dataclass(kw_only=True)
class RequestMetrics:
    """When a request arrived, got its first token, each later token, and finished.

    `token_times[i]` is when the step that produced the request's (i+1)-th token ended (all its
    sequences advance together). TTFT = first token - arrival (queueing included); TPOT = mean gap
    between later tokens.
    """

    arrival: float
    scheduled: float | None = None
    first_token: float | None = None
    finished: float | None = None
    token_times: list[float] = field(default_factory=list)
    num_preemptions: int = 0

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def queue_time(self) -> float | None:
        return None if self.scheduled is None else self.scheduled - self.arrival

    @property
    def tpot(self) -> float | None:
        """Mean seconds per output token after the first (None with fewer than two tokens)."""
        if len(self.token_times) < 2:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (len(self.token_times) - 1)

    @property
    def latency(self) -> float | None:
        return None if self.finished is None else self.finished - self.arrival


@dataclass(frozen=True, kw_only=True)
class RequestOutput:
    request_id: int
    prompt: list[int]
    completions: list[Completion]
    metrics: RequestMetrics

    @property
    def tokens(self) -> list[int]:
        """The best (or only) completion's tokens."""
        return self.completions[0].tokens

    @property
    def num_generated(self) -> int:
        return sum(len(c.tokens) for c in self.completions)


class Sequence:
    """One running continuation: prompt + generated tokens; its id names its cache storage."""

    __slots__ = ("seq_id", "tokens", "prompt_len", "index")

    def __init__(self, tokens: list[int], prompt_len: int, index: int = 0, seq_id: int | None = None) -> None:
        self.seq_id = next(_seq_ids) if seq_id is None else seq_id
        self.tokens = tokens
        self.prompt_len = prompt_len
        self.index = index  # which sample (or beam slot) of its request

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_len:]

    @property
    def num_generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    def __repr__(self) -> str:
        return f"Sequence(id={self.seq_id}, len={len(self.tokens)}, prompt={self.prompt_len})"


class SequenceGroup:
    """One request while it is waiting, running or preempted.

    `seqs`: the running sequences (one before prefill). `needs_prefill`: nothing of it is in the
    cache (new, or preempted and to be recomputed). `prefilled`: it has produced its first token.
    """

    def __init__(self, request_id: int, prompt: list[int], params: SamplingParams, *,
                 arrival: float, generator: torch.Generator | None) -> None:
        if not prompt:
            raise ValueError(f"prompt: request {request_id} has an empty prompt")
        self.request_id = request_id
        self.prompt = list(prompt)
        self.params = params
        self.generator = generator
        self.beams = BeamSearch.from_params(1, params) if params.is_beam_search else None
        self.seqs = [Sequence(list(prompt), len(prompt))]
        self.finished: dict[int, Completion] = {}  # by sample index (beam search: by rank)
        self.metrics = RequestMetrics(arrival=arrival)
        self.needs_prefill = True
        self.prefilled = False

    @property
    def is_finished(self) -> bool:
        return not self.seqs and self.prefilled

    @property
    def width(self) -> int:
        """Sequences the group will run at once after its prefill (samples or beams)."""
        return self.params.num_beams if self.beams is not None else self.params.num_return_sequences

    @property
    def max_len(self) -> int:
        """The longest a sequence of this request can get (prompt + max_new_tokens)."""
        return len(self.prompt) + self.params.max_new_tokens

    def output(self) -> RequestOutput:
        completions = [self.finished[i] for i in sorted(self.finished)]
        return RequestOutput(request_id=self.request_id, prompt=self.prompt, completions=completions,
                             metrics=self.metrics)

    def __repr__(self) -> str:
        return f"SequenceGroup(id={self.request_id}, seqs={self.seqs}, finished={len(self.finished)})"
