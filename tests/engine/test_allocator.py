"""The CPU engine keeps freed memory (glibc `mallopt`), once per process, and says so; the opt-out
leaves glibc's defaults. Structure only: no timing (each case in a fresh interpreter)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = """
import torch
from llmperf.engine.cpu import allocator
before = allocator.describe()
from llmperf.engine.ops import ops_for
ops_for("cpu", torch.float32)
first = allocator.keep_freed_memory()
print(before, "|", first, "|", allocator.keep_freed_memory(), "|", allocator.describe())
"""


def _run(**env):
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True,
                         env={**os.environ, **env})
    return [part.strip() for part in out.stdout.strip().split("|")]


def test_a_cpu_engine_asks_for_freed_memory_to_be_kept_once():
    before, first, again, line = _run(LLMPERF_KEEP_FREED_MEMORY="1")
    assert before == "not asked yet"
    if first == "not glibc":  # another C library: left alone
        pytest.skip("this Python's C library has no mallopt")
    assert first == again == "kept" and line.startswith("glibc keeps freed memory")


def test_the_opt_out_leaves_glibc_defaults():
    before, first, again, line = _run(LLMPERF_KEEP_FREED_MEMORY="0")
    assert (before, first, again) == ("not asked yet", "off", "off")
    assert line == "glibc defaults (LLMPERF_KEEP_FREED_MEMORY=0)"


def test_the_machine_description_names_it():
    from llmperf.measure.device import describe_cpu

    assert describe_cpu()["allocator"]
