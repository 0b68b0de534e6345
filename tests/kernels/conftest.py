"""Kernel tests: Triton's CPU interpreter without a GPU, the real kernels with one.

TRITON_INTERPRET must be set before `@triton.jit` runs, i.e. before the kernel modules are imported, so
it is set here, at conftest import, when no CUDA device is present. (`import kernels` alone does not
import the Triton modules; they load on first use.)
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

HAS_CUDA = torch.cuda.is_available()


@pytest.fixture
def device() -> torch.device:
    """Where the kernels run: the GPU when there is one, else CPU tensors through the interpreter."""
    return torch.device("cuda" if HAS_CUDA else "cpu")

