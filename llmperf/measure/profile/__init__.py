"""`llmperf profile`: measure a model on this device op by op and step by step, and join every
measurement with its prediction under two time models (roofline and calibrated).

For every configuration (batch x prompt length x generation length): micro-benchmarks of each
operator at the model's real shapes (ops.csv `kind="micro"`), and the engine's whole greedy
generation timed per step and per operator (`kind="generation"`), each joined with
`llmperf.analysis` by (phase, operator, layer kind, batch, q_len, kv_len) through the shared
vocabulary (`llmperf.analysis.vocabulary`).

One module per job:
- `settings`: what to run (`ProfileSettings`); `resolve`: the model (`--layers`) and the memory check;
- `predict`: predicted seconds under both time models (`Predictor`);
- `micro`: the micro-benchmarks; `recording`: one generation, recorded and joined row by row;
- `balance`: a MoE router's choices as each expert-parallel layout's busiest GPU would get them;
- `join`: measured and predicted operators matched, nothing dropped silently;
- `checks`: exact cross-checks of FLOPs, weight bytes and KV bytes against the engine;
- `tables`: the CSV tables and the error summary; `manifest`: `run.json` (`RunManifest`);
- `runner`: `run_profile`, the sweep that writes the run directory (docs/schemas.md).
Every name below is importable from this package.
"""

from llmperf.analysis.vocabulary import Op, Phase
from llmperf.measure.profile.balance import EP_DEGREES, balance_rows, balance_summary, busiest_of
from llmperf.measure.profile.checks import (
    PAGED_BLOCK,
    ROUTED_OPS,
    cross_checks,
    engine_step_weight_bytes,
    matmul_flops,
    step_weight_bytes,
)
from llmperf.measure.profile.join import JOIN_CHECK, join_check, join_report, merge_joins, predicted_names, unmatched
from llmperf.measure.profile.manifest import SCHEMA_VERSION, RunManifest
from llmperf.measure.profile.micro import (
    CACHE_ROTATION_FACTOR,
    MICRO_ATTENTION,
    MICRO_BUDGET_S,
    _attention_micro,
    micro_benchmarks,
    micro_matmuls,
)
from llmperf.measure.profile.predict import Predictor, calibrated_model, own_engine_time_model
from llmperf.measure.profile.recording import (
    Generated,
    Recorded,
    expert_rows,
    experts_summary,
    generation,
    joined_op_rows,
    record_generation,
    summarize,
)
from llmperf.measure.profile.resolve import (
    MEMORY_HEADROOM,
    check_fits,
    keep_layers,
    kept_layer_indices,
    layers_kept,
    memory_needed,
    resolve_spec,
)
from llmperf.measure.profile.runner import ProfileResult, measurement_sources, run_profile
from llmperf.measure.profile.settings import BACKENDS, KV_KINDS, ProfileSettings, Progress
from llmperf.measure.profile.tables import (
    E2E,
    EXPERT_BALANCE_COLUMNS,
    EXPERTS_COLUMNS,
    GENERATIONS_COLUMNS,
    MODEL_LEVEL,
    OPS_COLUMNS,
    STEPS_COLUMNS,
    error_stats,
    errors_table,
    op_row,
)

__all__ = [
    "BACKENDS", "CACHE_ROTATION_FACTOR", "E2E", "EP_DEGREES", "EXPERTS_COLUMNS", "EXPERT_BALANCE_COLUMNS",
    "GENERATIONS_COLUMNS", "Generated", "JOIN_CHECK", "KV_KINDS", "MEMORY_HEADROOM", "MICRO_ATTENTION",
    "MICRO_BUDGET_S", "MODEL_LEVEL", "OPS_COLUMNS", "Op", "PAGED_BLOCK", "Phase", "Predictor", "ProfileResult",
    "ProfileSettings", "Progress", "ROUTED_OPS", "Recorded", "RunManifest", "SCHEMA_VERSION", "STEPS_COLUMNS",
    "_attention_micro", "balance_rows", "balance_summary", "busiest_of", "calibrated_model", "check_fits",
    "cross_checks", "engine_step_weight_bytes", "error_stats", "errors_table", "expert_rows", "experts_summary",
    "generation", "join_check", "join_report", "joined_op_rows", "keep_layers", "kept_layer_indices", "layers_kept",
    "matmul_flops", "measurement_sources", "memory_needed", "merge_joins", "micro_benchmarks", "micro_matmuls",
    "op_row", "own_engine_time_model", "predicted_names", "record_generation", "resolve_spec", "run_profile",
    "step_weight_bytes", "summarize", "unmatched",
]
