"""Batching: which requests run in each step, bounded by the KV cache.

Two policies (Yu et al. 2022, "Orca: A Distributed Serving System for Transformer-Based Generative
Models", OSDI, for iteration-level scheduling; vLLM's scheduler for the cache-bounded admission):

- `static`: a batch is admitted only when the previous one has completely finished; short requests
  wait for the longest one of their batch.
- `continuous` (in-flight): at every step finished requests leave and waiting ones join, as long as
  the cache has room for their prompts (and `max_batch` sequences are not exceeded).

Each step is a prefill step (if requests were admitted: their prompts run, they get their first
token) or else a decode step (one token for every running sequence). Before a decode step every
running sequence reserves its next slot; when the cache is out of blocks the newest running request
is preempted: its blocks are freed and it goes back to the front of the queue, to be recomputed from
its tokens when room returns (vLLM's recompute preemption). A shortage therefore never writes a
sequence out of place; it costs recomputation. A request that cannot fit in an empty cache is an
error (`RuntimeError`), not a hang.

Every step is logged as a `StepStats` with the cache's `CacheUsage` after it (reserved vs used bytes).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence as Seq
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llmperf.engine.cache import CacheUsage, PagedKVCache
from llmperf.engine.runner import ModelRunner
from llmperf.engine.sequence import RequestOutput, SequenceGroup

if TYPE_CHECKING:
    import pandas as pd

POLICIES = ("continuous", "static")


@dataclass(frozen=True, kw_only=True)
class StepStats:
    """One scheduler step. `time_s`: when it ended, from the start of the run; `batch`: sequences
    forwarded; `num_running` / `num_waiting`: requests after the step; `usage`: the cache after it."""

    step: int
    phase: str
    time_s: float
    seconds: float
    batch: int
    num_running: int
    num_waiting: int
    num_preempted: int
    usage: CacheUsage


class Scheduler:
    """Queues of `SequenceGroup`s over one model runner and its cache; `step()` runs one step."""

    def __init__(self, runner: ModelRunner, *, policy: str = "continuous", max_batch: int | None = None,
                 watermark: float = 0.01, clock: Callable[[], float] = time.perf_counter) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy: must be one of {', '.join(POLICIES)}, got {policy!r}")
        if max_batch is not None and (isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1):
            raise ValueError(f"max_batch: must be None or a positive integer, got {max_batch!r}")
        if not 0 <= watermark < 1:
            raise ValueError(f"watermark: must be in [0, 1), got {watermark!r}")
        self.runner, self.cache = runner, runner.cache
        self.policy, self.max_batch, self.clock = policy, max_batch, clock
        # Blocks kept free at admission so running sequences can grow without preempting the newcomer.
        self._headroom = int(watermark * self.cache.manager.num_blocks) if isinstance(self.cache, PagedKVCache) else 0
        self.waiting: deque[SequenceGroup] = deque()
        self.running: list[SequenceGroup] = []
        self.stats: list[StepStats] = []
        self._start = clock()

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, group: SequenceGroup) -> None:
        max_len = min(self.cache.max_seq_len, self.runner.model.spec.max_positions)
        if group.max_len > max_len:
            raise ValueError(f"max_new_tokens: request {group.request_id} needs {len(group.prompt)} prompt + "
                             f"{group.params.max_new_tokens} new tokens, more than the {max_len} positions "
                             "the cache and model hold")
        self.waiting.append(group)

    # ---- admission -------------------------------------------------------------------------------
    def _running_seqs(self) -> int:
        return sum(len(g.seqs) for g in self.running)

    def _admit(self) -> list[SequenceGroup]:
        if self.policy == "static" and self.running:
            return []
        admitted: list[SequenceGroup] = []
        seqs = self._running_seqs()
        while self.waiting:
            g = self.waiting[0]
            fresh = not g.prefilled
            width = g.width if fresh else len(g.seqs)
            if self.max_batch is not None and seqs + width > self.max_batch:
                break
            lengths = [len(g.prompt)] if fresh else [len(s.tokens) - 1 for s in g.seqs]
            headroom = self._headroom if (self.running or admitted) else 0
            if not self.cache.can_allocate(lengths, forks=width - len(lengths), headroom=headroom):
                break
            for seq, n in zip(g.seqs, lengths):
                ok = self.cache.allocate(seq.seq_id, n)
                assert ok, "can_allocate promised room for the prompt"
            self.waiting.popleft()
            if g.metrics.scheduled is None:
                g.metrics.scheduled = self.clock()
            admitted.append(g)
            seqs += width
        if not admitted and not self.running and self.waiting:
            g = self.waiting[0]
            raise RuntimeError(f"request {g.request_id} ({len(g.prompt)} prompt tokens, {g.width} sequences) does "
                               f"not fit in an empty {self.cache.kind} cache (max_batch={self.max_batch}); "
                               "give the cache more blocks / rows")
        return admitted

    # ---- preemption ------------------------------------------------------------------------------
    def _preempt(self, g: SequenceGroup) -> None:
        for seq in g.seqs:
            self.cache.free(seq.seq_id)
        g.needs_prefill = True
        g.metrics.num_preemptions += 1
        self.running.remove(g)
        self.waiting.appendleft(g)

    def _reserve_decode_slots(self) -> int:
        """Reserve every running sequence's next slot, oldest request first; on shortage preempt the
        newest. Returns the number of preemptions."""
        preempted = 0
        for g in list(self.running):
            if g not in self.running:  # preempted while an older one made room
                continue
            for seq in g.seqs:
                while not self.cache.append_slot(seq.seq_id):
                    victim = self.running[-1]
                    if victim is g and len(self.running) == 1:
                        raise RuntimeError(f"request {g.request_id} alone needs more than the whole "
                                           f"{self.cache.kind} cache at {self.cache.seq_len(seq.seq_id)} tokens")
                    self._preempt(victim)
                    preempted += 1
                    if victim is g:
                        break
                if g not in self.running:
                    break
        return preempted

    # ---- one step --------------------------------------------------------------------------------
    def step(self) -> StepStats | None:
        """Run one prefill or decode step; None when there is nothing to do."""
        t0 = self.clock()
        admitted = self._admit()
        preempted = 0
        if admitted:
            phase, batch = "prefill", sum(len(g.seqs) for g in admitted)
            self.runner.prefill(admitted)
            self.running += [g for g in admitted if not g.is_finished]
        elif self.running:
            preempted = self._reserve_decode_slots()
            if not self.running:
                return None
            phase, batch = "decode", self._running_seqs()
            self.runner.decode(self.running)
            self.running = [g for g in self.running if not g.is_finished]
        else:
            return None
        t1 = self.clock()
        stats = StepStats(step=len(self.stats), phase=phase, time_s=t1 - self._start, seconds=t1 - t0, batch=batch,
                          num_running=len(self.running), num_waiting=len(self.waiting), num_preempted=preempted,
                          usage=self.cache.usage())
        self.stats.append(stats)
        return stats

    def run(self, groups: Seq[SequenceGroup], arrivals: Seq[float] | None = None) -> list[SequenceGroup]:
        """Serve `groups` to completion; `arrivals[i]` (seconds from now) is when group i may be
        admitted (wall clock: the loop sleeps when idle). Returns the groups, all finished."""
        self._start = self.clock()
        order = sorted(range(len(groups)), key=lambda i: arrivals[i] if arrivals else 0.0)
        pending = deque((arrivals[i] if arrivals else 0.0, groups[i]) for i in order)
        while pending or self.has_unfinished:
            now = self.clock() - self._start
            while pending and pending[0][0] <= now:
                at, g = pending.popleft()
                g.metrics.arrival = self._start + at
                self.add(g)
            if not self.has_unfinished:
                time.sleep(max(0.0, pending[0][0] - (self.clock() - self._start)))
                continue
            self.step()
        return list(groups)


# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ServeResult:
    """A served workload: per-request outputs and metrics, per-step stats, totals."""

    outputs: list[RequestOutput]
    steps: list[StepStats]
    elapsed_s: float
    policy: str
    cache_kind: str

    @property
    def output_tokens(self) -> int:
        return sum(o.num_generated for o in self.outputs)

    @property
    def throughput_tokens_per_s(self) -> float:
        """Generated tokens per second of wall time, over the whole run."""
        return self.output_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def mean_utilization(self) -> float:
        """Mean over steps of the cache's used / reserved bytes."""
        return sum(s.usage.utilization for s in self.steps) / len(self.steps) if self.steps else 0.0

    @property
    def num_preemptions(self) -> int:
        return sum(s.num_preempted for s in self.steps)

    def requests_frame(self) -> pd.DataFrame:
        """One row per request: lengths, TTFT, TPOT, latency (seconds), preemptions."""
        import pandas as pd
        rows = [dict(request_id=o.request_id, prompt_len=len(o.prompt), output_len=o.num_generated,
                     ttft_s=o.metrics.ttft, tpot_s=o.metrics.tpot, latency_s=o.metrics.latency,
                     queue_s=o.metrics.queue_time, preemptions=o.metrics.num_preemptions,
                     finish_reason=o.completions[0].finish_reason) for o in self.outputs]
        return pd.DataFrame(rows)

    def steps_frame(self) -> pd.DataFrame:
        """One row per step: phase, batch, queue sizes, cache bytes (capacity / reserved / used), utilisation."""
        import pandas as pd
        rows = [dict(step=s.step, phase=s.phase, time_s=s.time_s, seconds=s.seconds, batch=s.batch,
                     num_running=s.num_running, num_waiting=s.num_waiting, num_preempted=s.num_preempted,
                     capacity_bytes=s.usage.capacity_bytes, reserved_bytes=s.usage.reserved_bytes,
                     used_bytes=s.usage.used_bytes, utilization=s.usage.utilization,
                     pool_utilization=s.usage.pool_utilization) for s in self.steps]
        return pd.DataFrame(rows)

    def summary(self) -> dict[str, float]:
        df = self.requests_frame()
        return dict(requests=len(self.outputs), output_tokens=self.output_tokens, elapsed_s=self.elapsed_s,
                    throughput_tokens_per_s=self.throughput_tokens_per_s,
                    ttft_mean_s=float(df["ttft_s"].mean()), ttft_p50_s=float(df["ttft_s"].median()),
                    tpot_mean_s=float(df["tpot_s"].mean()), latency_mean_s=float(df["latency_s"].mean()),
                    mean_utilization=self.mean_utilization, preemptions=self.num_preemptions)
