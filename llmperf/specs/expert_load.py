"""A router's measured expert load (`ExpertLoad`): per MoE layer, the rows each routed expert received
over a workload, read from a file (`load_expert_load`) or built from a profile (`expert_load_document`).

A trained router does not pick experts uniformly: some are popular, and on expert-parallel GPUs the
GPU holding them waits longest (`llmperf.analysis.routing` prices it). The load says how much, per
layer: expert `e`'s share of the layer's rows, times `k` (experts per token), is the probability that
a token picks it. Files (JSON):

- llmperf's, as `profile` writes it (`expert_load.json`): `{"format": "llmperf-expert-load",
  "num_experts": E, "layers": [{"layer": i, "counts": [E numbers]}, ...]}` (optional: `model`,
  `experts_per_token`, `source`, `tokens`).
- SGLang's expert distribution recorder (`--expert-distribution-recorder-mode stat`), its `.pt` dump's
  `logical_count` saved as JSON: `{"logical_count": [[E numbers] per layer]}`; a leading axis (steps
  or ranks) is summed.

Only shares matter: counts may be any non-negative numbers. A layer with no rows, a negative or
non-finite count, or an expert taking more than one row in `k` (a token picks an expert once) is
refused, as is a load whose expert count is not the model's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llmperf.errors import SpecError

__all__ = ["FORMAT", "ExpertLoad", "as_expert_load", "expert_load_document", "load_expert_load"]

FORMAT = "llmperf-expert-load"


@dataclass(frozen=True, kw_only=True, eq=False)
class ExpertLoad:
    """Rows routed to each expert (`counts`: layers x experts) of the MoE layers `layers`, from `source`.
    Compared by identity (a load is read once and passed along)."""

    counts: np.ndarray
    layers: tuple[int, ...]
    source: str

    def __post_init__(self) -> None:
        c = np.asarray(self.counts, dtype=float)
        if c.ndim != 2 or c.shape[0] < 1 or c.shape[1] < 2:
            raise SpecError(f"expert_load: {self.source}: expected counts of layers x experts (at least 2 experts), "
                            f"got shape {c.shape}")
        if not np.all(np.isfinite(c)) or np.any(c < 0):
            raise SpecError(f"expert_load: {self.source}: counts must be finite and non-negative")
        empty = np.flatnonzero(c.sum(axis=1) <= 0)
        if empty.size:
            raise SpecError(f"expert_load: {self.source}: layer {self.layers[int(empty[0])]} has no rows")
        if len(self.layers) != c.shape[0]:
            raise SpecError(f"expert_load: {self.source}: {len(self.layers)} layer numbers for {c.shape[0]} layers")
        c.setflags(write=False)
        object.__setattr__(self, "counts", c)

    @property
    def num_experts(self) -> int:
        """Routed experts per layer."""
        return int(self.counts.shape[1])

    def popularity(self, num_experts: int, experts_per_token: int) -> np.ndarray:
        """(layers, experts): the probability that a token picks each expert (each layer sums to `k`),
        checked against the model's `num_experts` and `experts_per_token`."""
        if self.num_experts != num_experts:
            raise SpecError(f"expert_load: {self.source} has {self.num_experts} experts per layer, "
                            f"the model {num_experts}")
        p = self.counts / self.counts.sum(axis=1, keepdims=True) * experts_per_token
        over = np.argwhere(p > 1.0 + 1e-9)
        if over.size:
            layer, e = (int(v) for v in over[0])
            raise SpecError(f"expert_load: {self.source}: layer {self.layers[layer]} expert {e} takes "
                            f"{p[layer, e] / experts_per_token:.1%} of the rows, more than one in k = "
                            f"{experts_per_token} allows (a token picks an expert once)")
        return np.minimum(p, 1.0)

    def label(self) -> str:
        """The load in words, for tables: its file's name and its layers."""
        return f"{Path(self.source).name} ({len(self.layers)} layers)"


def load_expert_load(path: str | os.PathLike[str]) -> ExpertLoad:
    """Read an expert load file (llmperf's or SGLang's `logical_count`, module docstring); errors name the file."""
    from llmperf.specs.loader import read_mapping

    p = Path(path)
    if p.suffix != ".json":
        raise SpecError(f"expert_load: {str(path)!r} is not a .json file (llmperf's expert_load.json or "
                        "SGLang's logical_count saved as JSON)")
    data = read_mapping(p)
    if "logical_count" in data:
        counts = _array(data["logical_count"], p, "logical_count")
        while counts.ndim > 2:
            counts = counts.sum(axis=0)
        return ExpertLoad(counts=counts, layers=tuple(range(counts.shape[0])) if counts.ndim == 2 else (),
                          source=str(p))
    if data.get("format") != FORMAT:
        raise SpecError(f"expert_load: {p}: format must be {FORMAT!r} (or a SGLang logical_count), "
                        f"got {data.get('format')!r}")
    layers = data.get("layers")
    if not isinstance(layers, list) or not layers:
        raise SpecError(f"expert_load: {p}: layers must be a non-empty list of {{layer, counts}}")
    numbers, rows = [], []
    for i, entry in enumerate(layers):
        if not isinstance(entry, dict) or "counts" not in entry or "layer" not in entry:
            raise SpecError(f"expert_load: {p}: layers[{i}] must have layer and counts")
        numbers.append(entry["layer"])
        rows.append(_array(entry["counts"], p, f"layers[{i}].counts"))
    widths = {r.shape for r in rows}
    if len(widths) != 1 or rows[0].ndim != 1:
        raise SpecError(f"expert_load: {p}: every layer's counts must be one list of the same length")
    e = data.get("num_experts", rows[0].size)
    if e != rows[0].size:
        raise SpecError(f"expert_load: {p}: num_experts is {e!r} but the counts have {rows[0].size}")
    if any(isinstance(n, bool) or not isinstance(n, int) for n in numbers) or len(set(numbers)) != len(numbers):
        raise SpecError(f"expert_load: {p}: layer numbers must be distinct integers")
    return ExpertLoad(counts=np.stack(rows), layers=tuple(numbers), source=str(p))


def as_expert_load(value: ExpertLoad | str | os.PathLike[str] | None) -> ExpertLoad | None:
    """An `ExpertLoad` as given, read from its file when given a path, or None."""
    if value is None or isinstance(value, ExpertLoad):
        return value
    return load_expert_load(value)


def _array(value: Any, path: Path, field: str) -> np.ndarray:
    try:
        out = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise SpecError(f"expert_load: {path}: {field} must be lists of numbers") from None
    if out.dtype == object or out.ndim == 0:
        raise SpecError(f"expert_load: {path}: {field} must be lists of numbers")
    return out


def expert_load_document(counts: dict[int, np.ndarray], num_experts: int, *, model: str, experts_per_token: int,
                         source: str, tokens: dict[int, int] | None = None) -> dict[str, Any]:
    """The JSON document of llmperf's format for per-layer `counts` (layer -> rows per expert)."""
    return dict(format=FORMAT, model=model, num_experts=int(num_experts), experts_per_token=int(experts_per_token),
                source=source, layers=[dict(layer=int(layer), counts=[int(v) for v in np.asarray(c).tolist()],
                                            **({"tokens": int(tokens[layer])} if tokens and layer in tokens else {}))
                                       for layer, c in sorted(counts.items())])
