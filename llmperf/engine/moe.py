"""Mixture-of-experts FFN layers (`MoE`): a router picks `experts_per_token` of `num_experts` gated
experts per token and sums their outputs weighted by the router's scores (Shazeer et al. 2017,
arXiv:1701.06538; Mixtral, Jiang et al. 2024, arXiv:2401.04088), plus always-on shared experts
(DeepSeekMoE, Dai et al. 2024, arXiv:2401.06066; Llama 4; Qwen2-MoE's gated shared expert).

Letters: N tokens, C hidden size, F expert width, F_s shared width (all shared experts together),
E experts, K experts per token, G expert groups.

Each family's router is computed as `transformers` 5 computes it (`modeling_<type>.py`:
`MixtralTopKRouter`, `Qwen3MoeTopKRouter`, `DeepseekV2TopkRouter`, `DeepseekV3TopkRouter`,
`Glm4MoeTopkRouter`, `GptOssTopKRouter`, `Llama4Router`), chosen by the spec's numerics
(`router_scoring`, `router_renormalize`, `router_scale`, `router_groups`, `router_score_bias`,
`router_bias`, `router_input_scaling`); `check_moe` refuses combinations no model computes.
Experts are gated SwiGLU of width `spec.expert_ffn_size`, or gpt-oss's clamped, biased SwiGLU (`clamped_swiglu`),
stacked as [gate | up] rows; or (another `ffn_kind`: Nemotron-H's relu2) up rows alone. Shared experts are one
dense FFN of the same kind, `shared_experts * shared_expert_ffn_size` wide, on every token, added to the routed sum.

Parameters (`(out, in)` layout; `weight_layout="in_out"` stores every matrix transposed):
router_weight (E, C) [+ router_bias (E)] [+ router_score_bias (E), fp32]; experts_up_weight (E, 2F, C)
[+ experts_up_bias (E, 2F)]; experts_down_weight (E, C, F) [+ experts_down_bias (E, C)];
[shared_up_weight (2F_s, C), shared_down_weight (C, F_s), [shared_gate_weight (1, C)]].

`touched_experts(model)` reads the distinct routed experts each MoE layer's last forward ran;
`expected_touched` is that count under uniform routing, E (1 - (1 - K/E)^N). Each router: docs/engine.md,
"Mixture of experts"; what is recorded (`router`, `moe_route`, `moe_sum`): "Instrumentation".
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from llmperf.engine.instrument import EXPERTS_TOUCHED
from llmperf.specs import ModelSpec
from llmperf.specs.hf import GPT_OSS_SWIGLU_ALPHA


def check_moe(spec: ModelSpec) -> None:
    """A ValueError naming the MoE field the engine cannot build, before anything is allocated: the
    combinations of routing fields no model computes (each family's router is built as its own)."""
    if spec.router_scoring not in ("softmax", "sigmoid"):
        raise ValueError(f"router_scoring: the engine scores experts by softmax or sigmoid, got "
                         f"{spec.router_scoring!r} ({spec.name})")
    if spec.mlp_bias and spec.shared_experts:
        raise ValueError(f"mlp_bias: biased experts with shared experts ({spec.name}) match no model the engine "
                         "was checked against (DeepSeek-V2's biases sit on its dense and shared MLPs only)")
    if spec.router_input_scaling and (spec.router_scoring != "sigmoid" or spec.router_renormalize
                                      or spec.router_groups > 1 or spec.router_scale != 1.0 or spec.router_score_bias):
        raise ValueError(f"router_input_scaling: Llama 4's router (sigmoid of the chosen logits, no renormalisation, "
                         f"groups, scale or score bias) is the only one that scales the experts' input ({spec.name})")
    if spec.router_bias and (spec.router_scoring != "softmax" or not spec.router_renormalize
                             or spec.router_groups > 1 or spec.router_score_bias):
        raise ValueError(f"router_bias: gpt-oss's router (softmax over the top-k logits) is the only biased one "
                         f"the engine builds ({spec.name}: router_scoring={spec.router_scoring!r}, "
                         f"router_renormalize={spec.router_renormalize}, router_groups={spec.router_groups})")
    if spec.router_score_bias and spec.router_groups > 1 and spec.num_experts // spec.router_groups < 2:
        raise ValueError(f"router_groups: a group scores its two best experts (noaux_tc), so {spec.router_groups} "
                         f"groups of {spec.num_experts} experts are too many ({spec.name})")
    if spec.swiglu_limit is not None and spec.hidden_act not in ("silu", "swish"):
        raise ValueError(f"swiglu_limit: gpt-oss's clamped SwiGLU replaces a silu gate, got hidden_act="
                         f"{spec.hidden_act!r} ({spec.name})")


def fp32_router(spec: ModelSpec) -> bool:
    """Whether the router's logits are computed in fp32: DeepSeek's routers (shared experts without a
    gate: DeepSeek-V2/V3, Kimi-K2, GLM-4.5; transformers routes `hidden.float()` through
    `gate.weight.float()`). The weight is stored at the model's dtype, as the checkpoints store it
    (bf16) and vLLM and SGLang hold it; transformers' fp32 copy holds the same values. The
    score-correction bias is fp32 everywhere (as the analytical model counts it)."""
    # Granite's router (its spec sets attention_multiplier) computes its logits in the activation dtype
    return (spec.shared_experts > 0 and not spec.shared_expert_gate and not spec.router_input_scaling
            and spec.attention_multiplier is None)


def clamped_swiglu(gate_up: torch.Tensor, limit: float) -> torch.Tensor:
    """gpt-oss's activation over [gate | up] `(..., 2F)` (`GptOssExperts._apply_gate`): `(..., F)`,
    `(clamp(up) + 1) * (g * sigmoid(g * alpha))` with `g = clamp(gate)`, the same operations in the same
    order as transformers' (bit for bit) in two buffers instead of seven: on a CPU every fresh buffer of
    a few MB is page-faulted in, which took 7-15x the arithmetic (reports/engine/README.md)."""
    gate, up = gate_up.chunk(2, dim=-1)
    g = gate.clamp(max=limit)
    s = torch.mul(g, GPT_OSS_SWIGLU_ALPHA).sigmoid_().mul_(g)  # other swiglu_alpha: refused
    return torch.clamp(up, min=-limit, max=limit, out=g).add_(1).mul_(s)


class MoE(nn.Module):
    """One mixture-of-experts FFN: `forward(h (1, N, C), rec) -> (1, N, C)`."""

    def __init__(self, spec: ModelSpec, index: int, ops: Any, **kw: Any) -> None:
        super().__init__()
        from llmperf.engine.parts import _ACTIVATIONS, _linear_params, _mat

        check_moe(spec)
        self.index, self.ops = index, ops
        C, F_, E = spec.hidden_size, spec.expert_ffn_size, spec.num_experts
        self.num_experts, self.top_k = E, spec.experts_per_token
        self.act = _ACTIVATIONS[spec.hidden_act]
        self.gated = spec.ffn_kind == "swiglu"  # else two matrices, up and down (Nemotron-H's relu2 experts)
        up = 2 if self.gated else 1
        self.limit = spec.swiglu_limit
        self.scoring, self.renormalize, self.scale = spec.router_scoring, spec.router_renormalize, spec.router_scale
        self.groups, self.topk_groups = spec.router_groups, spec.router_topk_groups
        self.input_scaling = spec.router_input_scaling
        self.fp32_router = fp32_router(spec)
        in_out = ops.in_out
        fp32 = dict(kw, dtype=torch.float32)
        self.router_weight = _mat(C, E, in_out, **kw)
        self.router_bias = nn.Parameter(torch.empty(E, **kw)) if spec.router_bias else None
        self.router_score_bias = nn.Parameter(torch.empty(E, **fp32)) if spec.router_score_bias else None
        self.experts_up_weight = nn.Parameter(torch.empty((E, C, up * F_) if in_out else (E, up * F_, C), **kw))
        self.experts_down_weight = nn.Parameter(torch.empty((E, F_, C) if in_out else (E, C, F_), **kw))
        self.experts_up_bias = nn.Parameter(torch.empty(E, up * F_, **kw)) if spec.mlp_bias else None
        self.experts_down_bias = nn.Parameter(torch.empty(E, C, **kw)) if spec.mlp_bias else None
        self.shared = spec.shared_experts > 0
        if self.shared:
            F_s = spec.shared_experts * spec.shared_expert_ffn_size
            _linear_params(self, "shared_up", C, up * F_s, False, in_out, **kw)
            _linear_params(self, "shared_down", F_s, C, False, in_out, **kw)
        self.shared_gate_weight = _mat(C, 1, in_out, **kw) if spec.shared_expert_gate else None
        self.last_touched = 0  # distinct routed experts the last forward ran
        self._views_key: tuple[int, int] | None = None  # the storage `_expert_weights`' views are of
        self._up_views: list[torch.Tensor] = []
        self._down_views: list[torch.Tensor] = []

    # ---- routing --------------------------------------------------------------------------------
    def route(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The experts each token `flat (N, C)` chooses `(N, K)` and their weights `(N, K)` (fp32, or
        the activation dtype where the family computes them there: gpt-oss, Llama 4)."""
        return self.choose(self.logits(flat))

    def logits(self, flat: torch.Tensor) -> torch.Tensor:
        """The router's GEMM: every token's logit for every expert `(N, E)` (fp32 for DeepSeek's routers)."""
        if self.fp32_router:
            return self.ops.plain(flat.float(), self.router_weight.float())
        return self.ops.plain(flat, self.router_weight, self.router_bias)

    def choose(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The experts each token chooses from its `logits (N, E)` and their weights, as `route`."""
        K = self.top_k
        if self.router_bias is not None:  # gpt-oss: softmax over the k best logits
            top, chosen = torch.topk(logits, K, dim=-1)
            return torch.softmax(top, dim=-1), chosen
        if self.input_scaling:  # Llama 4: sigmoid of the k best logits, in fp32, cast back
            top, chosen = torch.topk(logits, K, dim=-1)
            return torch.sigmoid(top.float()).to(logits.dtype), chosen
        if self.scoring == "softmax":
            scores = torch.softmax(logits, dim=-1, dtype=torch.float32)  # (N, E)
        else:
            scores = torch.sigmoid(logits.float())
        choice = scores if self.router_score_bias is None else scores + self.router_score_bias
        if self.groups > 1:
            choice, scores = self._limit_groups(choice, scores)
        chosen = torch.topk(choice, K, dim=-1).indices  # (N, K)
        weights = scores.gather(1, chosen)
        if self.renormalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        if self.scale != 1.0:
            weights = weights * self.scale
        return weights, chosen

    def group(self, chosen: torch.Tensor, *, by_sort: bool | None = None
              ) -> tuple[list[int], list[tuple[torch.Tensor, torch.Tensor]]]:
        """The distinct experts `chosen (N, K)` names, ascending, and for each its (token rows, slots),
        ascending. `by_sort` (default: on a GPU): one stable sort of the choices and one copy to the
        host, where `torch.unique` + a `nonzero` per expert would wait for the device once per expert;
        on a CPU those are as fast (measured in situ: 173 vs 181 us a layer) and stay. The same pairs
        either way (tested)."""
        if not (chosen.is_cuda if by_sort is None else by_sort):
            experts = torch.unique(chosen).tolist()
            return experts, [torch.nonzero(chosen == e, as_tuple=True) for e in experts]
        flat = chosen.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.num_experts)
        counts_host = counts.tolist()  # the one wait for the device
        experts = [e for e, c in enumerate(counts_host) if c]
        sizes = [counts_host[e] for e in experts]
        rows, slots = order.div(self.top_k, rounding_mode="floor"), order.remainder(self.top_k)
        return experts, list(zip(rows.split(sizes), slots.split(sizes), strict=True))

    def _limit_groups(self, choice: torch.Tensor, scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keep each token's `topk_groups` best groups of experts: a group scores the sum of its two
        best biased scores with a score correction (DeepSeek-V3 noaux_tc; the rest -inf for the
        choice only), else its best score (DeepSeek-V2 group_limited_greedy; the rest 0, weights too)."""
        N, E, G = choice.shape[0], self.num_experts, self.groups
        grouped = choice.view(N, G, E // G)
        if self.router_score_bias is not None:
            group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)  # (N, G)
        else:
            group_scores = grouped.max(dim=-1).values
        best = torch.topk(group_scores, self.topk_groups, dim=-1).indices  # (N, topk_groups)
        keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
        keep = keep[:, :, None].expand(N, G, E // G).reshape(N, E)
        if self.router_score_bias is not None:
            return choice.masked_fill(~keep, float("-inf")), scores
        masked = choice.masked_fill(~keep, 0.0)
        return masked, masked

    # ---- experts --------------------------------------------------------------------------------
    def _expert_weights(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Each expert's up and down matrices as views of the stacked parameters, kept while their
        storage stays the same: the ops see the same weight tensor every step, so a private copy they
        make of it (oneDNN's packed layout on a CPU) is made once per expert, as for a dense layer's
        weights, not per step."""
        key = (self.experts_up_weight.data_ptr(), self.experts_down_weight.data_ptr())
        if self._views_key != key:
            self._up_views = list(self.experts_up_weight.unbind(0))
            self._down_views = list(self.experts_down_weight.unbind(0))
            self._views_key = key
        return self._up_views, self._down_views

    def _expert(self, inputs: torch.Tensor, rows: torch.Tensor, slot: torch.Tensor, e: int,
                rec: Any) -> torch.Tensor:
        """Expert `e` on its rows of `inputs` (`(N, C)` indexed by `rows`, or Llama 4's scaled
        `(N, K, C)` by `rows, slot`): gate/up, the gated activation, down, through the ops' GEMMs as a
        dense layer's (packed weights on a CPU). Gathering the rows is the gate/up GEMM's input read
        (vLLM's fused MoE kernel reads them through the sorted token ids)."""
        i, linear = self.index, self.ops.linear
        ups, downs = self._expert_weights()
        up_b = None if self.experts_up_bias is None else self.experts_up_bias[e]
        down_b = None if self.experts_down_bias is None else self.experts_down_bias[e]
        with rec.op("gate_up_proj" if self.gated else "up_proj", i):
            x = inputs[rows, slot] if inputs.dim() == 3 else inputs[rows]
            gate_up = linear(x, ups[e], up_b)
        with rec.op("act", i):
            a = self._act(gate_up) if self.limit is None else clamped_swiglu(gate_up, self.limit)
        with rec.op("down_proj", i):
            return linear(a, downs[e], down_b)

    def _act(self, up: torch.Tensor) -> torch.Tensor:
        """The experts' activation: a gated one over [gate | up] `(..., 2F)`, else `act(up)` `(..., F)`."""
        return self.ops.glu(up, self.act) if self.gated else self.act(up)

    def _shared(self, flat: torch.Tensor, rec: Any) -> torch.Tensor:
        """The shared experts on every token `(N, C)`: one gated FFN, [times Qwen2-MoE's sigmoid gate]."""
        i, linear = self.index, self.ops.linear
        with rec.op("shared_gate_up_proj" if self.gated else "shared_up_proj", i):
            gate_up = linear(flat, self.shared_up_weight)
        with rec.op("shared_act", i):
            a = self._act(gate_up)
        with rec.op("shared_down_proj", i):
            y = linear(a, self.shared_down_weight)
        if self.shared_gate_weight is None:
            return y
        with rec.op("shared_expert_gate", i):
            return torch.sigmoid(linear(flat, self.shared_gate_weight)) * y

    def forward(self, h: torch.Tensor, rec: Any) -> torch.Tensor:
        B, T, C = h.shape
        i = self.index
        flat = h.reshape(B * T, C)  # (N, C)
        with rec.op("router", i):
            logits = self.logits(flat)
        with rec.op("moe_route", i):  # the choice, and each touched expert's (token, slot) pairs
            weights, chosen = self.choose(logits)  # (N, K)
            inputs = flat
            if self.input_scaling:  # Llama 4: each chosen expert sees its token scaled by the weight
                inputs = flat[:, None, :] * weights[:, :, None]  # (N, K, C)
            experts, pairs = self.group(chosen)
        self.last_touched = len(experts)
        rec.count(EXPERTS_TOUCHED, i, len(experts))  # per step, for a recorded run (profile)
        rec.routing(i, experts, pairs)  # and the rows each expert got (what expert parallelism would balance)
        out = None
        for e, (rows, slot) in zip(experts, pairs):
            y = self._expert(inputs, rows, slot, e, rec)
            with rec.op("moe_sum", i):
                if out is None:
                    out = torch.zeros_like(flat)
                if not self.input_scaling:
                    y = y * weights[rows, slot, None]
                out.index_add_(0, rows, y.to(out.dtype))
        if out is None:  # no tokens
            out = torch.zeros_like(flat)
        if self.shared:
            out = out + self._shared(flat, rec)
        return out.view(B, T, C)


def touched_experts(model: nn.Module) -> dict[int, int]:
    """Per MoE layer (by index), the distinct routed experts its last forward ran: the experts whose
    weights that step read (shared experts, always read, are not counted)."""
    return {m.index: m.last_touched for m in model.modules() if isinstance(m, MoE)}


def expected_touched(num_experts: int, experts_per_token: int, tokens: int) -> float:
    """Distinct experts `tokens` tokens touch in expectation under uniform routing, each choosing
    `experts_per_token` of `num_experts` without repetition: E (1 - (1 - K/E)^N)."""
    if num_experts < 1 or not 0 <= experts_per_token <= num_experts or tokens < 0:
        raise ValueError(f"expected_touched: needs 0 <= experts_per_token <= num_experts and tokens >= 0, got "
                         f"num_experts={num_experts}, experts_per_token={experts_per_token}, tokens={tokens}")
    return num_experts * (1.0 - (1.0 - experts_per_token / num_experts) ** tokens)


__all__ = ["MoE", "check_moe", "clamped_swiglu", "expected_touched", "fp32_router", "touched_experts"]
