"""llmperf: what limits this model on this GPU, and is the prediction true?

The analytical half needs no torch: `llmperf.estimate(...)` and `llmperf.sweep(...)` predict a
generation from built-in (or your own) model and device specs. The engine, kernels and measurement
harness live in `llmperf.engine`, `kernels` and `llmperf.measure` and need torch.
"""

from llmperf.analysis import GenerationEstimate, PhaseEstimate, estimate, sweep
from llmperf.errors import SpecError
from llmperf.specs import (
    HardwareSpec,
    ModelSpec,
    Precision,
    list_hardware,
    list_models,
    load_hardware,
    load_model,
)

__version__ = "0.1.0"

__all__ = [
    "GenerationEstimate", "HardwareSpec", "ModelSpec", "PhaseEstimate", "Precision", "SpecError",
    "estimate", "list_hardware", "list_models", "load_hardware", "load_model", "sweep",
]
