"""The one scheduler: which requests run in each step, bounded by the KV cache. No torch.

The same `Scheduler` drives the real engine (`llmperf.engine`, whose model runner executes each step
on the device) and the simulator (`llmperf.serving`, whose cost-model runner prices each step with
`llmperf.analysis`). Given the same step durations, both produce the same schedule, step for step:
the decisions are recorded as typed `StepLog`s and compared with `StepLog.decision()`.

Policies (`SchedulerConfig`; Yu et al. 2022, "Orca", OSDI, for iteration-level scheduling; Kwon et
al. 2023, "PagedAttention", SOSP, arXiv:2309.06180, for paged KV and recompute preemption; Agrawal
et al. 2024, "Sarathi-Serve", OSDI, arXiv:2403.02310, for chunked prefill with a per-step token
budget and mixed steps): static or continuous batching; without chunked prefill a step either
prefills or decodes (vLLM v0), with it each step spends a budget of `max_batched_tokens` tokens on
decodes first, then prefill chunks (vLLM v1); paged KV with recompute preemption of the newest
request; an admission watermark of free blocks; prefix sharing of computed full blocks. Each step's
`Phase` (prefill, decode, mixed) is set here from what was scheduled. With `speculative`, each decode
is a cycle: the last token and k drafts through the target (`llmperf.serving.speculative`).

Protocols (structural): `KVSpace`, the cache bookkeeping the scheduler reserves in
(`llmperf.serving.blocks.BlockManager` for the simulator, the engine's caches over their tensors),
and `Runner.execute(plan: StepPlan) -> StepOutcome`, which runs (or prices) one step whose slots are
already reserved. The scheduler keeps its own clock, `now`, advanced by each step's
`StepOutcome.duration_s`, so a simulated runner gives a simulated clock and the real runner the wall
clock. Each rule in full: docs/serving.md, "The scheduler".
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from llmperf.analysis.vocabulary import Phase
from llmperf.numeric import is_count

if TYPE_CHECKING:
    from llmperf.serving.speculative import SpeculativeConfig

POLICIES = ("continuous", "static")


class KVSpace(Protocol):
    """Cache bookkeeping the scheduler allocates in (sequence ids are the scheduler's). Optional:
    `reserve_each(seq_ids) -> int`, `reserve(s, 1)` for each in order up to the first that does not
    fit, how many did (`BlockManager`'s: the decode tokens of a step in one call); `shared_blocks(n)`,
    the blocks of an n-token prefix a sequence continuing from it still holds (default n // block_size;
    fewer in `CappedBlockManager`, which gives back what its window left)."""

    num_blocks: int
    block_size: int
    max_seq_len: int
    fork_cost: int  # blocks a fork takes (paged: 0, shared by reference; contiguous: 1 row)
    paged: bool  # blocks come from one shared pool as sequences grow (then admission keeps a watermark)
    supports_prefix_sharing: bool

    @property
    def num_free_blocks(self) -> int: ...
    def blocks_for(self, num_tokens: int) -> int:
        """Blocks a sequence of `num_tokens` tokens takes."""
    def reserve_cost(self, seq_id: int, num_tokens: int = 1) -> int:
        """Free blocks that `reserve(seq_id, num_tokens)` would take."""
    def allocate(self, seq_id: int, num_tokens: int, prefix: Sequence[int] | None = None) -> bool:
        """Reserve a new sequence's first `num_tokens` positions (sharing the published blocks of `prefix`);
        False, with nothing changed, when they do not fit."""
    def reserve(self, seq_id: int, num_tokens: int = 1) -> bool:
        """Reserve `num_tokens` more positions of a sequence; False, with nothing changed, when they do not
        fit."""
    def fork(self, parent_id: int, child_id: int) -> object:
        """A new sequence `child_id` holding what `parent_id` holds (a beam or another sample of one
        prompt)."""
    def free(self, seq_id: int) -> None:
        """Drop a sequence and give back what only it held."""
    def seq_len(self, seq_id: int) -> int:
        """Positions reserved for a sequence."""
    def cached_prefix(self, tokens: Sequence[int], limit: int) -> int:
        """How many leading tokens of `tokens[:limit]` are already held by published blocks."""
    def publish(self, seq_id: int, tokens: Sequence[int], num_computed: int) -> None:
        """Make a sequence's full blocks within its first `num_computed` tokens findable for prefix
        sharing."""
    # Needed with speculative decoding only: `truncate(seq_id, num_tokens)`, keep a sequence's first
    # `num_tokens` positions and give back the rest (the rejected draft tokens' slots).


@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduledItem:
    """One request's share of a step: `num_tokens` tokens at positions `start..` of each of `seq_ids`."""

    request_id: int
    seq_ids: tuple[int, ...]
    start: int
    num_tokens: int
    decode: bool  # one token after the whole sequence is cached (else a prompt chunk or a recompute)
    samples: bool  # the step produces each sequence's next token
    num_generated: int  # tokens the request had generated before this step
    fork_into: tuple[int, ...] = ()  # first token: the other samples / beams, forked after the step

    @property
    def tokens(self) -> int:
        """Tokens this item puts through the model (the step's budget counts these)."""
        return self.num_tokens * len(self.seq_ids)


class _DecodeItem:
    """`_DecodeItem(request_id, seq_ids, start, num_generated)` is `ScheduledItem(request_id=...,
    seq_ids=..., start=..., num_tokens=1, decode=True, samples=True, num_generated=...)` at a fifth
    of the cost of the keyword `__init__` (the simulator makes one per running sequence per step,
    millions a run). The same slots, without the frozen dataclass's `__setattr__` (which every store
    would go through): `__init__` stores them directly, then makes the object the `ScheduledItem` it
    is (`__class__` assignment, allowed between classes of one slot layout)."""

    __slots__ = ScheduledItem.__slots__

    def __init__(self, request_id: int, seq_ids: tuple[int, ...], start: int, num_generated: int) -> None:
        self.request_id = request_id
        self.seq_ids = seq_ids
        self.start = start
        self.num_tokens = 1
        self.decode = True
        self.samples = True
        self.num_generated = num_generated
        self.fork_into = ()
        self.__class__ = ScheduledItem  # type: ignore[assignment]


_decode_item: Callable[[int, tuple[int, ...], int, int], ScheduledItem] = _DecodeItem  # type: ignore[assignment]


@dataclass(frozen=True, kw_only=True, slots=True)
class StepPlan:
    """What the runner executes: the step's index, its phase and its items (oldest request first)."""

    step: int
    phase: Phase
    items: tuple[ScheduledItem, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class StepOutcome:
    """What the runner reports: how long the step took (seconds) and which sequences ended; with
    speculative decoding, `emitted`: the tokens each speculative decode emitted, by request id."""

    duration_s: float
    finished: frozenset[int] = frozenset()
    emitted: dict[int, int] | None = None


class Runner(Protocol):
    """What executes a scheduled step: the engine's model runner, or the simulator's cost model."""

    def execute(self, plan: StepPlan) -> StepOutcome:
        """Run one step: its duration in seconds and the sequences that finished."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StepLog:
    """One step as scheduled and run. Times are the scheduler's clock (seconds from the start)."""

    step: int
    phase: Phase
    start_s: float
    duration_s: float
    items: tuple[ScheduledItem, ...]
    admitted: tuple[int, ...]  # requests that entered the running set this step (first time or after preemption)
    preempted: tuple[int, ...]  # requests preempted to make room for this step, in order
    finished: tuple[int, ...]  # requests that finished at the end of this step
    num_running: int  # requests after the step
    num_waiting: int
    free_blocks: int  # after the step

    @property
    def batch(self) -> int:
        """Sequences that ran in the step."""
        return sum(len(i.seq_ids) for i in self.items)

    @property
    def prefill_tokens(self) -> int:
        return sum(i.tokens for i in self.items if not i.decode)

    @property
    def decode_tokens(self) -> int:
        return sum(i.tokens for i in self.items if i.decode)

    def decision(self) -> tuple:
        """Everything the scheduler decided, without the times: equal for two schedulers that made
        the same choices (request ids, token counts, phases, admissions, preemptions)."""
        items = tuple((i.request_id, len(i.seq_ids), i.start, i.num_tokens, i.decode) for i in self.items)
        return (self.step, self.phase, items, self.admitted, self.preempted, self.finished)


@dataclass(kw_only=True, eq=False)  # identity: membership and removal compare objects, not every field
class RequestState:
    """A request as the scheduler tracks it (times on the scheduler's clock).

    `seq_ids`: its live sequences (all samples / beams once forked; before the first token, the
    first id computes the prompt and the others are forked from it after). `num_tokens`: tokens each
    live sequence holds (prompt + generated); `num_computed`: of them, how many are in the cache.
    Each token's time is in the step log: the end of the step whose item for the request samples.
    """

    request_id: int
    prompt_len: int
    max_new_tokens: int
    width: int = 1
    arrival_s: float = 0.0
    prompt: tuple[int, ...] | None = None  # token ids (needed only for prefix sharing)
    seq_ids: list[int] = field(default_factory=list)
    num_tokens: int = 0
    num_computed: int = 0
    num_generated: int = 0
    forked: bool = False  # seq_ids[1:] are in the cache
    preemptions: int = 0
    scheduled_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    # `seq_ids` as a tuple, the one every decode item of the request shares (set by the scheduler
    # whenever seq_ids changes): one tuple per request instead of one per request per step.
    seq_tuple: tuple[int, ...] = field(default=(), init=False, repr=False)
    # Progress (num_tokens) at the last preemption, to tell thrash from progress.
    preempted_at: int | None = None
    # Blocks promised at admission for the rest of its prefill / recompute, not yet taken.
    promised: int = 0

    @property
    def target(self) -> int:
        """Tokens to have in the cache before decoding: the prompt (its last token's logits give the
        first token), or after a preemption all tokens but the last (fed by the next decode)."""
        return self.prompt_len if self.num_generated == 0 else self.num_tokens - 1

    @property
    def decoding(self) -> bool:
        return self.forked and self.num_computed == self.num_tokens - 1 and self.num_generated > 0

    @property
    def max_len(self) -> int:
        return self.prompt_len + self.max_new_tokens

    @property
    def max_cached(self) -> int:
        """The most slots a sequence of it holds: its last token is never fed back."""
        return self.max_len - 1

    def cached_seq_ids(self) -> list[int]:
        """The request's sequences that hold cache: all of them once forked, else the first (which computes
        the prompt)."""
        return self.seq_ids if self.forked else self.seq_ids[:1]


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    """`max_batch`: most sequences running at once (None: no cap). `max_batched_tokens`: tokens per
    step (None: no cap; required with `chunked_prefill`). `watermark`: share of the pool kept free at
    admission (and at least one block per running sequence). `speculative`: each decode a cycle of
    `num_draft_tokens` drafts (`llmperf.serving.speculative`; the runner reports the tokens each
    emitted, `StepOutcome.emitted`; None: one token a decode, as without it)."""

    policy: str = "continuous"
    max_batch: int | None = None
    max_batched_tokens: int | None = None
    chunked_prefill: bool = False
    prefix_sharing: bool = False
    watermark: float = 0.01
    speculative: SpeculativeConfig | None = None  # each decode a speculative cycle of k draft tokens

    def __post_init__(self) -> None:
        spec = self.speculative
        if spec is not None and (not is_count(getattr(spec, "num_draft_tokens", None)) or spec.num_draft_tokens < 1):
            raise ValueError(f"speculative: must be None or a config with num_draft_tokens >= 1, got {spec!r}")
        if self.policy not in POLICIES:
            raise ValueError(f"policy: must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        for name in ("max_batch", "max_batched_tokens"):
            v = getattr(self, name)
            if v is not None and (not is_count(v) or v < 1):
                raise ValueError(f"{name}: must be None or a positive integer, got {v!r}")
        if self.chunked_prefill and self.max_batched_tokens is None:
            raise ValueError("max_batched_tokens: chunked_prefill needs a per-step token budget, got None")
        if isinstance(self.watermark, bool) or not isinstance(self.watermark, (int, float)) \
                or not 0 <= self.watermark < 1:
            raise ValueError(f"watermark: must be in [0, 1), got {self.watermark!r}")


def _one_sequence_decodes(running: list[RequestState], i: int, budget: float) -> list[RequestState]:
    """`running[i]` and the requests right after it that decode one sequence, as many as `budget`
    tokens take (one each)."""
    stop = len(running) if budget >= len(running) - i else i + math.floor(budget)
    j = i + 1
    while j < stop:
        r = running[j]
        if not (r.forked and r.num_generated > 0 and r.num_computed == r.num_tokens - 1 and len(r.seq_ids) == 1):
            break
        j += 1
    return running[i:j]


class Scheduler:
    """Waiting and running requests over one `KVSpace`; `step()` schedules and runs one step."""

    def __init__(self, kv: KVSpace, runner: Runner, config: SchedulerConfig | None = None) -> None:
        self.kv, self.runner = kv, runner
        self.config = config or SchedulerConfig()
        if self.config.prefix_sharing and not getattr(kv, "supports_prefix_sharing", False):
            raise ValueError(f"prefix_sharing: needs a paged cache, got {type(kv).__name__}")
        self.waiting: deque[RequestState] = deque()
        self.running: list[RequestState] = []  # oldest admitted first
        self._num_seqs = 0  # sequences of the running requests, kept as they join and leave
        self.finished: list[RequestState] = []
        self.log: list[StepLog] = []
        self.now = 0.0
        self._ids = itertools.count()
        self._watermark_blocks = math.ceil(self.config.watermark * kv.num_blocks) if kv.paged else 0
        spec = self.config.speculative
        self._spec_k = spec.num_draft_tokens if spec is not None else 0  # 0: plain decoding

    # ---- requests --------------------------------------------------------------------------------
    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def worst_case_blocks(self, r: RequestState) -> int:
        """Blocks `r` needs alone at its longest: the prompt's full blocks once, and every sequence's
        own blocks past them (contiguous: a row per sequence)."""
        full = self.kv.blocks_for(r.max_cached)
        if self.kv.fork_cost:
            return full + (r.width - 1) * self.kv.fork_cost * full
        return full + (r.width - 1) * (full - self._shared_blocks(r.prompt_len))

    def check(self, r: RequestState) -> None:
        """Refuse (ValueError) a request that could never run, before anything is allocated."""
        if r.prompt_len < 1:
            raise ValueError(f"prompt: request {r.request_id} has no tokens")
        if r.prompt is not None and len(r.prompt) != r.prompt_len:
            raise ValueError(f"prompt: request {r.request_id} has {len(r.prompt)} tokens but prompt_len={r.prompt_len}")
        if r.max_cached > self.kv.max_seq_len:
            raise ValueError(f"max_new_tokens: request {r.request_id} needs {r.prompt_len} prompt + "
                             f"{r.max_new_tokens} new tokens, i.e. {r.max_cached} cached positions (the last "
                             f"token is never fed back), more than the {self.kv.max_seq_len} the cache holds")
        if self.config.max_batch is not None and r.width > self.config.max_batch:
            raise ValueError(f"max_batch: request {r.request_id} runs {r.width} sequences at once, more than "
                             f"max_batch={self.config.max_batch}")
        need = self.worst_case_blocks(r)
        if need > self.kv.num_blocks:
            raise ValueError(f"max_new_tokens: request {r.request_id} ({r.prompt_len} prompt + {r.max_new_tokens} "
                             f"new tokens, {r.width} sequences) needs up to {need} blocks of {self.kv.block_size} "
                             f"tokens alone; the cache has {self.kv.num_blocks}")
        budget = self.config.max_batched_tokens
        if budget is not None and not self.config.chunked_prefill and r.prompt_len > budget:
            raise ValueError(f"max_batched_tokens: request {r.request_id}'s {r.prompt_len}-token prompt exceeds "
                             f"the per-step budget of {budget} (enable chunked_prefill or raise the budget)")
        if budget is not None and r.width > budget:
            raise ValueError(f"max_batched_tokens: request {r.request_id} decodes {r.width} sequences per step, "
                             f"more than the per-step budget of {budget}")
        if self._spec_k:
            if r.width > 1:
                raise ValueError(f"speculative: request {r.request_id} runs {r.width} sequences; speculative "
                                 "decoding is scheduled for one sequence a request")
            verify = self.config.speculative.verify_tokens(self._spec_k)
            if budget is not None and verify > budget:
                raise ValueError(f"max_batched_tokens: a speculative cycle of {self._spec_k} draft tokens puts "
                                 f"{verify} tokens through the target, more than the per-step budget of {budget}")

    def add(self, r: RequestState) -> RequestState:
        """Queue a request (checked first). Its sequence ids are assigned here."""
        self.check(r)
        r.seq_ids = [next(self._ids) for _ in range(r.width)]
        r.seq_tuple = tuple(r.seq_ids)
        r.num_tokens, r.num_computed, r.num_generated, r.forked = r.prompt_len, 0, 0, r.width == 1
        self.waiting.append(r)
        return r

    # ---- helpers ---------------------------------------------------------------------------------
    def _running_seqs(self) -> int:
        """Sequences of the running requests (a count kept as requests and sequences come and go:
        asked every step, and the sum over the running requests took 5 us at 256 of them)."""
        return self._num_seqs

    def _headroom(self, extra_seqs: int) -> int:
        if not self.kv.paged:
            return 0
        return max(self._watermark_blocks, self._running_seqs() + extra_seqs)

    def _prefill_cost(self, r: RequestState, shared: int) -> int:
        """Blocks `r` takes from admission (with `shared` prefix tokens already cached) until its
        prefill or recompute is done: the prompt's blocks once, each other sequence's own blocks
        past the prompt's full blocks (contiguous: a row per sequence)."""
        n = len(r.seq_ids)
        first = self.kv.blocks_for(r.target) - self._shared_blocks(shared)
        if self.kv.fork_cost:
            return first + self.kv.fork_cost * (n - 1)
        return first + (n - 1) * (self.kv.blocks_for(r.target) - self._shared_blocks(r.prompt_len))

    def _shared_blocks(self, num_tokens: int) -> int:
        """Blocks of a `num_tokens`-token prefix that a sequence continuing from it still holds."""
        shared_blocks = getattr(self.kv, "shared_blocks", None)
        return num_tokens // self.kv.block_size if shared_blocks is None else shared_blocks(num_tokens)

    def _promised(self) -> int:
        return sum(r.promised for r in self.running)

    def _preempt(self, r: RequestState, preempted: list[int]) -> None:
        for s in r.cached_seq_ids():
            self.kv.free(s)
        r.promised = 0
        r.num_computed = 0
        r.forked = len(r.seq_ids) == 1
        r.preemptions += 1
        r.preempted_at = r.num_tokens
        self.running.remove(r)
        self._num_seqs -= len(r.seq_ids)
        self.waiting.appendleft(r)  # to the front: it is recomputed first when room returns
        preempted.append(r.request_id)

    def _reserve(self, r: RequestState, n: int, preempted: list[int]) -> bool:
        """Reserve `n` more slots for each cached sequence of the running request `r`, preempting the
        newest running request while blocks are short. False when `r` itself was preempted."""
        for s in r.cached_seq_ids():
            while not self.kv.reserve(s, n):
                victim = self.running[-1]
                if victim is r and len(self.running) == 1:
                    raise RuntimeError(
                        f"request {r.request_id} alone needs {self.kv.reserve_cost(s, n)} more blocks for sequence "
                        f"{s} at {self.kv.seq_len(s)} tokens, but only {self.kv.num_free_blocks} of "
                        f"{self.kv.num_blocks} are free and no other request holds any")
                self._preempt(victim, preempted)
                if victim is r:
                    return False
        return True

    def _chunk(self, r: RequestState, budget: float) -> int:
        """Tokens per sequence of `r`'s next prefill / recompute chunk within `budget` tokens."""
        stop = r.target if r.forked else min(r.target, r.prompt_len)  # fork at the prompt's end
        left = stop - r.num_computed
        nseq = len(r.cached_seq_ids())
        if not self.config.chunked_prefill:
            if left * nseq <= budget:
                return left
            # A recompute holds the prompt and the tokens generated before the preemption, and may
            # outgrow the budget its prompt fitted: it runs alone, in a step of its own, rather than
            # block the queue for ever.
            return left if r.num_generated > 0 and budget == self.config.max_batched_tokens else 0
        return int(min(left, budget // nseq))

    def _item(self, r: RequestState, start: int, n: int) -> ScheduledItem:
        seqs = r.cached_seq_ids()
        end = start + n
        decoding = r.decoding
        samples = (r.num_generated == 0 and end == r.prompt_len) or decoding
        fork_into = tuple(r.seq_ids[1:]) if not r.forked and end == r.prompt_len else ()
        return ScheduledItem(request_id=r.request_id, seq_ids=tuple(seqs), start=start, num_tokens=n,
                             decode=decoding, samples=samples, num_generated=r.num_generated, fork_into=fork_into)

    # ---- scheduling ------------------------------------------------------------------------------
    def _schedule_running(self, budget: float, preempted: list[int], decodes: bool
                          ) -> tuple[list[ScheduledItem], list[RequestState], float]:
        """Items for running requests, oldest first: decode tokens (if `decodes`) and continued
        prefill / recompute chunks; with the request of each item."""
        items: list[ScheduledItem] = []
        reqs: list[RequestState] = []
        reserve = self.kv.reserve
        reserve_each = getattr(self.kv, "reserve_each", None)  # a KVSpace may reserve a run of decodes at once
        running = list(self.running)
        spec_k = self._spec_k
        i = 0
        while i < len(running):
            r = running[i]
            i += 1
            # Preempted while an older request made room (a preempted request is not readmitted in
            # the step that preempted it, so its id in `preempted` means it left `running`).
            if preempted and r.request_id in preempted:
                continue
            if r.forked and r.num_generated > 0 and r.num_computed == r.num_tokens - 1:  # r.decoding, inlined
                if not decodes:
                    continue
                if spec_k:
                    budget = self._schedule_cycle(r, spec_k, budget, preempted, items, reqs)
                    continue
                seqs = r.seq_ids
                n = len(seqs)
                if budget < n:
                    continue
                if n == 1 and reserve_each is not None and not preempted:
                    # r and the one-sequence decodes right after it (nearly every running request in a
                    # steady state), as many as the budget takes: their tokens reserved in one call, in
                    # order, as the loop would one by one, up to the first that does not fit.
                    run = _one_sequence_decodes(running, i - 1, budget)
                    k = reserve_each([x.seq_ids[0] for x in run])
                    done = run[:k]
                    items += [_decode_item(x.request_id, x.seq_tuple, x.num_computed, x.num_generated) for x in done]
                    reqs += done
                    budget -= k
                    i += k - 1
                    if k == len(run):
                        continue
                    r = run[k]  # did not fit: preempt to make room, as a lone decode does below
                    i += 1
                    if self._reserve(r, 1, preempted):
                        items.append(_decode_item(r.request_id, r.seq_tuple, r.num_computed, r.num_generated))
                        reqs.append(r)
                        budget -= 1
                    continue
                # One sequence with room in the cache (nearly every decode): reserve it directly.
                if (n == 1 and reserve(seqs[0], 1)) or self._reserve(r, 1, preempted):
                    items.append(_decode_item(r.request_id, r.seq_tuple, r.num_computed, r.num_generated))
                    reqs.append(r)
                    budget -= n
                continue
            n = self._chunk(r, budget)
            if n <= 0:
                continue
            start, free = r.num_computed, self.kv.num_free_blocks
            if self._reserve(r, n, preempted):
                items.append(self._item(r, start, n))
                reqs.append(r)
                budget -= n * len(r.cached_seq_ids())
                r.promised = max(0, r.promised - (free - self.kv.num_free_blocks))
        if preempted:  # a request preempted after it was scheduled in this loop gave its slots back: drop it
            gone = set(preempted)
            keep = [k for k, i in enumerate(items) if i.request_id not in gone]
            items, reqs = [items[k] for k in keep], [reqs[k] for k in keep]
        return items, reqs, budget

    def _schedule_cycle(self, r: RequestState, k: int, budget: float, preempted: list[int],
                        items: list[ScheduledItem], reqs: list[RequestState]) -> float:
        """A speculative cycle of the decoding request `r` if its tokens fit in `budget`: the last token
        and the drafts of up to `k` draft steps (never more than the request has left to generate, less
        one; a tree's verified tokens) through the target, their slots reserved. The budget left."""
        m = self.config.speculative.verify_tokens(min(k, r.max_new_tokens - r.num_generated - 1))
        if budget < m:
            return budget
        if self._reserve(r, m, preempted):
            items.append(ScheduledItem(request_id=r.request_id, seq_ids=r.seq_tuple, start=r.num_computed,
                                       num_tokens=m, decode=True, samples=True, num_generated=r.num_generated))
            reqs.append(r)
            budget -= m
        return budget

    def _admit(self, budget: float, static_blocked: bool) -> tuple[list[ScheduledItem], list[RequestState]]:
        items: list[ScheduledItem] = []
        admitted: list[RequestState] = []
        if static_blocked or not self.waiting:
            return items, admitted
        seqs = self._running_seqs()
        sharing = self.config.prefix_sharing
        while self.waiting:
            r = self.waiting[0]
            if self.config.max_batch is not None and seqs + len(r.seq_ids) > self.config.max_batch:
                break
            stop = min(r.target, r.prompt_len)
            shared = self.kv.cached_prefix(r.prompt, stop - 1) if sharing and r.prompt is not None else 0
            r.num_computed = shared
            n = self._chunk(r, budget)
            if n <= 0:
                r.num_computed = 0
                break
            # Admit only if the whole prefill / recompute fits beside what running requests were
            # promised, plus the watermark: once admitted, a request is not preempted by its own
            # next chunk.
            cost = self._prefill_cost(r, shared)
            headroom = self._headroom(len(r.seq_ids)) if (self.running or admitted) else 0
            if self.kv.num_free_blocks - self._promised() - cost < headroom:
                r.num_computed = 0
                break
            free = self.kv.num_free_blocks
            ok = self.kv.allocate(r.seq_ids[0], shared + n, prefix=r.prompt if sharing else None)
            assert ok, "the free block count promised room for the first chunk"
            r.promised = max(0, cost - (free - self.kv.num_free_blocks))
            self.waiting.popleft()
            if r.scheduled_s is None:
                r.scheduled_s = self.now
            items.append(self._item(r, shared, n))
            admitted.append(r)
            self.running.append(r)
            self._num_seqs += len(r.seq_ids)
            seqs += len(r.seq_ids)
            budget -= n
        return items, admitted

    def _plan(self) -> tuple[list[ScheduledItem], list[RequestState], list[RequestState], list[int]]:
        """(items, the request of each item, admitted requests, preempted request ids)."""
        budget: float = self.config.max_batched_tokens or math.inf
        preempted: list[int] = []
        static_blocked = self.config.policy == "static" and bool(self.running)
        if self.config.chunked_prefill:
            items, reqs, budget = self._schedule_running(budget, preempted, decodes=True)
            new, admitted = self._admit(budget, static_blocked or bool(preempted))
            return items + new, reqs + admitted, admitted, preempted
        # Prefill first: continued recomputes and admissions; decode only when there are none.
        items, reqs, budget = self._schedule_running(budget, preempted, decodes=False)
        new, admitted = self._admit(budget, static_blocked or bool(preempted))
        if items or new:
            return items + new, reqs + admitted, admitted, preempted
        items, reqs, _ = self._schedule_running(math.inf, preempted, decodes=True)
        return items, reqs, admitted, preempted

    def step(self) -> StepLog | None:
        """Schedule and run one step; None when nothing can run now."""
        if not self.running and not self.waiting:
            return None
        items, reqs, admitted, preempted = self._plan()
        if not items:
            if not self.running and self.waiting:
                r = self.waiting[0]
                raise RuntimeError(f"request {r.request_id} ({r.prompt_len} prompt tokens, {len(r.seq_ids)} "
                                   f"sequences) cannot start in an empty cache of {self.kv.num_blocks} blocks "
                                   f"({self.kv.num_free_blocks} free)")
            return None
        decode = [i.decode for i in items]
        phase = Phase.decode if all(decode) else Phase.prefill if not any(decode) else Phase.mixed
        plan = StepPlan(step=len(self.log), phase=phase, items=tuple(items))
        outcome = self.runner.execute(plan)
        start = self.now
        self.now += outcome.duration_s
        finished = self._advance(plan.items, reqs, outcome)
        log = StepLog(step=plan.step, phase=phase, start_s=start, duration_s=outcome.duration_s, items=plan.items,
                      admitted=tuple(r.request_id for r in admitted), preempted=tuple(preempted),
                      finished=tuple(finished), num_running=len(self.running), num_waiting=len(self.waiting),
                      free_blocks=self.kv.num_free_blocks)
        self.log.append(log)
        return log

    def _advance(self, items: Sequence[ScheduledItem], reqs: list[RequestState], outcome: StepOutcome) -> list[int]:
        """Record what the step did to each item's request (`reqs[k]` is `items[k]`'s); the ids of
        the requests that finished."""
        done: list[int] = []
        fin = outcome.finished
        sharing = self.config.prefix_sharing
        now = self.now
        emitted = outcome.emitted
        if self._spec_k and emitted is None and any(item.decode for item in items):
            raise RuntimeError("runner: with speculative decoding a runner reports the tokens each cycle "
                               "emitted (StepOutcome.emitted)")
        for item, r in zip(items, reqs):
            if item.decode:
                if emitted is None:
                    # The general rule below, for a decode token: it reaches the target (all tokens but
                    # the last), forks and publishes nothing (it is past the prompt), samples a token,
                    # and the first token came earlier (num_generated > 0 to be decoding).
                    r.num_computed = item.start + item.num_tokens
                    r.promised = 0
                    r.num_tokens += 1
                    r.num_generated += 1
                else:  # a speculative cycle: n tokens, the last token and n - 1 accepted drafts now cached
                    n = emitted[r.request_id]
                    r.num_computed = item.start + n
                    r.promised = 0
                    r.num_tokens += n
                    r.num_generated += n
                    if n < item.num_tokens:  # the rejected drafts' slots go back
                        for s in item.seq_ids:
                            self.kv.truncate(s, r.num_computed)
            else:
                r.num_computed = item.start + item.num_tokens
                if r.num_computed >= r.target:
                    r.promised = 0
                if item.fork_into:
                    for child in item.fork_into:
                        self.kv.fork(r.seq_ids[0], child)
                    r.forked = True
                if sharing and r.prompt is not None and item.start < r.prompt_len:
                    self.kv.publish(r.seq_ids[0], r.prompt, min(r.num_computed, r.prompt_len))
                if item.samples:
                    r.num_tokens += 1
                    r.num_generated += 1
                    if r.first_token_s is None:
                        r.first_token_s = now
            if not fin or fin.isdisjoint(r.seq_ids):
                continue
            ended = [s for s in r.seq_ids if s in fin]
            for s in ended:
                if s in r.cached_seq_ids():
                    self.kv.free(s)
                r.seq_ids.remove(s)
                self._num_seqs -= 1
            r.seq_tuple = tuple(r.seq_ids)
            if not r.seq_ids:
                r.finish_s = now
                self.running.remove(r)
                self.finished.append(r)
                done.append(r.request_id)
        return done

    # ---- a whole workload ------------------------------------------------------------------------
    def run(self, requests: Iterable[RequestState], *, wait: Callable[[float], None] | None = None,
            on_step: Callable[[StepLog], None] | None = None,
            clock: Callable[[], float] | None = None) -> list[RequestState]:
        """Serve `requests` (each admitted once the clock reaches its `arrival_s`) to completion.
        Every request is checked before any is queued. When nothing can run, the clock jumps to the
        next arrival (`wait(seconds)` is called first, if given). `on_step(log)` is called after
        every step. Returns the requests, finished.

        `clock()`: seconds since the start on a real clock (a real-time engine). Before every step the
        scheduler's clock catches up with it, so requests are admitted when they really arrived: the
        loop's own time between steps (planning, bookkeeping, a sleep that overshoots) is not in any
        step's duration, and without this the scheduler's clock fell behind the wall clock (0.24 s
        over a 45 s, 1,055-step run on the 2-core CPU) and every admission came that much late.
        Without `clock` (the simulator) the clock is the sum of step durations and waits."""
        reqs = list(requests)
        for r in reqs:
            self.check(r)
        self.serve(deque(sorted(reqs, key=lambda r: r.arrival_s)), wait=wait, on_step=on_step, clock=clock)
        return reqs

    def serve(self, pending: deque[RequestState], *, wait: Callable[[float], None] | None = None,
              on_step: Callable[[StepLog], None] | None = None, clock: Callable[[], float] | None = None,
              until: float | None = None) -> bool:
        """`run`'s loop over `pending` (checked requests, by arrival; consumed as they are queued).
        With `until`: stop at the top of the first iteration whose clock has reached it, before
        queuing anything (False; calling again goes on exactly as if it had not stopped). True: the
        loop is over. So a run of some requests paused at the arrival of a later one is, to that
        point, the run with the later one too (the simulator resumes a longer run from it)."""
        while pending or self.has_unfinished:
            if clock is not None:
                self.now = max(self.now, clock())
            if until is not None and self.now >= until:
                return False
            while pending and pending[0].arrival_s <= self.now:
                self.add(pending.popleft())
            log = self.step()
            if log is not None and on_step is not None:
                on_step(log)
            if log is None:
                if not pending:
                    break
                gap = pending[0].arrival_s - self.now
                if wait is not None and gap > 0:
                    wait(gap)
                self.now = max(self.now, pending[0].arrival_s)
        return True

    def release(self) -> None:
        """Free every sequence still in the cache and forget all requests (after a failure)."""
        for r in self.running:
            for s in r.cached_seq_ids():
                self.kv.free(s)
        self.running.clear()
        self._num_seqs = 0
        self.waiting.clear()


__all__ = ["POLICIES", "KVSpace", "RequestState", "Runner", "ScheduledItem", "Scheduler", "SchedulerConfig",
           "StepLog", "StepOutcome", "StepPlan"]
