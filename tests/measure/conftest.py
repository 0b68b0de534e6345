"""Measurement tests: kernels run in Triton's CPU interpreter without a GPU (set before they import)."""

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
