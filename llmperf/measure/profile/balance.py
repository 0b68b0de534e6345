"""Expert-parallel balance of a real router's choices, beside the analytical model's busiest GPU.

The analytical model prices an expert-parallel MoE layer on its busiest GPU under uniform random
routing (`llmperf.analysis.routing.busiest_expert_load`). A profiled MoE model records, per step and
MoE layer, the experts its router chose and the rows each got (`llmperf.engine.RoutingRecord`). From
them, for each expert-parallel degree `EP_DEGREES` that divides the experts, this module finds what
that layout's busiest GPU would have been given (experts `e` on GPU `e // (E / ep)`, as vLLM and
SGLang place them without a load balancer): its rows and its experts touched (`balance_rows`,
`expert_balance.csv`), beside the uniform-routing prediction at the step's tokens and the mean a
perfectly balanced layout would give. `balance_summary` (run.json `expert_balance`) gives per
configuration, phase and degree the measured busiest over the predicted: above 1, this router (these
weights, these prompts) is more skewed than uniform routing, and an EP deployment of it waits longer
than `estimate` says. A randomly initialised model's router is close to uniform; a trained one's is
not (Nguyen et al., "Least-Loaded Expert Parallelism", arXiv:2601.17111). `expert_counts` sums the
rows each expert got per layer: the run's `expert_load.json` (`llmperf.specs.expert_load`), which
`estimate`, `simulate` and `plan --expert-load` price instead of uniform routing.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import numpy as np

from llmperf.analysis.routing import busiest_expert_load
from llmperf.specs import ModelSpec

__all__ = ["EP_DEGREES", "balance_rows", "balance_summary", "busiest_of", "expert_counts"]

EP_DEGREES = (2, 4, 8)  # the expert-parallel degrees of one node that the balance is worked out for


def busiest_of(experts: Iterable[int], rows: Iterable[int], num_experts: int, ep: int) -> tuple[int, int]:
    """(rows, experts touched) of the busiest of `ep` GPUs holding experts `[g E/ep, (g + 1) E/ep)` each,
    for one routing: the distinct `experts` chosen and the `rows` each got."""
    local = num_experts // ep
    load, touched = [0] * ep, [0] * ep
    for e, n in zip(experts, rows, strict=True):
        load[e // local] += n
        touched[e // local] += 1
    return max(load), max(touched)


def expert_counts(trace: Any, num_experts: int) -> dict[int, np.ndarray]:
    """Per MoE layer, the rows each of its `num_experts` experts got over every step of `trace`."""
    out: dict[int, np.ndarray] = {}
    for r in trace.routes:
        counts = out.setdefault(r.layer, np.zeros(num_experts, dtype=np.int64))
        np.add.at(counts, np.asarray(r.experts, dtype=np.int64), np.asarray(r.rows, dtype=np.int64))
    return out


def balance_rows(trace: Any, spec: ModelSpec, config: str) -> list[dict[str, Any]]:
    """expert_balance.csv rows: per step, MoE layer and degree in `EP_DEGREES` that divides the experts,
    the busiest GPU's measured rows and experts touched, the uniform-routing prediction of both, and the
    balanced layout's mean rows (`tokens x k / ep`)."""
    e, k = spec.num_experts, spec.experts_per_token
    degrees = [ep for ep in EP_DEGREES if ep <= e and e % ep == 0]
    out = []
    for r in trace.routes:
        tokens = r.batch * r.q_len
        for ep in degrees:
            rows, touched = busiest_of(r.experts, r.rows, e, ep)
            pred_rows, pred_touched = busiest_expert_load(tokens, e, k, ep)
            out.append(dict(config=config, phase=r.phase, step=r.step, layer=r.layer, tokens=tokens, ep=ep,
                            busiest_rows=rows, busiest_touched=touched, predicted_rows=round(pred_rows, 3),
                            predicted_touched=round(pred_touched, 3), mean_rows=tokens * k / ep))
    return out


def balance_summary(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """run.json `expert_balance`: per (configuration, phase, degree), over its steps and MoE layers, the
    mean measured busiest rows and experts touched, the mean predicted, and measured / predicted."""
    by: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by[(r["config"], r["phase"], r["ep"])].append(r)
    out = []
    for (config, phase, ep), rs in by.items():
        def mean(key: str, group: list[dict[str, Any]] = rs) -> float:
            return float(np.mean([float(r[key]) for r in group]))

        out.append(dict(config=config, phase=phase, ep=ep, samples=len(rs), tokens=rs[0]["tokens"],
                        mean_rows=mean("mean_rows"), busiest_rows=mean("busiest_rows"),
                        predicted_rows=mean("predicted_rows"), busiest_touched=mean("busiest_touched"),
                        predicted_touched=mean("predicted_touched"),
                        rows_ratio=mean("busiest_rows") / mean("predicted_rows"),
                        touched_ratio=mean("busiest_touched") / mean("predicted_touched")))
    return out
