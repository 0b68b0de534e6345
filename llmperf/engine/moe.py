"""Mixture-of-experts FFN layers: a router picks `experts_per_token` of `num_experts` gated experts
per token and sums their outputs weighted by the router's scores (Shazeer et al. 2017; Mixtral, Jiang
et al. 2024, arXiv:2401.04088).

Letters: N tokens, C hidden size, F expert width, E experts, K experts per token.

Numerics follow Hugging Face `transformers` (`MixtralSparseMoeBlock`): router logits in the
activation dtype, softmax over experts in fp32, top-k, renormalised, the weights kept in fp32 and
cast when an expert's output is scaled.

Parameters (layout as the model's, `weight_layout`): router_weight (E, C); experts_up_weight
(E, 2F, C) as [gate | up] per expert; experts_down_weight (E, C, F) ((in, out) layout: (C, E),
(E, C, 2F), (E, F, C)).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from llmperf.engine.instrument import EXPERTS_TOUCHED
from llmperf.specs import ModelSpec

#: ModelSpec fields of MoE models the engine does not build yet, with the value that means "absent"
_NOT_BUILT = (("shared_experts", 0), ("shared_expert_gate", False), ("router_bias", False),
              ("router_score_bias", False), ("router_scoring", "softmax"), ("router_renormalize", True),
              ("router_scale", 1.0), ("router_groups", 1), ("router_input_scaling", False), ("swiglu_limit", None),
              ("mlp_bias", False))


def check_moe(spec: ModelSpec) -> None:
    """A ValueError naming the MoE field the engine cannot build, before anything is allocated."""
    for field, absent in _NOT_BUILT:
        value = getattr(spec, field)
        if value != absent:
            raise ValueError(f"{field}: the engine's mixture of experts does not build this yet (got {value!r} "
                             f"for {spec.name}); estimate, simulate and plan model it")


class MoE(nn.Module):
    """One mixture-of-experts FFN: `forward(h (1, N, C), rec) -> (1, N, C)`."""

    def __init__(self, spec: ModelSpec, index: int, ops: Any, **kw: Any) -> None:
        super().__init__()
        from llmperf.engine.parts import _ACTIVATIONS, _mat

        self.index, self.ops = index, ops
        C, F_, E = spec.hidden_size, spec.expert_ffn_size, spec.num_experts
        self.top_k = spec.experts_per_token
        self.act = _ACTIVATIONS[spec.hidden_act]
        in_out = ops.in_out
        self.router_weight = _mat(C, E, in_out, **kw)
        self.experts_up_weight = nn.Parameter(torch.empty((E, C, 2 * F_) if in_out else (E, 2 * F_, C), **kw))
        self.experts_down_weight = nn.Parameter(torch.empty((E, F_, C) if in_out else (E, C, F_), **kw))

    def _expert(self, x: torch.Tensor, e: int, rec: Any) -> torch.Tensor:
        """Expert `e` on its rows `x (n, C)`: gate/up, the gated activation, down (plain torch: the
        expert weights are views made per step, not packable parameters)."""
        i, linear = self.index, self.ops.plain
        with rec.op("gate_up_proj", i):
            gate_up = linear(x, self.experts_up_weight[e])
        with rec.op("act", i):
            a = self.ops.glu(gate_up, self.act)
        with rec.op("down_proj", i):
            return linear(a, self.experts_down_weight[e])

    def forward(self, h: torch.Tensor, rec: Any) -> torch.Tensor:
        B, T, C = h.shape
        flat = h.reshape(B * T, C)  # (N, C)
        with rec.op("router", self.index):
            logits = self.ops.plain(flat, self.router_weight)  # (N, E)
            weights = torch.softmax(logits, dim=-1, dtype=torch.float32)
            weights, chosen = torch.topk(weights, self.top_k, dim=-1)  # (N, K)
            weights = weights / weights.sum(dim=-1, keepdim=True)  # fp32, as Hugging Face keeps them
        out = torch.zeros_like(flat)
        experts = torch.unique(chosen).tolist()
        rec.count(EXPERTS_TOUCHED, self.index, len(experts))  # the expert weights this step reads
        for e in experts:
            rows, slot = torch.nonzero(chosen == e, as_tuple=True)
            y = self._expert(flat[rows], e, rec)
            out.index_add_(0, rows, (y * weights[rows, slot, None]).to(out.dtype))
        return out.view(B, T, C)


__all__ = ["MoE", "check_moe"]
