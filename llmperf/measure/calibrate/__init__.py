"""`llmperf calibrate`: measure this device's real ceilings and fit the calibrated time model.

One module per job, run in order by `runner.calibrate`:
- `settings`: what to measure (`Settings`); `points`: one measurement each;
- `ceilings`: streaming bandwidth and the GEMM sweep (peak FLOP/s, GEMV bandwidth);
- `attention`: attention as the engine runs it; on CUDA the fused-attention shape sweep;
- `gemm_shapes`: on CUDA, the GEMM shape model's sweep and fit;
- `floors`: a tiny operator's fixed cost per kind; on CUDA a kernel's device floor;
- `operators`: the engine's own per-operator overheads, per backend, dtype and rows;
- `vector_ops`: the engine's vector operators' memory efficiency at size;
- `allreduce`: all-reduce latency and bus bandwidth (nccl-tests' convention);
- `fit`: the efficiency curves; `calibration`: everything measured and the hardware mapping;
- `output`: the calibration YAML.

The method is an empirical roofline toolkit's (Berkeley ERT, Intel Advisor, Nsight Compute's
roofline; see REFERENCE.md): a ceiling is the fastest call observed, every figure keeps the spread
(p90 - p10) of its calls, the efficiencies are fitted on typical (median) calls, and nothing from
`profile`'s configurations is used. Every name below is importable from this package.
"""

from llmperf.measure.calibrate.allreduce import measure_allreduce
from llmperf.measure.calibrate.attention import fit_attention_shapes, measure_attention, measure_attention_shapes
from llmperf.measure.calibrate.calibration import Calibration
from llmperf.measure.calibrate.ceilings import (
    DISTURBED,
    RETRIES,
    ROUND_BELOW_S,
    WORKING_SET_MIN,
    _in_turn,
    _time_steady,
    copies_for,
    gemm_sweep_rows,
    measure_gemm,
    measure_streams,
    measure_torch_gemm,
    sweep_budget_s,
    sweep_fits,
    working_set_for,
)
from llmperf.measure.calibrate.fit import MEMORY_BOUND_SHARE, fit_curves, fit_decode_groups, fit_op_e_memory
from llmperf.measure.calibrate.floors import measure_floors, measure_overheads
from llmperf.measure.calibrate.gemm_shapes import GEMM_SHAPE_NK, GEMM_SHAPE_ROWS, fit_gemm_shapes, measure_gemm_shapes
from llmperf.measure.calibrate.operators import (
    COLD_GEMM,
    FAMILY_DISPATCH,
    MLA_OPS,
    MOE_DISPATCH_OPS,
    NORM_OPS,
    OVERHEAD_DTYPES,
    OVERHEAD_ROWS,
    TINY_MLA_SPEC,
    TINY_MOE_SPEC,
    TINY_NORMS_SPEC,
    TINY_SPEC,
    WEIGHT_OPS,
    dispatch_by_op_spec,
    dispatch_moe_spec,
    dispatch_spec,
    gemm_dispatch_rows,
    in_situ,
    measure_by_op_rows,
    measure_family_dispatch,
    measure_op_overhead_rows,
    measure_op_overheads,
    measure_step_overhead,
    one_call_facts,
    op_overhead_backends,
)
from llmperf.measure.calibrate.output import write_yaml, yaml_text
from llmperf.measure.calibrate.points import AllreducePoint, ComputePoint, StreamPoint
from llmperf.measure.calibrate.runner import calibrate
from llmperf.measure.calibrate.settings import DTYPE_NAMES, VECTOR_KINDS, MiB, Progress, Settings
from llmperf.measure.calibrate.vector_ops import VECTOR_SPEC, measure_op_e_memory

__all__ = [
    "AllreducePoint", "COLD_GEMM", "Calibration", "ComputePoint", "DISTURBED", "DTYPE_NAMES", "FAMILY_DISPATCH",
    "GEMM_SHAPE_NK", "GEMM_SHAPE_ROWS", "MEMORY_BOUND_SHARE", "MLA_OPS", "MOE_DISPATCH_OPS", "MiB", "NORM_OPS",
    "OVERHEAD_DTYPES", "OVERHEAD_ROWS", "Progress", "RETRIES", "ROUND_BELOW_S", "Settings", "StreamPoint",
    "TINY_MLA_SPEC", "TINY_MOE_SPEC", "TINY_NORMS_SPEC", "TINY_SPEC", "VECTOR_KINDS", "VECTOR_SPEC", "WEIGHT_OPS",
    "WORKING_SET_MIN", "_in_turn", "_time_steady", "calibrate", "copies_for", "dispatch_by_op_spec",
    "dispatch_moe_spec", "dispatch_spec", "fit_attention_shapes", "fit_curves", "fit_decode_groups", "fit_gemm_shapes",
    "fit_op_e_memory", "gemm_dispatch_rows", "gemm_sweep_rows", "in_situ", "measure_allreduce", "measure_attention",
    "measure_attention_shapes", "measure_by_op_rows", "measure_family_dispatch", "measure_floors", "measure_gemm",
    "measure_gemm_shapes", "measure_op_e_memory", "measure_op_overhead_rows", "measure_op_overheads",
    "measure_overheads", "measure_step_overhead", "measure_streams", "measure_torch_gemm", "one_call_facts",
    "op_overhead_backends", "sweep_budget_s", "sweep_fits", "working_set_for", "write_yaml", "yaml_text",
]
