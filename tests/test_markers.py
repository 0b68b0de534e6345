"""The `slow` list in tests/suite_markers.py names tests that exist (a renamed test would silently rejoin the
quick loop), and the hardware markers follow the skip conditions that name the hardware."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from suite_markers import NEEDS, SLOW

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("entry", SLOW)
def test_every_slow_entry_names_a_test_that_exists(entry):
    path, _, name = entry.partition("::")
    target = ROOT / path
    assert target.exists(), entry
    if name:  # a test function, or a test class (then its first name)
        first = name.split("::")[0]
        defined = rf"^\s*(def |class ){re.escape(first)}\b|^{re.escape(first)} = "
        assert re.search(defined, target.read_text(), re.M), entry


def test_the_hardware_markers_are_registered():
    import tomllib

    markers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert {m.split(":")[0] for m in markers} >= {"slow", *NEEDS}


def test_a_test_skipped_without_avx512_kernels_is_marked(request):
    items = [i for i in request.session.items if "test_cpu_kernels.py::test_flop_counter_counts_what_runs" in i.nodeid]
    if not items:
        pytest.skip("tests/engine/test_cpu_kernels.py is not collected in this run")
    assert items[0].get_closest_marker("avx512") is not None
