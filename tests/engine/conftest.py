"""Engine test fixtures (helpers live in `engine_testing.py`).

TRITON_INTERPRET must be set before `@triton.jit` runs (when the kernel modules are imported), so it
is set here, at conftest import, when no CUDA device is present, as `tests/kernels/conftest.py` does.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from llmperf.specs import ModelSpec  # noqa: E402

from engine_testing import SPECS  # noqa: E402


@pytest.fixture
def llama_spec() -> ModelSpec:
    return SPECS["llama"]()


@pytest.fixture
def gpt2_spec() -> ModelSpec:
    return SPECS["gpt2"]()
