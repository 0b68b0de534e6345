"""The analytical roofline model (pure Python + numpy; never imports torch).

- `attention_cost`, `ForwardModel`: FLOPs and bytes of each operator at `(batch, q_len, kv_len)`
- `op_time`, `roofline_time_s`: time on a device, `max(flops / peak, bytes / bandwidth)`; every
  operator time goes through `op_time` and its `TimeModel` (default `ROOFLINE`: e = 1, no overhead)
- `rollup`: the one roll-up (phases, closed-form decode, memory, regimes) over arrays of configurations
- `estimate`: a whole generation (TTFT, TPOT, throughput, memory, regimes) -> `GenerationEstimate`,
  a roll-up of one: its `summary()` is the same row `sweep` gives
- `sweep`: thousands of configurations at once -> pandas DataFrame (columns: `schema.COLUMNS`)
"""

from llmperf.analysis.generation import GenerationEstimate, estimate, sum_max_linear
from llmperf.analysis.memory import (
    KVUtilization,
    MemoryEstimate,
    estimate_memory,
    kv_utilization,
    weight_bytes_per_gpu,
)
from llmperf.analysis.operators import ForwardModel, ShardDims, attended_pairs, attention_cost
from llmperf.analysis.phase import PhaseEstimate, estimate_phase
from llmperf.analysis.regimes import RegimeEstimate, estimate_regimes
from llmperf.analysis.rollup import DEFAULT_MAX_BATCHED_TOKENS, Conventions, rollup, sum_max_lines
from llmperf.analysis.roofline import (
    ROOFLINE,
    Efficiency,
    OpCost,
    OpTime,
    RooflineTimeModel,
    TimeModel,
    bound_label,
    op_time,
    roofline_time_s,
)
from llmperf.analysis.sweep import SCHEMA_VERSION, sweep

__all__ = [
    "DEFAULT_MAX_BATCHED_TOKENS", "ROOFLINE", "SCHEMA_VERSION", "Conventions", "Efficiency", "ForwardModel",
    "GenerationEstimate", "KVUtilization", "MemoryEstimate", "OpCost", "OpTime",
    "PhaseEstimate", "RegimeEstimate", "RooflineTimeModel", "ShardDims", "TimeModel", "bound_label", "attended_pairs",
    "attention_cost", "estimate",
    "estimate_memory", "estimate_phase", "estimate_regimes", "kv_utilization", "op_time",
    "rollup", "roofline_time_s", "sum_max_linear", "sum_max_lines", "sweep", "weight_bytes_per_gpu",
]
