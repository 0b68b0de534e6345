"""llmperf: what limits this model on this GPU, and is the prediction true?

The analytical half needs no torch: `llmperf.estimate(...)` and `llmperf.sweep(...)` predict a
generation from built-in (or your own) model and device specs. The engine, kernels and measurement
harness live in `llmperf.engine`, `kernels` and `llmperf.measure` and need torch.
"""

from llmperf.errors import SpecError

__version__ = "0.1.0"

# The public names load on first use (PEP 562), so `import llmperf` (and the command line's start-up,
# where a Ctrl-C must stay quiet) does not pay for pandas until a name is asked for.
_LAZY = {
    "GenerationEstimate": "llmperf.analysis", "PhaseEstimate": "llmperf.analysis", "estimate": "llmperf.analysis",
    "sweep": "llmperf.analysis", "HardwareSpec": "llmperf.specs", "ModelSpec": "llmperf.specs",
    "Precision": "llmperf.specs", "list_hardware": "llmperf.specs", "list_models": "llmperf.specs",
    "load_hardware": "llmperf.specs", "load_model": "llmperf.specs",
}
_SUBPACKAGES = ("analysis", "specs")


def __getattr__(name: str) -> object:
    import importlib

    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    elif name in _SUBPACKAGES:
        value = importlib.import_module(f"llmperf.{name}")
    else:
        raise AttributeError(f"module 'llmperf' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_SUBPACKAGES))


__all__ = [
    "GenerationEstimate", "HardwareSpec", "ModelSpec", "PhaseEstimate", "Precision", "SpecError",
    "estimate", "list_hardware", "list_models", "load_hardware", "load_model", "sweep",
]
