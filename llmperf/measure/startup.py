"""Start-up time of the command line: `python -m llmperf.measure.startup [--runs 10] [--cmd "estimate llama-2-7b"]`.

A user who scripts a loop of `llmperf estimate` calls pays the interpreter's start and every import
on each call. This times, in fresh processes, `llmperf estimate llama-2-7b` (through `python -m
llmperf.cli`, the console script's own entry point) side by side with the bare import of the four
libraries the command line cannot do without (numpy, PyYAML, rich, typer): what is left above that
floor is llmperf's own. The two are interleaved run by run, so a load spike on a shared machine
falls on both alike, after one untimed warm-up run each (which writes the bytecode caches, whatever
PYTHONDONTWRITEBYTECODE says in the caller's environment). Prints median, min
and max wall seconds of each and their difference, and the median CPU seconds (user + system) of
the child: on a busy machine the CPU time moves less than the wall time. A benchmark prints figures;
it asserts nothing.
`python -X importtime -m llmperf.cli estimate llama-2-7b` shows where the rest goes.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

BARE_IMPORT = "import numpy, yaml, rich, typer"
COMMAND = ("estimate", "llama-2-7b")


@dataclass(frozen=True, kw_only=True)
class Timing:
    """Wall seconds of the runs of one thing timed, in the order they ran, and the CPU seconds of each (if measured)."""

    what: str
    seconds: tuple[float, ...]
    cpu_seconds: tuple[float, ...] = ()

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    @property
    def min_s(self) -> float:
        return min(self.seconds)

    @property
    def max_s(self) -> float:
        return max(self.seconds)

    @property
    def cpu_median_s(self) -> float:
        return statistics.median(self.cpu_seconds) if self.cpu_seconds else float("nan")


def _child_env() -> dict[str, str]:
    """The children's environment: this one, 120 columns, and bytecode written as a user's Python
    writes it (PYTHONDONTWRITEBYTECODE unset: with it every run would compile llmperf from source,
    80 ms here, which no installed copy pays)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "COLUMNS": "120"}


def _run(argv: Sequence[str]) -> tuple[float, float]:
    """(wall seconds from spawning `argv` to its exit, its CPU seconds); its output is discarded and a
    failure raises naming it."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    done = subprocess.run(list(argv), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_child_env())
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[-300:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def bench(runs: int = 10, command: Sequence[str] = COMMAND, python: str = sys.executable) -> list[Timing]:
    """Time `llmperf COMMAND` and the bare import `runs` times each, interleaved, after one warm-up."""
    cases = {"bare import (numpy, yaml, rich, typer)": [python, "-c", BARE_IMPORT],
             f"llmperf {' '.join(command)}": [python, "-m", "llmperf.cli", *command]}
    for argv in cases.values():
        _run(argv)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    for _ in range(runs):
        for name, argv in cases.items():
            times[name].append(_run(argv))
    return [Timing(what=name, seconds=tuple(w for w, _ in s), cpu_seconds=tuple(c for _, c in s))
            for name, s in times.items()]


def report(timings: Sequence[Timing]) -> str:
    """Each command's median (min .. max) wall time and median CPU time, and the median differences to the
    first."""
    base = timings[0]
    lines = [f"{len(base.seconds)} runs each, interleaved (seconds):"]
    for t in timings:
        extra = "" if t is base else (f"   +{t.median_s - base.median_s:.3f} wall, "
                                      f"+{t.cpu_median_s - base.cpu_median_s:.3f} CPU over the bare import")
        lines.append(f"  {t.what:<42} wall median {t.median_s:.3f} (min {t.min_s:.3f}, max {t.max_s:.3f}), "
                     f"CPU median {t.cpu_median_s:.3f}{extra}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--cmd", default=" ".join(COMMAND), help="the llmperf command line to time")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs: must be >= 1")
    timings = bench(args.runs, args.cmd.split())
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} (a shared machine: wall time moves with it)")
    print(report(timings))


if __name__ == "__main__":
    main()
