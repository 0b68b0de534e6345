"""Everything the engine does only on a CPU, behind the ops seam (`llmperf.engine.ops`):

- `kernels` (+ `kernels.cpp`): llmperf's C++ kernels for a decode step, their build (compiled at
  first use into `$LLMPERF_CACHE_DIR`) and the CPU feature detection (`/proc/cpuinfo`, the
  `LLMPERF_MAX_CPU_ISA` cap that makes this CPU look like an AVX2-only one);
- `ops`: `CpuOps`, the engine's ops on a CPU: which kernel runs each GEMM, the private packed (oneDNN,
  AMX) and transposed copies of the weights, and the decode step's layers in one call;
- `bench_compile`: the decode step on these kernels against torch eager and `torch.compile`.

`llmperf.engine.ops.ops_for` is the one place that picks `CpuOps`; the model imports nothing here.
"""
