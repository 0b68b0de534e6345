"""The engine's side of the shared scheduler: the real model runner driven by `llmperf.serving`.

The scheduling itself (static / continuous batching, chunked prefill with mixed steps, recompute
preemption of the newest request to the front of the queue, the admission watermark, prefix
sharing) is `llmperf.serving.scheduler.Scheduler`, the same object the simulator drives with a
cost-model runner. Here it drives `ModelRunner` over the engine's KV cache (which implements the
scheduler's `KVSpace`), and each step's `StepLog` is joined with the cache's `CacheUsage` after the
step into a `StepStats`.

`run_groups` serves `SequenceGroup`s to completion and always leaves the cache empty: if anything
raises (a bad request, a failure inside a step), every sequence it allocated is freed before the
error propagates, so the engine stays usable.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llmperf.analysis.vocabulary import Phase
from llmperf.engine.cache import CacheUsage, KVCache
from llmperf.engine.instrument import NULL_RECORDER
from llmperf.engine.model import Transformer
from llmperf.engine.runner import ModelRunner
from llmperf.engine.sequence import RequestOutput, SequenceGroup
from llmperf.serving.scheduler import RequestState, Scheduler, SchedulerConfig, StepLog

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True, kw_only=True)
class StepStats:
    """One scheduler step. `time_s`: when it ended, from the start of the run (the scheduler's clock);
    `batch`: sequences forwarded; `num_running` / `num_waiting`: requests after the step; `usage`:
    the cache after it; `log`: the scheduler's record of its decisions."""

    step: int
    phase: Phase
    time_s: float
    seconds: float
    batch: int
    num_running: int
    num_waiting: int
    num_preempted: int
    usage: CacheUsage
    log: StepLog

    @property
    def prefill_tokens(self) -> int:
        return self.log.prefill_tokens

    @property
    def decode_tokens(self) -> int:
        return self.log.decode_tokens


def request_state(g: SequenceGroup, arrival_s: float = 0.0) -> RequestState:
    """The scheduler's view of a group: lengths, width, and the prompt (for prefix sharing)."""
    return RequestState(request_id=g.request_id, prompt_len=len(g.prompt), max_new_tokens=g.params.max_new_tokens,
                        width=g.width, arrival_s=arrival_s, prompt=tuple(g.prompt))


def run_groups(model: Transformer, cache: KVCache, groups: Seq[SequenceGroup], config: SchedulerConfig, *,
               attention: str | None = None, recorder: Any = NULL_RECORDER, arrivals: Seq[float] | None = None,
               realtime: bool = False) -> tuple[list[StepStats], Scheduler]:
    """Serve `groups` to completion on `model` / `cache` with the shared scheduler. `arrivals[i]`:
    seconds after the start when group i may be admitted (`realtime`: the loop sleeps until then;
    else the scheduler's clock jumps). Every request is checked before anything is allocated, and
    the cache is emptied even when something raises."""
    if getattr(config, "speculative", None) is not None:
        raise ValueError("speculative: the engine's serving path does not run speculative decoding through the "
                         "scheduler (llmperf.engine.speculative runs it apart); got a speculative config")
    by_id = {g.request_id: g for g in groups}
    if len(by_id) != len(groups):
        raise ValueError("request_id: the requests' ids must be distinct")
    runner = ModelRunner(model, cache, by_id, attention=attention, recorder=recorder)
    sched = Scheduler(cache, runner, config)
    states = [request_state(g, arrivals[i] if arrivals is not None else 0.0) for i, g in enumerate(groups)]
    for st in states:
        sched.check(st)
    stats: list[StepStats] = []
    t0 = time.perf_counter()
    for g, st in zip(groups, states):
        g.metrics.arrival = t0 + st.arrival_s

    def record(log: StepLog) -> None:
        stats.append(StepStats(step=log.step, phase=log.phase, time_s=log.start_s + log.duration_s,
                               seconds=log.duration_s, batch=log.batch, num_running=log.num_running,
                               num_waiting=log.num_waiting, num_preempted=len(log.preempted),
                               usage=cache.usage(), log=log))

    wait: Callable[[float], None] | None = time.sleep if realtime else None
    clock: Callable[[], float] | None = (lambda: time.perf_counter() - t0) if realtime else None
    try:
        sched.run(states, wait=wait, on_step=record, clock=clock)
    finally:
        sched.release()
        cache.clear()  # anything a failed step left behind
    for g, st in zip(groups, states):
        g.metrics.num_preemptions = st.preemptions
    return stats, sched


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
