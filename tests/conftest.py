"""Shared fixtures: small model and device specs that need no built-in data."""

from __future__ import annotations

import os

import pytest


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


# Triton's `@triton.jit` reads TRITON_INTERPRET when a kernel module is imported, so it must be set
# before any test module (or a library it imports) pulls in `kernels`: without a GPU the kernels run
# in Triton's CPU interpreter.
if not _cuda_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
else:  # the tests check values: one launchable config per kernel, not the autotuner's whole space
    os.environ.setdefault("LLMPERF_TRITON_AUTOTUNE", "0")

# The CLI draws its tables as wide as COLUMNS says, else 150 columns when piped (llmperf.cli.clitools). pytest-xdist's
# workers inherit COLUMNS=80, which wraps the tables the CLI tests read; every run draws them as a serial run does.
os.environ.pop("COLUMNS", None)

# The shared checks the families' test modules take (their test functions too) report a failing assert's values,
# as a test module's own asserts do: pytest rewrites them, under each name they are imported by.
pytest.register_assert_rewrite("model_checks", "tests.analysis.model_checks", "checkpoints")

from hypothesis import HealthCheck, settings

from llmperf.specs import HardwareSpec, ModelSpec

from suite_markers import NEEDS, SLOW

# No test depends on how fast or busy the machine is: hypothesis's per-example deadline (200 ms) and
# its "too slow" health check are timings, so they are off for every property test, including one
# that forgets its own `deadline=None`. The suite is also the same on every run: "llmperf" draws each
# test's examples from a fixed seed (a red CI run is the code's, never the draw's); "explore"
# (HYPOTHESIS_PROFILE=explore) draws new ones each run and keeps failures in .hypothesis/ to replay.
settings.register_profile("llmperf", deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True,
                          database=None)
settings.register_profile("explore", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "llmperf"))


# ---- markers: `-m "not slow"` is the quick loop; `gpu` and `avx512` name what a test needs -------------

def pytest_collection_modifyitems(config, items):  # noqa: ANN001, ARG001
    """Mark `slow` the tests in SLOW (tests/suite_markers.py), and `gpu` / `avx512` those whose skip
    condition is that hardware (`llmperf.engine.cpu`'s kernels need AVX-512; AMX tests are a subset), so
    `-m "not avx512"` runs what an AVX2-only CPU runs and `-m gpu` what only a CUDA device runs."""
    for item in items:
        test = item.nodeid.split("[", 1)[0]
        if any(test == s or test.startswith(s + "::") or (s.endswith("/") and test.startswith(s)) for s in SLOW):
            item.add_marker(pytest.mark.slow)
        reasons = [str(m.kwargs.get("reason", "")) for m in item.iter_markers("skipif")]
        for marker, needles in NEEDS.items():
            if any(n in r for r in reasons for n in needles):
                item.add_marker(getattr(pytest.mark, marker))


@pytest.fixture(params=[0o022, 0o077], ids=["umask022", "umask077"])
def umask(request):  # noqa: ANN001, ANN201
    """Run the test under umask 022, then 077 (the modes of what llmperf writes follow it)."""
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):  # noqa: ANN001, ANN201
    """An empty llmperf cache folder for one test (`LLMPERF_CACHE_DIR`: no calibration in it), created
    only when llmperf writes to it. The CPU kernels the suite's cache already compiled are linked in,
    so an engine run here does not compile them again (seconds); nothing else is shared."""
    from llmperf.outputs import cache_dir

    suite = cache_dir()
    fresh = tmp_path / "llmperf-cache"
    compiled = sorted(suite.glob("cpu_kernels-*.so")) if suite.is_dir() else []
    if compiled:
        fresh.mkdir()
        for lib in compiled:
            (fresh / lib.name).symlink_to(lib)
    monkeypatch.setenv("LLMPERF_CACHE_DIR", str(fresh))
    return fresh


@pytest.fixture
def tiny_llama() -> ModelSpec:
    return ModelSpec(name="tiny-llama", vocab_size=256, hidden_size=64, num_layers=2, num_heads=4,
                     num_kv_heads=2, ffn_size=128, max_positions=256)


@pytest.fixture
def llama2_7b() -> ModelSpec:
    """Llama-2-7B built in code (the public config), independent of the YAML data."""
    return ModelSpec(name="llama-2-7b-code", vocab_size=32000, hidden_size=4096, num_layers=32,
                     num_heads=32, num_kv_heads=32, ffn_size=11008, max_positions=4096)


@pytest.fixture(scope="session")
def a100() -> HardwareSpec:
    return HardwareSpec(name="a100-test", peak_tflops={"fp32": 19.5, "fp16": 312, "bf16": 312, "int8": 624},
                        memory_bandwidth_gbps=2039, memory_gib=80, interconnect_gbps=300, num_sms=108,
                        sram_per_sm_kib=192, l2_cache_mib=40)
