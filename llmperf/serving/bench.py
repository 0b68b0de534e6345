"""Speed of the serving simulator: `python -m llmperf.serving.bench [--requests 10000] [--repeats 3]`.

Simulates N requests of Llama-3.1-8B on an A100-80GB SXM (Poisson arrivals at 20 req/s, close to
the configuration's simulated saturation rate of about 20.5 req/s for these lengths, so batches are
large; log-normal prompt and output lengths, vLLM-style defaults) and prints wall and CPU seconds
per run (median and spread over repeats) with the load average, steps, steps per second and
simulated requests per wall second. A benchmark prints figures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from llmperf.serving.simulator import ServingConfig, simulate, step_cost_model
from llmperf.serving.workload import WorkloadSpec, generate


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10000)
    ap.add_argument("--rate", type=float, default=20.0, help="arrival rate, requests/s")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--hardware", default="a100-80gb-sxm")
    args = ap.parse_args(argv)
    cfg = ServingConfig.build(args.model, args.hardware)
    spec = WorkloadSpec(arrival=f"poisson:{args.rate!r}", prompt_len="lognormal:6:0.8:16:4096",
                        output_len="lognormal:5:0.8:1:1024", num_requests=args.requests, seed=0)
    t = time.perf_counter()
    work = generate(spec)
    gen_s = time.perf_counter() - t
    times, cpu, steps = [], [], 0
    for _ in range(args.repeats):
        cost = step_cost_model(cfg)  # fresh caches each run: the first run pays for them too
        t, c = time.perf_counter(), time.process_time()
        res = simulate(work, cfg, cost=cost)
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
        steps = len(res.steps)
    med = statistics.median(times)
    print(f"{args.requests} requests of {args.model} on {args.hardware} at {args.rate:g} req/s "
          f"(workload drawn in {gen_s:.2f} s)")
    print(f"simulate: median {med:.2f} s over {args.repeats} runs (min {min(times):.2f}, max {max(times):.2f}); "
          f"{steps} steps, {steps / med:,.0f} steps/s, {args.requests / med:,.0f} requests/s")
    print(f"CPU time: median {statistics.median(cpu):.2f} s (min {min(cpu):.2f}, max {max(cpu):.2f}); "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} (a shared machine: wall time moves with it)")
    s = res.summary()
    print(f"simulated: throughput {s['throughput_rps']:.2f} req/s, TTFT p50 {s['ttft_s']['p50'] * 1e3:.1f} ms, "
          f"TPOT p50 {s['tpot_s']['p50'] * 1e3:.2f} ms, mean batch {s['mean_batch']:.1f}")


if __name__ == "__main__":
    main()
