"""Serving: the scheduler and KV block bookkeeping shared by the real engine and the simulator.
No torch (tested): `llmperf.analysis` and the simulator import this package freely.

Modules: `blocks` (paged KV bookkeeping: block pool, per-sequence tables, copy-on-write, prefix
sharing), `scheduler` (static / continuous batching, chunked prefill, recompute preemption; the
`Runner` and `KVSpace` protocols and the scheduler's clock are described in its docstring).
"""

from llmperf.serving.blocks import BlockManager, BlockPool, BlockUsage, SlotResult
from llmperf.serving.scheduler import (
    POLICIES,
    KVSpace,
    RequestState,
    Runner,
    ScheduledItem,
    Scheduler,
    SchedulerConfig,
    StepLog,
    StepOutcome,
    StepPlan,
)

__all__ = ["POLICIES", "BlockManager", "BlockPool", "BlockUsage", "KVSpace", "RequestState", "Runner",
           "ScheduledItem", "Scheduler", "SchedulerConfig", "SlotResult", "StepLog", "StepOutcome", "StepPlan"]
