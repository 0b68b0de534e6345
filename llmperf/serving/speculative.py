"""Speculative decoding in the serving simulator: its settings, the draft's memory, and the price of a
step whose decodes are speculative cycles.

With `SpeculativeConfig` on, the scheduler (`llmperf.serving.scheduler`) schedules each decode of a
sequence as one cycle: k + 1 tokens of the step's budget, k + 1 cache slots reserved for the step (a
draft tree, `DraftTree`: its verified tokens, and its later draft steps over `topk` candidates a sequence).
The cost-model runner draws the tokens the cycle emits, n in 1 .. k + 1, from the truncated geometric
law of Leviathan et al. (arXiv:2211.17192: P(n) = a^(n-1) (1 - a) for n <= k, P(k + 1) = a^k; mean
E(a, k) = (1 - a^(k+1)) / (1 - a), `llmperf.analysis.speculative.expected_tokens`) with a seeded
numpy Generator; the scheduler keeps n slots and gives the rest back. A cycle never drafts past the
request's `max_new_tokens` (k is cut to what is left less one).

A step's price (`SpeculativeCosts`), as `llmperf.analysis.speculative` prices a cycle: k draft
decode steps of the draft model over the cycling sequences (contexts growing by one each; the
first also over the step's prefill chunks: the draft's prefill of the prompt), the target's forward
over every verify (k + 1 tokens a sequence) and prefill chunk with the engine's verify terms
(`phase_time_model(.., "verify")`), and the step's fixed cost once (the decode step's, or the
prefill terms' when the step holds a prefill chunk). An MTP or EAGLE-3 draft adds its own operators
(`draft_extra_ops`; EAGLE-3's `fc` at a step's first draft pass). Memory: the draft's weights (none for
an early exit, `eh_proj` and one layer for MTP, an EAGLE-3 head less its embedding) and KV per token join
the target's; one activation
reservation, the larger (`draft_memory`). A draft of the target's own MoE layers (MTP, an early exit)
routes as the target does (its measured `expert_load`, its `eplb`); another draft uniformly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from llmperf.analysis.routing import check_eplb
from llmperf.analysis.speculative import (
    EAGLE3,
    MTP,
    DraftTree,
    accept_depth,
    draft_extra_ops,
    draft_queries,
    eagle3_extra_weights_bytes,
    expected_tokens,
    mtp_extra_weights_bytes,
    mtp_spec,
    resolve_draft,
    verify_tokens,
)
from llmperf.errors import SpecError
from llmperf.numeric import is_count, is_real
from llmperf.specs import ModelSpec

__all__ = ["DraftMemory", "SpeculativeConfig", "SpeculativeCosts", "draft_memory"]


@dataclass(frozen=True, kw_only=True)
class SpeculativeConfig:
    """Speculative decoding for every request of a replica. `draft`: what `llmperf speculate --draft`
    takes (a built-in model name, a YAML / HF config path or a `ModelSpec`; `"mtp"`: the model's own
    multi-token-prediction module; `"early-exit:N"`: its first N layers; `"eagle3"`, `"eagle3:N"` or an
    EAGLE-3 head's config.json: that head over the target's features). `num_draft_tokens`: k, the
    draft tokens per cycle; `acceptance`: a, each draft token's acceptance rate (independent);
    `seed`: the acceptance draws' random stream (same seed, same run). `draft_tp`: the draft model's
    tensor-parallel degree (None: the target's; it divides it; 1 runs the draft on one GPU, as vLLM's
    `draft_tensor_parallel_size=1`, and that GPU holds all of it: the memory plan's per-GPU figures are
    that GPU's). An early exit or MTP drafts with the target's own layers, at its degree. `tree`: a
    draft tree (`DraftTree`: later draft steps run `topk` candidates a sequence, the target verifies
    its `tokens`) of `num_draft_tokens` steps instead of a chain, `acceptance` then each depth's."""

    draft: Any
    num_draft_tokens: int
    acceptance: float
    seed: int = 0
    draft_tp: int | None = None
    tree: DraftTree | None = None

    def __post_init__(self) -> None:
        if isinstance(self.draft, str) and not self.draft.strip():
            raise SpecError(f"draft: must name a model, mtp, eagle3 or early-exit:N, got {self.draft!r}")
        if not is_count(self.num_draft_tokens) or not 1 <= self.num_draft_tokens <= 64:
            raise SpecError(f"num_draft_tokens: must be an integer in 1 .. 64, got {self.num_draft_tokens!r}")
        if not is_real(self.acceptance) or not 0.0 <= float(self.acceptance) <= 1.0:
            raise SpecError(f"acceptance: must be a number in [0, 1], got {self.acceptance!r}")
        if not is_count(self.seed) or self.seed < 0:
            raise SpecError(f"seed: must be a non-negative integer, got {self.seed!r}")
        if self.draft_tp is not None and (not is_count(self.draft_tp) or self.draft_tp < 1):
            raise SpecError(f"draft_tp: must be a positive integer, got {self.draft_tp!r}")
        if self.tree is not None:
            if not isinstance(self.tree, DraftTree):
                raise SpecError(f"tree: must be a DraftTree (topk, tokens) or None, got {self.tree!r}")
            self.tree.check(self.num_draft_tokens)

    @property
    def expected_tokens_per_cycle(self) -> float:
        """E(a, d): the tokens a full cycle emits on average (d: its accept depth, k for a chain)."""
        return expected_tokens(self.acceptance, self.accept_depth(self.num_draft_tokens))

    def verify_tokens(self, depth: int) -> int:
        """Tokens a sequence's verify puts through the target after `depth` draft steps."""
        return verify_tokens(self.tree, depth)

    def accept_depth(self, depth: int) -> int:
        """The most drafts a cycle of `depth` draft steps can accept."""
        return accept_depth(self.tree, depth)

    def draft_queries(self, depth: int) -> list[int]:
        """Tokens a sequence puts through each of `depth` draft steps (1, then the tree's `topk`)."""
        return draft_queries(self.tree, depth)

    def resolve(self, model: ModelSpec) -> tuple[ModelSpec, str]:
        """The draft of `model` as a spec and its kind ("model", "mtp", "early-exit"): SpecError naming
        `draft` when it is unknown or does not share the target's vocabulary."""
        try:
            return resolve_draft(model, self.draft)
        except SpecError as exc:
            text = str(exc)
            raise SpecError(text if text.startswith("draft:") else f"draft: {text}") from None

    def tp_of_draft(self, model: ModelSpec, tp: int, dp_attention: bool = False) -> int:
        """The draft's tensor-parallel degree beside a target at `tp`: SpecError naming `draft_tp` when it
        does not divide `tp`, or differs from it for a draft of the target's own layers (an early exit,
        MTP) or under data-parallel attention (each GPU drafts its own sequences)."""
        if self.draft_tp is None or self.draft_tp == tp:
            return tp
        _, kind = self.resolve(model)
        if tp % self.draft_tp:
            raise SpecError(f"draft_tp: {self.draft_tp} does not divide the target's tp {tp}")
        if kind != "model":
            raise SpecError(f"draft_tp: {self.draft_tp}, but a draft of the target's own layers ({self.draft}) runs "
                            f"at the target's tp {tp}")
        if dp_attention:
            raise SpecError(f"draft_tp: {self.draft_tp}, but with data-parallel attention each GPU drafts its own "
                            f"sequences at the target's tp {tp}")
        return int(self.draft_tp)

    def settings(self, model: ModelSpec, tp: int | None = None) -> dict[str, object]:
        """The settings as plain values, the draft by name (a run's and a plan's settings; `tp`: the
        target's, for the draft's degree; None where it varies: `draft_tp` None then means the target's)."""
        draft, _ = self.resolve(model)
        return dict(draft=draft.name, num_draft_tokens=self.num_draft_tokens,
                    tree_topk=self.tree.topk if self.tree else 1,
                    verify_tokens=self.verify_tokens(self.num_draft_tokens), acceptance=float(self.acceptance),
                    speculative_seed=self.seed, expected_tokens_per_cycle=self.expected_tokens_per_cycle,
                    draft_tp=self.draft_tp if self.draft_tp is not None else tp)

    def draws(self) -> AcceptanceDraws:
        """A fresh random stream of cycle lengths for one run."""
        return AcceptanceDraws(self.acceptance, self.seed)


class AcceptanceDraws:
    """Tokens emitted by speculative cycles: n = 1 + min(k, floor(log(1 - u) / log a)), u uniform in
    [0, 1), so P(n > j) = a^j for j <= k (the truncated geometric law); no draw at a = 0 or 1."""

    def __init__(self, acceptance: float, seed: int) -> None:
        self.a = float(acceptance)
        self.rng = np.random.default_rng(seed)
        self._log_a = math.log(self.a) if 0.0 < self.a < 1.0 else 0.0

    def draw(self, drafts: list[int]) -> list[int]:
        """Tokens emitted by cycles of `drafts[i]` draft tokens each (n in 1 .. drafts[i] + 1)."""
        if self.a <= 0.0:
            return [1] * len(drafts)
        if self.a >= 1.0:
            return [k + 1 for k in drafts]
        u = self.rng.random(len(drafts))
        j = np.floor(np.log1p(-u) / self._log_a)
        return [1 + int(min(k, x)) for k, x in zip(drafts, j.tolist())]


@dataclass(frozen=True, kw_only=True)
class DraftMemory:
    """Per GPU, what the draft adds: its weights (those it does not share with the target), its KV
    bytes per token, and its activation reservation (the replica keeps the larger of the two)."""

    name: str
    kind: str
    weights_bytes: float
    kv_bytes_per_token: float
    activation_bytes: float


def _draft_tp(config: Any) -> int:
    return config.speculative.tp_of_draft(config.model, config.tp, config.dp_attention)


def _draft_parallel(config: Any, draft: ModelSpec) -> dict[str, Any]:
    """The draft's expert and attention layout: the target's at the target's degree; at another degree
    its experts are not split apart (ep 1) and its attention is not data-parallel."""
    if _draft_tp(config) != config.tp:
        return dict(ep=1, dp_attention=False)
    return dict(ep=config.ep if draft.is_moe else 1, dp_attention=config.dp_attention)


def _draft_routing(config: Any, draft: ModelSpec, kind: str) -> dict[str, Any]:
    """The draft's expert routing: a draft of the target's own MoE layers (MTP, an early exit) at the
    target's degree routes as the target does (its measured `expert_load`, its `eplb`); any other draft
    uniformly, its experts placed contiguously (a load measured on the target's experts is not its)."""
    own = kind != "model" and draft.is_moe and _draft_parallel(config, draft)["ep"] == config.ep
    return dict(expert_load=config.expert_load, eplb=config.eplb) if own else dict(expert_load=None, eplb=None)


def draft_memory(config: Any, workload: Any = None) -> DraftMemory:
    """The draft's share of a replica's memory (`ServingConfig` `config`, the draft at the target's
    precision and at its own tensor-parallel degree, `SpeculativeConfig.draft_tp`: per GPU, the GPU that
    holds most of it), by `llmperf speculate`'s rules: an early exit shares the target's weights but
    keeps its own KV; MTP adds one layer, `eh_proj` and three norms."""
    from llmperf.analysis.memory import kv_bytes_per_token_per_gpu, weight_bytes_per_gpu
    from llmperf.analysis.rollup import activation_reserve_bytes

    d, kind = config.speculative.resolve(config.model)
    prec, tp = config.precision, _draft_tp(config)
    par = _draft_parallel(config, d)
    if kind == "early-exit":
        weights = 0.0
    elif kind == MTP:  # EPLB's redundant experts in the MTP layer too
        r = check_eplb(d, par["ep"], _draft_routing(config, d, kind)["eplb"])
        two = weight_bytes_per_gpu(mtp_spec(config.model, 2), prec, tp, 1, **par, redundant_experts=r)
        weights = (two - weight_bytes_per_gpu(d, prec, tp, 1, **par, redundant_experts=r)
                   + mtp_extra_weights_bytes(config.model, prec))
    elif kind == EAGLE3:  # its layer, norm and head, fc, the feature's Q/K/V, its maps; the embedding is the target's
        weights = weight_bytes_per_gpu(d, prec, tp, 1, **par) + eagle3_extra_weights_bytes(d, prec, tp)
    else:
        weights = weight_bytes_per_gpu(d, prec, tp, 1, **par)
    kv = kv_bytes_per_token_per_gpu(d, prec, tp, 1, **par)
    act = activation_reserve_bytes(d, prec, _draft_conventions(config, d, workload), tp, **par)
    return DraftMemory(name=d.name, kind=kind, weights_bytes=float(weights), kv_bytes_per_token=float(kv),
                       activation_bytes=float(act))


def _draft_conventions(config: Any, draft: ModelSpec, workload: Any = None) -> Any:
    conv = config.conventions(workload)
    _, kind = config.speculative.resolve(config.model)
    par = _draft_parallel(config, draft) | _draft_routing(config, draft, kind)
    if all(getattr(conv, k) == v for k, v in par.items()):
        return conv
    return replace(conv, **par)


class SpeculativeCosts:
    """Prices the parts of a step with speculative cycles from a target `StepCostModel`: the target's
    forward with the verify terms and the draft's forwards, each without the engine's fixed cost
    (`fixed_s` adds it once per step)."""

    def __init__(self, target: Any, config: Any) -> None:
        from llmperf.analysis.roofline import phase_time_model
        from llmperf.serving.costmodel import StepCostModel

        d, kind = config.speculative.resolve(config.model)
        self.target = target
        self.verify = target if phase_time_model(target.time_model, "verify") is target.time_model else \
            replace(target, time_model=phase_time_model(target.time_model, "verify"))
        self.spec = config.speculative
        self.draft = StepCostModel(model=d, hardware=target.hardware, precision=target.precision, tp=_draft_tp(config),
                                   pp=1, attention=target.attention, time_model=config.resolve_time_model(d),
                                   conventions=_draft_conventions(config, d))
        self.kind = kind
        self.hidden_size = config.model.hidden_size
        self._extra_cache: dict[tuple[int, bool, bool], float] = {}

    def decode_fixed_s(self) -> float:
        """The engine's fixed cost of a step without a prefill chunk (a cycle pays it once)."""
        return self.target.step_overhead_s

    def prefill_fixed_s(self) -> float:
        """The fixed cost of a step with a prefill chunk (the prefill terms')."""
        return self.target.prefill_costs.step_overhead_s

    def verify_s(self, tokens: int, features: Any, logit_rows: int) -> float:
        """The target's forward over a step's verify tokens and prefill chunks, with the verify terms."""
        v = self.verify
        return v.dense_time_s(tokens) + v.attention_time_s(features) + v.head_time_s(logit_rows)

    def draft_s(self, tokens: int, features: Any, logit_rows: int, prefill: bool = False, first: bool = False
                ) -> float:
        """One forward of the draft (decode terms; `prefill`: with a prefill chunk, the prefill terms;
        `first`: a step's first draft pass, where EAGLE-3's `fc` joins the target's features)."""
        if tokens <= 0:
            return 0.0
        d = self.draft.prefill_costs if prefill else self.draft
        t = d.dense_time_s(tokens) + d.attention_time_s(features) + d.head_time_s(logit_rows)
        if self.kind in (MTP, EAGLE3):
            t += self._extra_s(tokens, prefill, first, d)
        return t

    def cycle_s(self, batch: int, context: float, k: int) -> float:
        """A step of `batch` cycles of `k` draft steps, each sequence with `context` tokens committed: the
        draft steps (contexts context .. context + k - 1; a tree's later ones over `topk` candidates a
        sequence), the verify (k + 1 tokens, or the tree's, context + k after it) and the fixed cost (the
        bounds of a rate search and the plan's floors use it)."""
        b = int(batch)
        t = self.target
        v = self.spec.verify_tokens(k)
        verify = self.verify_s(b * v, t.features(np.full(b, float(v)), np.full(b, context + v - 1)), b * v)
        drafts = sum(self.draft_s(b * q, self.draft.features(np.full(b, float(q)), np.full(b, context + i + q - 1)),
                                  b * q, first=i == 0)
                     for i, q in enumerate(self.spec.draft_queries(k)))
        return verify + drafts + self.decode_fixed_s()

    def _extra_s(self, tokens: int, prefill: bool, first: bool, d: Any) -> float:
        key = (tokens, prefill, first)
        hit = self._extra_cache.get(key)
        if hit is None:
            from llmperf.serving.costmodel import _op_time
            hit = sum(float(np.asarray(_op_time(c, d.hardware, d.dtype, d.time_model).time_s))
                      for c in draft_extra_ops(self.kind, d.fm, float(tokens), self.hidden_size, first))
            self._extra_cache[key] = hit
        return hit
