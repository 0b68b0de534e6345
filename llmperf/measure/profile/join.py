"""The join of measured operators with predicted ones (`run.json` "join").

Each measurement is joined with `llmperf.analysis` by (phase, operator, layer kind, batch, q_len,
kv_len) through the shared vocabulary (`llmperf.analysis.vocabulary`). A fused measurement
(`qkv_proj`, `gate_up_proj`, `shared_gate_up_proj`) matches its parts on the other side
(`FUSED_PARTS`), so the engine may time either. Nothing is dropped silently: per phase and layer
kind, the operators joined and those on one side only (measured with no prediction, predicted and
never measured) are listed, and any of the latter fails the check "operators joined to predictions".
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from llmperf.analysis.operators import ForwardModel
from llmperf.analysis.vocabulary import FUSED_PARTS, OP_NAMES, Op
from llmperf.measure.profile.tables import MODEL_LEVEL
from llmperf.specs import ModelSpec
from llmperf.specs.model import LayerKind

JOIN_CHECK = "operators joined to predictions"


def _parts(name: str) -> set[str]:
    """A fused operator's parts (`FUSED_PARTS`), any other name itself."""
    op = Op(name) if name in OP_NAMES else None
    return {p.value for p in FUSED_PARTS[op]} if op in FUSED_PARTS else {name}


def unmatched(measured: Iterable[str], predicted: Iterable[str]) -> tuple[list[str], list[str]]:
    """(measured names with no prediction, predicted names with no measurement) of one phase and layer
    kind. A fused name matches its parts on the other side: a measured `qkv_proj` is joined when q, k
    and v are all predicted (split or fused), a predicted `gate_up_proj` when the gate and up projections
    were both measured."""
    measured, predicted = set(measured), set(predicted)
    m_parts = measured.union(*(_parts(n) for n in measured))
    p_parts = predicted.union(*(_parts(n) for n in predicted))
    return (sorted(n for n in measured if not _parts(n) <= p_parts),
            sorted(n for n in predicted if not _parts(n) <= m_parts))


def predicted_names(fm: ForwardModel, batch: int, q_len: int, kv_len: int,
                    kind: LayerKind | None) -> list[str]:
    """The operators the analytical model runs in one layer of `kind` (None: the model-level ones) of a
    step of this shape, in forward order (MLA's absorbed form in decode, unabsorbed in prefill)."""
    if kind is None:
        ops = fm.head_ops(batch, q_len, kv_len) + fm.tail_ops(batch, q_len, kv_len)
    else:
        ops = fm.layer_ops(batch, q_len, kv_len, kind)
    return [c.name for c in ops]


def join_report(trace: Any, spec: ModelSpec, fm: ForwardModel, config: str) -> list[dict[str, Any]]:
    """Per (phase, layer kind): the operators measured and joined to a prediction, and those on one side
    only (`unmatched`), over every step of the recorded run. Nothing is dropped silently: a name on one
    side only is listed, and `run.json` turns any into a failed check."""
    kinds = spec.layer_kinds()
    groups = {kind.label: kind for kind, _count in spec.layer_groups()}
    measured: dict[tuple[str, int], dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for r in trace.ops:
        measured[(r.phase, r.step)][MODEL_LEVEL if r.layer is None else kinds[r.layer].label].add(r.op)
    found: dict[tuple[str, str], dict[str, set[str]]] = {}
    for st in trace.steps:
        names = measured.get((st.phase, st.step))
        if names is None:  # operators not recorded (ops=False): nothing to join
            continue
        for label in (MODEL_LEVEL, *groups):
            kind = groups.get(label)
            pred = predicted_names(fm, st.batch, st.q_len, st.kv_len, kind)
            only_m, only_p = unmatched(names.get(label, set()), pred)
            entry = found.setdefault((st.phase, label), dict(joined=set(), measured_only=set(),
                                                             predicted_only=set()))
            entry["joined"] |= names.get(label, set()) - set(only_m)
            entry["measured_only"] |= set(only_m)
            entry["predicted_only"] |= set(only_p)
    return [dict(config=config, phase=phase, layer=label, joined=sorted(e["joined"]),
                 measured_only=sorted(e["measured_only"]), predicted_only=sorted(e["predicted_only"]))
            for (phase, label), e in found.items()]


def merge_joins(entries: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """`join_report` entries of every configuration merged per (phase, layer kind) for run.json."""
    merged: dict[tuple[str, str], dict[str, set[str]]] = {}
    for e in entries:
        m = merged.setdefault((e["phase"], e["layer"]), dict(joined=set(), measured_only=set(), predicted_only=set()))
        for key in m:
            m[key] |= set(e[key])
    return [dict(phase=phase, layer=label, **{k: sorted(v) for k, v in m.items()})
            for (phase, label), m in merged.items()]


def join_check(join: list[dict[str, Any]]) -> dict[str, Any]:
    """The run.json check that every measured operator found its prediction and every predicted one
    was measured, per phase and layer kind."""
    bad = [f"{e['phase']} {e['layer']}: " + "; ".join(
        part for part in (f"measured, not predicted: {', '.join(e['measured_only'])}" if e["measured_only"] else "",
                          f"predicted, not measured: {', '.join(e['predicted_only'])}" if e["predicted_only"] else "")
        if part) for e in join if e["measured_only"] or e["predicted_only"]]
    n = sum(len(e["joined"]) for e in join)
    return dict(name=JOIN_CHECK, passed=not bad and bool(join),
                detail="; ".join(bad) if bad else (f"{n} (phase, layer kind, operator) joined, none on one side only"
                                                   if join else "no operator was recorded"))
