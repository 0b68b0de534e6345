"""Speculative decoding priced: a draft model proposes k tokens one by one, the target checks them in
one forward of k + 1 tokens per sequence (a `verify` step), and every accepted token saves a decode step.
Tokens per cycle (Leviathan et al., "Fast Inference from Transformers via Speculative Decoding",
arXiv:2211.17192, eq. 1; Chen et al., arXiv:2302.01318): when each draft token is accepted with
probability a, independently, a cycle emits the accepted prefix plus the target's own token, on
average E(a, k) = (1 - a^(k + 1)) / (1 - a) tokens (k + 1 at a = 1). A cycle costs k draft decode
steps (contexts n .. n + k - 1), one verify step (k + 1 tokens, context n + k) and one step's fixed
cost of the engine (a server runs the draft and the verify as one scheduler step: vLLM, SGLang,
TensorRT-LLM). The draft steps are priced as decode steps and the verify with the engine's terms for
a verify step (`EfficiencyTimeModel.for_phase`), both by the same time model as plain decoding,
cycle by cycle as the context grows by E per cycle. TTFT adds the draft's prefill of the prompt.
Memory: the draft's weights and KV cache join the target's (one activation reservation, the larger).
`draft="mtp"`: the model's own multi-token-prediction module drafts (DeepSeek-V3 §2.2,
arXiv:2412.19437; GLM-4.5): per token, the last token's embedding and the last hidden state, each
RMS-normed, joined by `eh_proj` (2 x hidden -> hidden, replicated on every GPU as vLLM's
`deepseek_mtp`), one decoder layer of the model's last kind, the shared final norm and LM head; it
adds that layer, `eh_proj`, three norms and one layer's KV, and is reused past its `mtp_layers`.
`draft="eagle3"`: an EAGLE-3 head (Li et al., arXiv:2503.01840; vLLM's and SGLang's `Eagle3` drafters):
one decoder layer whose Q/K/V read the normed token embedding and the normed feature side by side (2 x
hidden in), `fc` joining the target's three features (3 x hidden -> hidden, replicated) at each cycle's
first draft step and over the prompt, its own norm and a head over a draft vocabulary (`eagle3_spec`).
A draft tree (`DraftTree`, EAGLE-2/3 as SGLang runs them): later draft steps run `topk` candidates a
sequence, the target verifies `tokens` of them under a tree mask, and `a` is each depth's chance that the
tree holds the target's next token (tokens per cycle: E(a, depth), SGLang's "accept length").
The acceptance rate is an input (data, draft, sampling), measured by `llmperf.engine.speculative`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llmperf.analysis.generation import GenerationEstimate, estimate
from llmperf.analysis.roofline import (
    ROOFLINE,
    TimeModel,
    engine_label,
    model_time_model,
    op_time,
    phase_time_model,
    step_overhead_s,
)
from llmperf.errors import SpecError
from llmperf.specs import ModelSpec, load_hardware, load_model
from llmperf.specs.expert_load import as_expert_load

__all__ = ["EAGLE3", "EAGLE3_ARCHITECTURES", "EAGLE3_VOCAB", "EARLY_EXIT", "MTP", "DraftTree", "SpeculativeEstimate",
           "draft_extra_ops", "eagle3_extra_weights_bytes", "eagle3_ops", "eagle3_spec", "early_exit_spec",
           "expected_tokens", "mtp_extra_weights_bytes", "mtp_ops", "mtp_spec", "resolve_draft", "speculate"]


def expected_tokens(acceptance: float, num_draft_tokens: int) -> float:
    """Tokens a cycle emits on average: (1 - a^(k + 1)) / (1 - a), k + 1 when every draft is accepted."""
    a, k = float(acceptance), int(num_draft_tokens)
    return float(k + 1) if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)


@dataclass(frozen=True)
class DraftTree:
    """A draft tree as EAGLE-2/3 build it in SGLang (`--speculative-eagle-topk K`,
    `--speculative-num-draft-tokens N`; Li et al., arXiv:2406.16858): the first draft step runs over the
    last token, each later one over `topk` candidates a sequence (the best `topk` children of the
    previous step's), and the target verifies `tokens` of the candidates, the root (the last committed
    token) included, in one forward under a tree mask. The depth is the cycle's draft steps `k`; a
    depth-`d` tree holds at most `1 + K + (d - 1) K^2` nodes, and `topk` 1 is a chain of `d + 1`."""

    topk: int
    tokens: int

    def __post_init__(self) -> None:
        for name, low in (("topk", 1), ("tokens", 2)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= 4096:
                raise SpecError(f"tree: {name} must be an integer in {low} .. 4096, got {value!r}")

    @classmethod
    def parse(cls, option: str, text: str) -> DraftTree:
        """'4:8' -> topk 4, 8 verified tokens; anything else is an error naming the option."""
        try:
            topk, tokens = (int(p) for p in str(text).split(":"))
        except ValueError:
            raise SpecError(f"{option}: {text!r} is not TOPK:TOKENS (two integers, e.g. 4:8)") from None
        try:
            return cls(topk, tokens)
        except SpecError as exc:
            raise SpecError(f"{option}: {str(exc).removeprefix('tree: ')}") from None

    def capacity(self, depth: int) -> int:
        """The most nodes a tree of `depth` draft steps holds, the root included."""
        return 1 if depth <= 0 else 1 + self.topk + (depth - 1) * self.topk ** 2

    def verify_tokens(self, depth: int) -> int:
        """Tokens the target verifies after `depth` draft steps: `tokens`, or all a shallower tree holds."""
        return min(self.tokens, self.capacity(depth))

    def accept_depth(self, depth: int) -> int:
        """The most drafts a cycle of `depth` steps can accept: its depth, or fewer when the verified
        nodes cannot hold a whole path."""
        return min(depth, self.verify_tokens(depth) - 1)

    def check(self, depth: int) -> None:
        """A tree that `depth` draft steps can build: SpecError naming `tree` otherwise."""
        if self.tokens > self.capacity(depth):
            raise SpecError(f"tree: {self.tokens} verified tokens, but {depth} draft steps of topk {self.topk} "
                            f"build at most {self.capacity(depth)} nodes (1 + topk + (k - 1) topk^2)")
        if self.topk == 1 and self.tokens != depth + 1:
            raise SpecError(f"tree: topk 1 is a chain of k + 1 = {depth + 1} tokens, got {self.tokens}")

    def label(self) -> str:
        """The tree in words, for titles: "tree topk 4, 8 verified"."""
        return f"tree topk {self.topk}, {self.tokens} verified"


def draft_queries(tree: DraftTree | None, depth: int) -> list[int]:
    """Tokens a sequence puts through each of `depth` draft steps: 1, then `topk` with a tree."""
    return [1 if i == 0 or tree is None else tree.topk for i in range(depth)]


def verify_tokens(tree: DraftTree | None, depth: int) -> int:
    """Tokens a sequence's verify puts through the target after `depth` draft steps (a chain: depth + 1)."""
    return depth + 1 if tree is None else tree.verify_tokens(depth)


def accept_depth(tree: DraftTree | None, depth: int) -> int:
    """The most drafts a cycle of `depth` draft steps can accept (a chain: all of them)."""
    return depth if tree is None else tree.accept_depth(depth)


@dataclass(frozen=True, kw_only=True)
class SpeculativeEstimate:
    """One speculative configuration beside plain decoding of the same generation, under one time
    model (`time_model`) and, where the time model is not the roofline, the roofline bound."""

    target: GenerationEstimate  # plain decoding: its TTFT, TPOT and memory
    draft: GenerationEstimate  # the draft model alone (its prefill and memory; MTP: its layer as a model)
    draft_name: str  # what drafts: a model's name, or "<model> MTP"
    draft_weights_bytes: float  # per GPU, the weights the draft adds (MTP: not the shared embedding and head)
    draft_prefill_s: float  # the draft's pass over the prompt
    num_draft_tokens: int
    acceptance: float
    cycles: float  # expected verify steps over the gen_len - 1 tokens after the first
    first_draft_s: float  # the first cycle's k draft steps
    first_verify_s: float  # the first cycle's verify step
    cycle_overhead_s: float  # the engine's fixed cost, once per cycle
    draft_total_s: float  # every cycle's draft steps
    verify_total_s: float  # every cycle's verify step
    decode_s: float  # every cycle: drafts, verifies and fixed costs
    decode_bound_s: float  # the same under the roofline
    tree: DraftTree | None = None  # a draft tree (None: a chain of num_draft_tokens)

    @property
    def tokens_per_cycle(self) -> float:
        """Tokens a cycle emits on average at this acceptance (`expected_tokens` over its accept depth)."""
        return expected_tokens(self.acceptance, accept_depth(self.tree, self.num_draft_tokens))

    @property
    def ttft_s(self) -> float:
        """The target's prefill, then the draft's."""
        return self.target.ttft_s + self.draft_prefill_s

    @property
    def tpot_s(self) -> float:
        """Every cycle's time over the gen_len - 1 tokens after the first."""
        steps = self.target.decode_steps
        return self.decode_s / steps if steps else 0.0

    @property
    def tpot_bound_s(self) -> float:
        """`tpot_s` under the roofline (the optimistic bound)."""
        steps = self.target.decode_steps
        return self.decode_bound_s / steps if steps else 0.0

    @property
    def speedup(self) -> float:
        """Plain decoding's TPOT over speculative decoding's (above 1: speculation pays)."""
        return self.target.tpot_s / self.tpot_s if self.tpot_s else 0.0

    @property
    def speedup_bound(self) -> float:
        """`speedup` with both decodings under the roofline."""
        plain = float(self.target.row.get("tpot_bound_s") or self.target.tpot_s)
        return plain / self.tpot_bound_s if self.tpot_bound_s else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second over the whole generation (all sequences)."""
        total = self.ttft_s + self.decode_s
        return self.target.batch * self.target.gen_len / total if total else 0.0

    @property
    def memory_bytes(self) -> float:
        """Per GPU: both models' weights and KV caches, one activation reservation (the larger)."""
        t, d = self.target.memory, self.draft.memory
        return (t.weights_bytes + self.draft_weights_bytes + t.kv_cache_bytes + d.kv_cache_bytes
                + max(t.activation_peak_bytes, d.activation_peak_bytes))

    @property
    def fits(self) -> bool:
        """Both models' memory within the device's usable memory (`mem_util`)."""
        return self.memory_bytes <= self.target.memory.usable_bytes

    def summary(self) -> dict[str, Any]:
        """The headline figures, flat (one row of `llmperf speculate -f json` / `csv`), with the time model
        and engine profile that priced them."""
        t = self.target
        gib = 2.0 ** 30
        return dict(
            model=t.model.name, draft=self.draft_name, hardware=t.hardware.name, batch=t.batch,
            prompt_len=t.prompt_len, gen_len=t.gen_len, tp=t.tp, draft_tp=self.draft.tp, ep=t.conventions.ep,
            dp_attention=t.conventions.dp_attention,
            expert_load=None if t.conventions.expert_load is None else t.conventions.expert_load.source,
            eplb=t.conventions.eplb, precision=str(t.row.get("precision", "")),
            num_draft_tokens=self.num_draft_tokens, tree_topk=self.tree.topk if self.tree else 1,
            verify_tokens=verify_tokens(self.tree, self.num_draft_tokens), acceptance=self.acceptance,
            tokens_per_cycle=self.tokens_per_cycle, cycles=self.cycles, draft_steps_s=self.first_draft_s,
            verify_s=self.first_verify_s, cycle_s=self.first_draft_s + self.first_verify_s + self.cycle_overhead_s,
            ttft_s=self.ttft_s, tpot_s=self.tpot_s, tpot_plain_s=t.tpot_s, speedup=self.speedup,
            tpot_bound_s=self.tpot_bound_s, tpot_plain_bound_s=float(t.row.get("tpot_bound_s") or t.tpot_s),
            speedup_bound=self.speedup_bound, tokens_per_s=self.tokens_per_s,
            memory_gib=self.memory_bytes / gib, usable_gib=t.memory.usable_bytes / gib, fits=self.fits,
            time_model=t.time_model.name, engine=engine_label(t.time_model))


def _check(num_draft_tokens: object, acceptance: object) -> None:
    if isinstance(num_draft_tokens, bool) or not isinstance(num_draft_tokens, (int, np.integer)) \
            or not 1 <= num_draft_tokens <= 64:
        raise SpecError(f"num_draft_tokens: must be an integer in 1 .. 64, got {num_draft_tokens!r}")
    if isinstance(acceptance, bool) or not isinstance(acceptance, (int, float, np.floating)) \
            or not 0.0 <= float(acceptance) <= 1.0:
        raise SpecError(f"acceptance: must be a number in [0, 1], got {acceptance!r}")


#: `speculate(draft=MTP)`: the model's own multi-token-prediction module drafts
MTP = "mtp"
#: `speculate(draft="early-exit:N")`: the model's own first N layers draft (self-speculation)
EARLY_EXIT = "early-exit:"
#: `speculate(draft="eagle3")` (or "eagle3:N", N the draft vocabulary): an EAGLE-3 head of the target's width
EAGLE3 = "eagle3"
EAGLE3_VOCAB = 32000  # the draft vocabulary (`draft_vocab_size`) of the published EAGLE-3 heads
EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")  # an EAGLE-3 head's config.json


def early_exit_spec(model: ModelSpec, num_layers: int) -> ModelSpec:
    """The model stopped after its first `num_layers` layers (LayerSkip's early exit, Elhoushi et al.
    2024, arXiv:2404.16710): its embedding, those layers (their per-layer pattern kept), final norm and
    LM head, the same weights (`llmperf.engine.speculative.early_exit_draft` builds it)."""
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or not 1 <= num_layers < model.num_layers:
        raise SpecError(f"draft: {EARLY_EXIT}N needs N in 1 .. {model.num_layers - 1} ({model.name} has "
                        f"{model.num_layers} layers), got {num_layers!r}")
    try:
        return model.scaled(name=f"{model.name} first {num_layers} layers", num_layers=num_layers)
    except SpecError as exc:
        raise SpecError(f"draft: {model.name} cannot stop after {num_layers} layers: {exc}") from None


def mtp_spec(model: ModelSpec, num_layers: int = 1) -> ModelSpec:
    """The MTP module's decoder layer as a model of its own: `num_layers` layers of `model`'s last
    layer's kind (its attention, its experts), with `model`'s embedding, final norm and LM head (shared
    in the checkpoint: not counted twice, see `SpeculativeEstimate.draft_weights_bytes`)."""
    if model.mtp_layers < 1:
        raise SpecError(f"draft: {MTP} needs a model with multi-token-prediction layers (mtp_layers >= 1), "
                        f"{model.name} has none")
    if model.is_v4_attention:
        raise SpecError(f"draft: {MTP}: {model.name}'s MTP module (DeepSeek-V4, o_groups) is not modelled "
                        "(transformers does not build it)")
    if model.sublayer_layers:
        raise SpecError(f"draft: {MTP}: {model.name}'s layers are one sublayer each (Nemotron-H); its MTP module "
                        "(mtp_layers_block_type) is not modelled")
    last = model.layer_kinds()[-1]
    if model.is_moe and not last.moe:
        raise SpecError(f"draft: {MTP}: {model.name}'s last layer has a dense FFN; only an MoE one is modelled")
    changes: dict[str, Any] = dict(name=f"{model.name} MTP", num_layers=num_layers, dense_layers=(),
                                   nope_layers=() if last.rope or model.pos_encoding != "rope"
                                   else tuple(range(num_layers)))
    if model.layer_types is not None:
        changes["layer_types"] = (model.layer_types[-1],) * num_layers
    return model.scaled(**changes)


def mtp_ops(fm: Any, tokens: Any, hidden_size: int) -> list:
    """The MTP module's operators besides its layer and the shared head, over `tokens` tokens of the
    forward model `fm`: the two input norms and `eh_proj` (replicated: the whole matrix on every GPU)."""
    C = hidden_size
    return [fm._norm("mtp_enorm", tokens, per_layer=False), fm._norm("mtp_hnorm", tokens, per_layer=False),
            fm._linear("mtp_eh_proj", tokens, 2 * C, C, False, per_layer=False, module="attention")]


def mtp_extra_weights_bytes(model: ModelSpec, precision: Any) -> float:
    """Per GPU, the MTP module's weights besides its decoder layer: `eh_proj` and three norms."""
    C = model.hidden_size
    return precision.matrix_bytes(2 * C, C, module="attention") + 3 * C * precision.act_bytes


def eagle3_spec(model: ModelSpec, head: Mapping[str, Any] | None = None, draft_vocab: int = EAGLE3_VOCAB,
                origin: str = EAGLE3) -> ModelSpec:
    """An EAGLE-3 head of `model` as a model of its own: one Llama decoder layer, a final norm and an
    LM head over `draft_vocab` tokens (`vocab_size` here; the head's `d2t` maps them to the target's).
    Its dimensions are `head`'s (an EAGLE-3 config.json: `hidden_size`, heads, `head_dim`,
    `intermediate_size`, `draft_vocab_size`) or, without one, the target's own attention and dense FFN
    width. What the layer adds to a plain one (Q/K/V over 2 x hidden, `fc`, `hidden_norm`) is
    `eagle3_ops`; the embedding is the target's (`eagle3_extra_weights_bytes` takes it out)."""
    from llmperf.specs.hf import model_spec_from_hf_config

    h = dict(head or {})
    if head is None:
        if model.is_mla or model.is_v4_attention:
            what = "multi-head latent attention" if model.is_mla else "DeepSeek-V4's attention, o_groups"
            raise SpecError(f"draft: {EAGLE3} for {model.name} ({what}) needs the head's "
                            "config.json: its attention is not the target's")
        if model.ffn_size <= 0:
            raise SpecError(f"draft: {EAGLE3} for {model.name} needs the head's config.json: the model has no dense "
                            "FFN width to give the head")
        h = dict(hidden_size=model.hidden_size, num_attention_heads=model.num_heads,
                 num_key_value_heads=model.num_kv_heads,
                 head_dim=model.head_dim or model.hidden_size // model.num_heads,
                 intermediate_size=model.ffn_size, draft_vocab_size=draft_vocab)
    layers = h.get("num_hidden_layers", 1)
    if layers != 1:
        raise SpecError(f"draft: {origin}: num_hidden_layers={layers!r}; EAGLE-3 heads of one decoder layer are "
                        "modelled")
    width = h.get("target_hidden_size", h.get("hidden_size"))
    if h.get("hidden_size") != model.hidden_size or width != model.hidden_size:
        raise SpecError(f"draft: {origin}: an EAGLE-3 head of hidden_size {h.get('hidden_size')!r} (target features "
                        f"{width!r}) for {model.name}'s {model.hidden_size}: the head reads the target's embedding "
                        "and features at their width")
    if head is not None and head.get("vocab_size", model.vocab_size) != model.vocab_size:
        raise SpecError(f"draft: {origin}: vocab_size {head.get('vocab_size')!r} differs from {model.name}'s "
                        f"{model.vocab_size} (speculative decoding needs the target's tokenizer)")
    vocab = h.get("draft_vocab_size", h.get("vocab_size", model.vocab_size))
    cfg = dict(architectures=["LlamaForCausalLM"], model_type="llama", num_hidden_layers=1, vocab_size=vocab,
               hidden_size=h["hidden_size"], num_attention_heads=h.get("num_attention_heads"),
               num_key_value_heads=h.get("num_key_value_heads", h.get("num_attention_heads")),
               intermediate_size=h.get("intermediate_size"), max_position_embeddings=model.max_positions,
               rms_norm_eps=h.get("rms_norm_eps", model.norm_eps), rope_theta=h.get("rope_theta", model.rope_theta),
               tie_word_embeddings=False,
               torch_dtype={"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}.get(model.dtype, "bfloat16"))
    if h.get("head_dim") is not None:
        cfg["head_dim"] = h["head_dim"]
    try:
        spec = model_spec_from_hf_config(cfg, name=f"{model.name} EAGLE-3")
    except SpecError as exc:
        raise SpecError(f"draft: {origin}: {exc}") from None
    return spec


def _eagle3_head_config(draft: Any) -> tuple[dict[str, Any], str] | None:
    """An EAGLE-3 head's config.json (a file or its folder) as a mapping, with its path; None when
    `draft` is not a path to one (its `architectures` are not `EAGLE3_ARCHITECTURES`)."""
    from llmperf.specs.loader import read_mapping

    if not isinstance(draft, (str, os.PathLike)):
        return None
    p = Path(draft)
    p = p / "config.json" if p.is_dir() else p
    if p.suffix != ".json" or not p.is_file():
        return None
    data = read_mapping(p)
    arch = data.get("architectures")
    if isinstance(arch, list) and any(a in EAGLE3_ARCHITECTURES for a in arch):
        return data, str(p)
    return None


def eagle3_ops(fm: Any, tokens: Any, first: bool) -> list:
    """An EAGLE-3 head's operators besides a plain Llama layer and its head, over `tokens` tokens of its
    forward model `fm`: `hidden_norm` on the feature, the half of Q/K/V that reads it (hidden -> this
    GPU's heads), and at a cycle's first draft step (`first`: the target's features) `fc`, 3 x hidden ->
    hidden, the whole matrix on every GPU."""
    C = fm.model.hidden_size
    ops = [fm._norm("eagle_hidden_norm", tokens, per_layer=False),
           fm._linear("eagle_qkv_hidden", tokens, C, (fm.dims.num_heads + 2 * fm.dims.num_kv_heads) * fm.head_dim,
                      fm.model.qkv_bias, per_layer=False, module="attention")]
    if first:
        ops.append(fm._linear("eagle_fc", tokens, 3 * C, C, False, per_layer=False, module="attention"))
    return ops


def eagle3_extra_weights_bytes(head: ModelSpec, precision: Any, tp: int) -> float:
    """Per GPU, what an EAGLE-3 head holds besides its layer, norm and head as `eagle3_spec` counts them:
    `fc` (replicated), the feature's half of Q/K/V, `hidden_norm` and the `d2t` table (int64, draft
    token -> target token), less the embedding (the target's)."""
    from llmperf.analysis.operators import ShardDims

    C, dims = head.hidden_size, ShardDims.of(head, tp)
    hd = head.head_dim or C // head.num_heads
    qkv = precision.matrix_bytes(C, (dims.num_heads + 2 * dims.num_kv_heads) * hd, module="attention")
    embedding = precision.embedding_matrix_bytes(C, dims.vocab_size)
    return (precision.matrix_bytes(3 * C, C, module="attention") + qkv + C * precision.act_bytes
            + 8 * head.vocab_size - embedding)


def draft_extra_ops(kind: str, fm: Any, tokens: Any, hidden_size: int, first: bool) -> list:
    """The operators a draft of `kind` runs besides its model's own forward (`mtp_ops`, `eagle3_ops`)."""
    if kind == MTP:
        return mtp_ops(fm, tokens, hidden_size)
    if kind == EAGLE3:
        return eagle3_ops(fm, tokens, first)
    return []


def resolve_draft(model: ModelSpec, draft: Any) -> tuple[ModelSpec, str]:
    """The draft of `model` as a model spec, and its kind: `"mtp"` (the model's own MTP module,
    `mtp_spec`), `"early-exit"` (its first N layers, `early_exit_spec`, the weights shared), `"eagle3"`
    (an EAGLE-3 head, `eagle3_spec`: `"eagle3"`, `"eagle3:N"` for N draft tokens, or a head's
    config.json) or `"model"` (a built-in name, a YAML / HF config path or a `ModelSpec`). It must
    share the target's vocabulary (SpecError naming `draft` otherwise)."""
    word = draft.strip().lower() if isinstance(draft, str) else ""
    if word.startswith(EARLY_EXIT):
        n = word[len(EARLY_EXIT):]
        d, kind = early_exit_spec(model, int(n) if n.isdigit() else n), "early-exit"
    elif word == MTP:
        d, kind = mtp_spec(model), MTP
    elif word == EAGLE3 or word.startswith(EAGLE3 + ":"):
        n = word[len(EAGLE3) + 1:] if ":" in word else str(EAGLE3_VOCAB)
        if not n.isdigit() or int(n) < 1:
            raise SpecError(f"draft: {EAGLE3}:N needs N, the draft vocabulary, a positive integer, got {n!r}")
        return eagle3_spec(model, draft_vocab=int(n)), EAGLE3
    elif (head := _eagle3_head_config(draft)) is not None:
        return eagle3_spec(model, head[0], origin=head[1]), EAGLE3
    else:
        d, kind = load_model(draft), "model"
    if d.vocab_size != model.vocab_size:
        raise SpecError(f"draft: {d.name}'s vocab_size {d.vocab_size} differs from {model.name}'s {model.vocab_size} "
                        "(speculative decoding needs the target's tokenizer)")
    return d, kind


def _forward_s(est: GenerationEstimate, time_model: TimeModel, phase: str, q_len: int, kv_len: np.ndarray,
               kind: str = "model", first: bool = False) -> np.ndarray:
    """One forward of `est`'s model per context in `kv_len` (batch `est.batch`, `q_len` new tokens per
    sequence) without the engine's per-step fixed cost (a cycle pays that once); a draft of `kind` MTP
    or EAGLE-3 with its own operators (`draft_extra_ops`; `first`: the cycle's first draft step). A
    verify computes the logits of all its `q_len` positions (each checks a draft token, the last gives
    the bonus: `llmperf.engine.speculative` runs it with `all_logits`), so its LM head sees `batch x
    q_len` rows; so does a tree's draft step (each of its `topk` candidates a sequence picks children)."""
    from dataclasses import replace

    from llmperf.analysis.rollup import forward_model, phase_arrays

    tm = phase_time_model(model_time_model(time_model, est.model), phase)
    dtype = est.prefill.compute_dtype
    fm = est.forward_model() if phase != "verify" and q_len == 1 else forward_model(
        est.model, est.precision, replace(est.conventions, all_logits=True), est.tp)
    t = phase_arrays(fm, est.hardware, float(est.batch), float(q_len), kv_len, pp=est.pp,
                     compute_dtype=dtype, time_model=tm).time_s
    ops = draft_extra_ops(kind, fm, est.batch * q_len, est.model.hidden_size, first)
    extra = sum(op_time(c, est.hardware, dtype, tm).time_s for c in ops)
    return np.asarray(t, dtype=float) + extra - step_overhead_s(tm)


def _cycles(target: GenerationEstimate, draft: GenerationEstimate, k: int, acceptance: float,
            time_model: TimeModel, kind: str = "model", tree: DraftTree | None = None) -> dict[str, float]:
    """The expected cycles, the first cycle's draft and verify times, the fixed cost per cycle, and over
    every cycle the draft time, the verify time and the whole (`SpeculativeEstimate`'s fields).
    Cycle c starts with n = prompt_len + 1 + c * E committed tokens; the last cycle is weighted by the
    fraction of it the generation needs. With a `tree`, draft steps after the first run `topk` tokens a
    sequence and the verify its `tokens`."""
    e = expected_tokens(acceptance, accept_depth(tree, k))
    steps = target.decode_steps
    cycles = steps / e
    n_cycles = max(math.ceil(cycles - 1e-9), 1)
    weights = np.ones(n_cycles)
    weights[-1] = cycles - (n_cycles - 1) if steps else 0.0
    n = target.prompt_len + 1.0 + e * np.arange(n_cycles)  # (cycles,) committed tokens at each cycle's start
    drafts = sum(_forward_s(draft, time_model, "decode", q, n + i + q - 1, kind, first=i == 0)
                 for i, q in enumerate(draft_queries(tree, k)))  # a tree's q candidates: each at depth i
    v = verify_tokens(tree, k)
    verify = _forward_s(target, time_model, "verify", v, n + v - 1)
    fixed = step_overhead_s(phase_time_model(model_time_model(time_model, target.model), "decode"))
    return dict(cycles=cycles, first_draft_s=float(drafts[0]), first_verify_s=float(verify[0]), cycle_overhead_s=fixed,
                draft_total_s=float(np.sum(weights * drafts)), verify_total_s=float(np.sum(weights * verify)),
                decode_s=float(np.sum(weights * (drafts + verify + fixed))))


def speculate(model: Any, draft: Any, hardware: Any = "a100-80gb-sxm", *, num_draft_tokens: int,
              acceptance: float, batch: int = 1, prompt_len: int = 512, gen_len: int = 128,
              time_model: Any = None, draft_tp: int | None = None, tree: DraftTree | None = None,
              **options: Any) -> SpeculativeEstimate:
    """Price speculative decoding of `model` with the draft model `draft` (or `"mtp"`: the model's own
    multi-token-prediction module; `"early-exit:N"`: its first N layers, sharing their weights but
    keeping a KV cache of their own, as `llmperf.engine.speculative` runs it; `"eagle3"`, `"eagle3:N"`
    or an EAGLE-3 head's config.json: that head over the target's features) on `hardware`.

    `time_model`: as `generation.estimate` takes it (None: the roofline; a factory `f(hardware, dtype)`
    gets the device's own). `options`: `estimate`'s other keywords (precision, tp, conventions), the
    same for both models but `draft_tp`: the draft's tensor-parallel degree (default: the target's
    `tp`; 1 runs it on one GPU, as vLLM's `draft_tensor_parallel_size=1`, and that GPU holds all of
    it; an early exit, MTP or EAGLE-3 runs at `tp`, and so does every draft under `dp_attention`). With `ep`, a MoE
    draft's experts are split like the target's, a dense draft's FFN by `tp`; a measured `expert_load`
    and `eplb` price the target's experts, and a draft's only where it is the target's own MoE layers (an
    early exit, MTP). The draft must share the target's vocabulary (one tokenizer). `tree`: a draft
    tree (`DraftTree`) of `num_draft_tokens` steps instead of a chain, `acceptance` each depth's."""
    _check(num_draft_tokens, acceptance)
    if tree is not None:
        if not isinstance(tree, DraftTree):
            raise SpecError(f"tree: must be a DraftTree (topk, tokens) or None, got {tree!r}")
        tree.check(int(num_draft_tokens))
    m, hw = load_model(model), load_hardware(hardware)
    d, kind = resolve_draft(m, draft)
    early = kind == "early-exit"
    if int(options.get("pp", 1)) != 1:
        raise SpecError(f"pp: speculative decoding is priced on one pipeline stage (pp 1), got {options['pp']}")
    options = dict(options)
    if options.get("expert_load") is not None:  # a file is read once, for both models
        options["expert_load"] = as_expert_load(options["expert_load"])
    tp = options.pop("tp", 1)
    kw = dict(batch=batch, prompt_len=prompt_len, time_model=time_model, **options)
    if draft_tp is not None and (isinstance(draft_tp, bool) or not isinstance(draft_tp, int) or draft_tp < 1
                                 or tp % draft_tp):
        raise SpecError(f"draft_tp: must be a positive integer dividing tp {tp}, got {draft_tp!r}")
    if draft_tp is not None and draft_tp != tp and kind != "model":
        raise SpecError(f"draft_tp: {draft_tp}, but a draft of the target's own layers ({draft}) runs at the "
                        f"target's tp {tp}")
    if draft_tp is not None and draft_tp != tp and options.get("dp_attention"):
        raise SpecError(f"draft_tp: {draft_tp}, but with data-parallel attention each GPU drafts its own "
                        f"sequences at the target's tp {tp}")
    target = estimate(m, hw, gen_len=gen_len, tp=tp, **kw)
    ahead = sum(draft_queries(tree, int(num_draft_tokens)))  # the draft's KV holds a cycle's drafts beyond gen_len
    dkw = dict(kw, gen_len=gen_len + ahead, tp=draft_tp or tp)
    # the draft's layout as simulate's (`llmperf.serving.speculative`): the target's experts and attention
    # at the target's degree (a dense draft's ep 1); at another degree neither split apart
    if (draft_tp or tp) != tp:
        dkw.update(ep=1, dp_attention=False)
    elif not d.is_moe:
        dkw["ep"] = 1
    if kind == "model" or not d.is_moe or dkw.get("ep", 1) != options.get("ep", 1):
        # a measured load and EPLB's placement are the target's experts': a draft of its own layers only
        dkw.update(expert_load=None, eplb=None)
    small = estimate(d, hw, **dkw)
    k, a = int(num_draft_tokens), float(acceptance)
    parts = _cycles(target, small, k, a, target.time_model, kind, tree)
    bound = parts["decode_s"] if target.time_model.name == "roofline" else \
        _cycles(target, small, k, a, ROOFLINE, kind, tree)["decode_s"]
    weights, prefill = (0.0 if early else small.memory.weights_bytes), small.ttft_s  # an early exit shares them
    if kind == MTP:  # one layer (two layers' weights less one's), eh_proj and three norms; embedding and head shared
        two = estimate(mtp_spec(m, 2), hw, **dkw).memory.weights_bytes
        weights = two - weights + mtp_extra_weights_bytes(m, small.precision)
    elif kind == EAGLE3:  # fc, the feature's Q/K/V, hidden_norm and the vocabulary maps; the embedding is the target's
        weights += eagle3_extra_weights_bytes(d, small.precision, small.tp)
    if kind in (MTP, EAGLE3):  # its own operators over the prompt too (EAGLE-3's fc joins the prompt's features)
        tm = phase_time_model(model_time_model(small.time_model, d), "prefill")
        dtype = small.prefill.compute_dtype
        ops = draft_extra_ops(kind, small.forward_model(), small.batch * prompt_len, m.hidden_size, True)
        prefill += sum(float(np.asarray(op_time(c, hw, dtype, tm).time_s)) for c in ops)
    return SpeculativeEstimate(target=target, draft=small, draft_name=d.name, draft_weights_bytes=weights,
                               draft_prefill_s=prefill, num_draft_tokens=k, acceptance=a, decode_bound_s=bound,
                               tree=tree,
                               **parts)
