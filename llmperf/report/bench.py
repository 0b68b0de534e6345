"""Benchmark: how long a report over a 10,000-configuration sweep takes to build and write.

    python -m llmperf.report.bench [--repeat 3] [--model llama-3.1-8b] [--hardware a100-80gb-sxm]

The sweep is 100 batch sizes x 100 prompt lengths (x 1 generation length) = 10,000 configurations,
all predicted by `llmperf.sweep`; the report draws every figure of an estimate and writes the HTML,
the PNGs and the sweep CSV. Prints the median and the spread (min-max) of each stage over the repeats,
wall-clock, and the process's CPU time: on a shared, loaded machine the wall-clock time is several times
the CPU time, so quote both and say how loaded the machine was.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from llmperf.report import EstimateSpec, build_sections, render, write


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--hardware", default="a100-80gb-sxm")
    args = parser.parse_args(argv)
    spec = EstimateSpec(models=[args.model], hardware=[args.hardware], batch=list(range(1, 101)),
                        prompt_len=[128 * i for i in range(1, 101)], gen_len=[128])
    stages: dict[str, list[float]] = {"estimates and figures": [], "render (PNG + HTML)": [], "write": [], "total": [],
                                   "total CPU time (process)": []}
    rows = 0
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeat):
            c0 = time.process_time()
            t0 = time.perf_counter()
            sections = build_sections(estimate=spec)
            t1 = time.perf_counter()
            rendered = render(sections, title="bench")
            t2 = time.perf_counter()
            write(rendered, Path(tmp) / "bench.html")
            t3 = time.perf_counter()
            stages["total CPU time (process)"].append(time.process_time() - c0)
            rows = len(sections[0].attachments["sweep.csv"])
            for fig in sections[0].figures:
                fig.figure.clear()
            for key, value in zip(list(stages)[:4], (t1 - t0, t2 - t1, t3 - t2, t3 - t0)):
                stages[key].append(value)
    print(f"report over a {rows:,}-configuration sweep ({args.model} on {args.hardware}), {args.repeat} runs:")
    for key, values in stages.items():
        print(f"  {key:<24} median {statistics.median(values):6.2f} s   (min {min(values):.2f}, max {max(values):.2f})")


if __name__ == "__main__":
    main()
