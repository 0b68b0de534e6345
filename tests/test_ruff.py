"""The linter holds the whole tree to the rules in pyproject.toml (`[tool.ruff]`: pycodestyle, pyflakes,
import order; lines of 120 characters). `ruff check .` from the repository root shows the same."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

NOT_YET: tuple[str, ...] = ()  # every file is clean; a file that cannot be yet is listed here, with why


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="ruff is not installed (the test extra has it)")
def test_ruff_finds_nothing():
    exclude = ["--extend-exclude", ",".join(NOT_YET)] if NOT_YET else []
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise",
                           *exclude, "."], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_file_not_yet_clean_still_exists():
    assert [f for f in NOT_YET if not (ROOT / f).is_file()] == []
