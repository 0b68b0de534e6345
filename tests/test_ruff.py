"""The linter holds the whole tree to the rules in pyproject.toml (`[tool.ruff]`: pycodestyle, pyflakes,
import order; lines of 120 characters). `ruff check .` from the repository root shows the same."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Files that were being changed elsewhere when the rules were set, with their findings still open: each
# leaves this list once `ruff check FILE` is clean. Nothing else is excluded.
NOT_YET = (
    "kernels/decode.py",
    "kernels/paged.py",
    "llmperf/engine/attention.py",
    "llmperf/engine/cpu/bench_compile.py",
    "llmperf/engine/generate.py",
    "llmperf/engine/instrument.py",
    "llmperf/engine/model.py",
    "llmperf/engine/rope.py",
    "llmperf/engine/scheduler.py",
    "llmperf/engine/weights.py",
    "llmperf/specs/model.py",
    "tests/engine/checkpoints.py",
    "tests/engine/conftest.py",
    "tests/engine/test_batching.py",
    "tests/engine/test_beam.py",
    "tests/engine/test_cache.py",
    "tests/engine/test_chunked_prefix.py",
    "tests/engine/test_cpu_kernels.py",
    "tests/engine/test_decode_layers.py",
    "tests/engine/test_failures.py",
    "tests/engine/test_generate.py",
    "tests/engine/test_instrument.py",
    "tests/engine/test_math_fields.py",
    "tests/engine/test_mixed_forward.py",
    "tests/engine/test_model.py",
    "tests/engine/test_ops.py",
    "tests/engine/test_paths.py",
    "tests/engine/test_qwen3_gemma.py",
    "tests/engine/test_sampling.py",
    "tests/engine/test_shape.py",
    "tests/engine/test_weights.py",
    "tests/kernels/aot_compile.py",
    "tests/measure/test_profile.py",
    "tests/specs/test_hf_fields.py",
    "tests/specs/test_kvcache_todays.py",
    "tests/specs/test_spec_errors.py",
    "tests/specs/test_spec_fields.py",
    "tests/specs/test_specs.py",
    "tests/specs/test_strict_types.py",
)


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="ruff is not installed (the test extra has it)")
def test_ruff_finds_nothing():
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise",
                           "--extend-exclude", ",".join(NOT_YET), "."], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_file_not_yet_clean_still_exists():
    assert [f for f in NOT_YET if not (ROOT / f).is_file()] == []
