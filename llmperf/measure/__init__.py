"""All measuring code in one place (torch): timers, device description, `calibrate`, `profile`, the
kernel benchmark (`python -m llmperf.measure.kernel_bench`) and `time_forward`.

- `timers`: CUDA events / `triton.testing.do_bench` on GPU; a warmed-up median of `perf_counter` on
  CPU with the thread count recorded. Every timing carries its spread, not only the median.
- `device`: what the device is (torch + pynvml on NVIDIA; model, cores, ISA and caches on CPU).
- `calibrate`: this device's real ceilings -> a hardware YAML with a calibrated time model.
- `profile`: per-operator micro-benchmarks and the generation loop, joined with predictions.
- `timing`: one timed engine forward at a chosen `(batch, q_len, kv_len)`.
"""
